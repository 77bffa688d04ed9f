"""Unit tests of helpers.graph_breaks' break report, its claims, blockwise fp32 reference, return_dict tracing and
notebook 05's helpers (CPU, seconds). The planted breaks are notebook 06's, written here as the notebook writes them."""

import dataclasses
import io
import logging
import types

import pytest
import torch
from diffusers import FluxTransformer2DModel
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

from helpers import graph_breaks, measure, params

# Notebook 06, section 2: two debug processors on the first double- and single-stream block, a checked forward.
PRINT_AT, ITEM_AT = "transformer_blocks.0.attn.processor", "single_transformer_blocks.0.attn.processor"
LIMIT = 1e4
logger = logging.getLogger("denoiser")


class DebugAttnProcessor(FluxAttnProcessor):
    """Flux attention, then a debugging side effect on its output: a print, or a Python float read with .item()."""

    def __init__(self, kind, stream):
        super().__init__()
        self.kind, self.stream, self.last_std = kind, stream, None

    def __call__(self, attn, hidden_states, *args, **kwargs):
        out = super().__call__(attn, hidden_states, *args, **kwargs)
        self.debug(out[0] if isinstance(out, tuple) else out)
        return out

    def debug(self, out):
        if self.kind == "print":
            print("attention output", tuple(out.shape), file=self.stream)
        else:
            self.last_std = out.float().std().item()


def checked_forward(self, hidden_states, **kwargs):
    if hidden_states.abs().amax() > LIMIT:
        hidden_states = hidden_states.clamp(-LIMIT, LIMIT)
    logger.info("denoiser step on latents of shape %s", tuple(hidden_states.shape))
    return FluxTransformer2DModel.forward(self, hidden_states, **kwargs)


def plant_breaks(model, stream):
    """The four planted breaks of notebook 06 on a Flux transformer."""
    model.set_attn_processor({**model.attn_processors, PRINT_AT: DebugAttnProcessor("print", stream),
                              ITEM_AT: DebugAttnProcessor("item", stream)})
    model.forward = types.MethodType(checked_forward, model)


def restore(model):
    """Back to the stock processors and the class's own forward, as notebook 06 ends."""
    model.set_attn_processor(FluxAttnProcessor())
    del model.forward


def _tiny_flux(layers: int = 2, single_layers: int = 2):
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=layers, num_single_layers=single_layers,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=(4, 6, 6)).eval()
    inputs = {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 8, 32),
              "pooled_projections": torch.randn(1, 32), "timestep": torch.ones(1), "img_ids": torch.zeros(16, 3),
              "txt_ids": torch.zeros(8, 3), "return_dict": False}
    return model, inputs


# The fixes notebook 06 shows: two dynamo settings (the .item() and the logger call) and two rewrites.
FIX_SETTINGS = {"capture_scalar_outputs": True, "ignore_logging_functions": {logging.Logger.info}}


class EagerOnlyDebugProcessor(DebugAttnProcessor):
    def debug(self, out):
        if not torch.compiler.is_compiling():
            super().debug(out)


def branchless_forward(self, hidden_states, **kwargs):
    hidden_states = hidden_states.clamp(-LIMIT, LIMIT)  # branchless, as notebook 06 writes it
    logger.info("denoiser step on latents of shape %s", tuple(hidden_states.shape))
    return FluxTransformer2DModel.forward(self, hidden_states, **kwargs)


def rewrite_like_the_notebook(model, stream):
    """The two code fixes of notebook 06, section 6 (the settings are FIX_SETTINGS)."""
    model.set_attn_processor({**model.attn_processors,
                              PRINT_AT: EagerOnlyDebugProcessor("print", stream)})
    model.forward = types.MethodType(branchless_forward, model)


def test_blockwise_fp32_reference_equals_a_whole_fp32_model():
    model, inputs = _tiny_flux()
    model.to(torch.bfloat16)
    low = {k: v.to(torch.bfloat16) if torch.is_tensor(v) else v for k, v in inputs.items()}
    before = [p.detach().clone() for p in model.parameters()]
    out = graph_breaks.fp32_reference(model, low)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    whole = model.float()
    with torch.no_grad():
        expected = whole(**{k: v.float() if torch.is_tensor(v) else v for k, v in low.items()})[0]
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()), "hooks must be removed"


def test_fp32_upcast_bytes_counts_one_block_and_the_rest():
    model, _ = _tiny_flux()
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    numel = [sum(p.numel() for p in b.parameters()) for b in blocks]
    total = sum(p.numel() for p in model.parameters())
    assert graph_breaks.fp32_upcast_bytes(model) == 4 * (total - sum(numel) + max(numel))
    assert graph_breaks.fp32_upcast_bytes(model) < 4 * total
    assert graph_breaks.fp32_reference_unavailable_reason(model) == ""  # a CPU has no such limit


def test_break_report_tables_add_up():
    model, inputs = _tiny_flux()
    plant_breaks(model, io.StringIO())
    found = graph_breaks.find_breaks(model, inputs)
    assert len(found.graphs) == found.explain_graphs == found.explain_breaks + 1
    assert sum(g["ends with"].startswith("break") for g in found.graphs) == len(found.explain_reasons)
    by_key = {k: sum(e["count"] for e in found.counter_entries if e["counter key"] == k)
              for k in ("graph_break", "unimplemented")}
    assert by_key == {"graph_break": found.counter_graph_breaks, "unimplemented": found.counter_unimplemented}
    assert {e["planted kind"] for e in found.counter_entries} == set(graph_breaks.PLANTED)
    # the print in a block sits inside FluxTransformer2DModel.forward's loop over blocks: that frame is given up
    assert any(e["graph break in a loop"] for e in found.counter_entries)
    assert any(f.startswith("forward (transformer_flux.py") for f in found.frames_given_up), found.frames_given_up

    assert all(holds for *_, holds in graph_breaks.tool_count_claims(found)), graph_breaks.tool_count_claims(found)
    # ... and each claim fails on a planted wrong value
    for wrong in ({"explain_breaks": found.explain_graphs}, {"explain_reasons": found.explain_reasons + ["x"]},
                  {"counter_graph_breaks": 1, "counter_unimplemented": 1}, {"frames_given_up": []},
                  {"counter_entries": [{**e, "counter key": "graph_break"} for e in found.counter_entries]}):
        assert not all(holds for *_, holds in graph_breaks.tool_count_claims(dataclasses.replace(found, **wrong)))

    kinds = graph_breaks.kinds_found(found.explain_reasons + list(found.counter_reasons))
    with torch._dynamo.config.patch(**FIX_SETTINGS):
        by_settings = graph_breaks.find_breaks(model, inputs)
        after = graph_breaks.kinds_found(by_settings.explain_reasons + list(by_settings.counter_reasons))
        assert graph_breaks.fix_problems(kinds, after, (".item() in attention processor", "logger call in forward")) == []
        rewrite_like_the_notebook(model, io.StringIO())
        fixed = graph_breaks.find_breaks(model, inputs)
    assert fixed.frames_given_up == [] and fixed.counter_entries == [] and len(fixed.graphs) == 1
    assert fixed.graphs[0]["ends with"] == "return"


def test_fix_problems_names_planted_wrong_counts():
    before = {"a": 2, "b": 1, "c": 3}
    assert graph_breaks.fix_problems(before, {"a": 0, "b": 1, "c": 3}, ("a",)) == []
    assert graph_breaks.fix_problems(before, {"a": 1, "b": 1, "c": 3}, ("a",)) == [
        "a: still found after its fix (1 reasons)"]
    assert graph_breaks.fix_problems(before, {"a": 0, "b": 0, "c": 3}, ("a",)) == [
        "b: gone although nothing fixed it; check the reason markers"]
    assert graph_breaks.fix_problems({**before, "c": 0}, {"a": 0, "b": 1, "c": 0}, ("a",)) == [
        "c: not found before the fix, so the fix cannot be shown"]


def test_hints_and_compare_medians():
    log = ["Graph break", "  Hint: use torch.where", "x", "  Hint: use torch.where", "  Hint: capture"]
    assert graph_breaks.hints(log) == ["Hint: use torch.where", "Hint: capture"]
    prefix = "V1125 06:24:12.140000 1656 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks]"
    logged = [f"{prefix} Graph break", f"{prefix}   Hint: use torch.where", f"{prefix}   Hint: use torch.where"]
    assert graph_breaks.hints(logged) == ["Hint: use torch.where"]  # as TORCH_LOGS writes them (06 printed none)
    t = types.SimpleNamespace
    fast, slow, noisy = t(median_s=0.08, spread_s=0.005), t(median_s=0.10, spread_s=0.004), t(median_s=0.10, spread_s=0.05)
    assert measure.compare_medians(fast, slow, "A", "B").startswith("A is faster than B")
    assert measure.compare_medians(slow, fast, "B", "A").startswith("B is slower than A")
    assert measure.compare_medians(fast, noisy, "A", "C").startswith("A and C are not told apart")


def test_return_dict_output_dataclass_traces_without_a_break():
    model, inputs = _tiny_flux(1, 1)
    found = graph_breaks.find_breaks(model, {**inputs, "return_dict": True})
    assert found.explain_graphs == 1 and found.breaks == 0 and found.counter_unimplemented == 0


def test_shape_recompile_words_and_compiled_once():
    default, static_only = {128: 1, 96: 1, 64: 0}, {128: 1, 96: 1, 64: 1}
    text = graph_breaks.describe_shape_recompiles(default, static_only)
    assert "64 px compiled nothing: automatic dynamic shapes" in text and "3 graphs for 3 resolutions" in text
    assert "compiled again" in graph_breaks.describe_shape_recompiles({128: 1, 96: 1, 64: 1}, static_only)
    assert graph_breaks.compiled_once({128: 1, 96: 0, 64: 0})
    assert graph_breaks.compiled_once({128: 3}, first_max=4)
    for wrong, first_max in (({128: 1, 96: 1, 64: 0}, 1), ({128: 0, 96: 0}, 1), ({128: 2}, 1), ({}, 1), ({128: 5}, 4)):
        assert not graph_breaks.compiled_once(wrong, first_max=first_max), wrong


@pytest.mark.parametrize("value", [[128, 100, 64], [128, 96], [128, 96, 96], [128, 96, 16], "128", [128, 96.0, 64]])
def test_check_resolutions_refuses_bad_lists(value):
    with pytest.raises(params.ParameterError, match=r"RESOLUTIONS=.* is not allowed; use None, or a list"):
        graph_breaks.check_resolutions(value, "smoke")


def test_check_resolutions_defaults_by_profile():
    assert graph_breaks.check_resolutions(None, "smoke") == [128, 96, 64]
    assert graph_breaks.check_resolutions(None, "full") == [1024, 768, 512]
    assert graph_breaks.check_resolutions((64, 32, 48), "full") == [64, 32, 48]


def test_automatic_dynamic_shapes_is_why_a_third_shape_compiles_nothing():
    from helpers import compile_tools

    def graphs_per_shape(automatic: bool) -> dict[int, int]:
        compile_tools.reset()
        fn = torch.compile(lambda x: (x * 2).sum(0), fullgraph=True, backend="eager")
        got = {}
        with torch._dynamo.config.patch(automatic_dynamic_shapes=automatic):
            for n in (8, 6, 4):
                with compile_tools.counting() as c:
                    fn(torch.ones(n, 3))
                got[n] = c.graphs
        return got

    default, static_only = graphs_per_shape(True), graphs_per_shape(False)
    assert default == {8: 1, 6: 1, 4: 0} and static_only == {8: 1, 6: 1, 4: 1}


@pytest.mark.parametrize("msg, args, given_up", [
    # torch 2.11 and 2.13 at info level (the message comes preformatted)
    ("WON'T CONVERT forward /x/diffusers/transformer_flux.py line 612 \ndue to: \nTraceback ...", (),
     ["forward (transformer_flux.py)"]),
    # torch 2.13 at debug level
    ("skipping: %s (reason: %s, file: %s)", ("forward", "an error was suppressed during compilation",
                                             "/x/transformer_flux.py"), ["forward (transformer_flux.py)"]),
    # planted: a frame skipped for another reason is not given up
    ("skipping: %s (reason: %s, file: %s)", ("forward", "in skipfiles", "/x/transformer_flux.py"), []),
    ("torchdynamo start compiling %s %s:%s", ("forward", "/x/transformer_flux.py", 612), []),
])
def test_given_up_frames_are_read_from_either_torch_versions_message(msg, args, given_up):
    with graph_breaks.graph_break_logs() as (_, found):
        logger = logging.getLogger("torch._dynamo.convert_frame")
        for _ in range(2):  # the same frame twice is one frame given up
            logger.handle(logger.makeRecord(logger.name, logging.INFO, __file__, 0, msg, args, None))
    assert found == given_up
