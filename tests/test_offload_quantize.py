"""Unit tests of helpers.offload and helpers.quantize on the tiny smoke Flux (CPU)."""

import pytest
import torch

from helpers import offload, params, pipelines, quantize, text


@pytest.fixture(scope="module")
def tiny_pipe():
    return pipelines.build_pipeline("flux-dev", "smoke", device="cpu")


def test_model_offload_hooks_on_cpu():
    pipe = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    before = offload.hook_summary(pipe)
    assert set(before) == {"vae", "text_encoder", "text_encoder_2", "transformer"}
    assert all(h["accelerate_hooks"] == 0 and h["group_offload_hooks"] == 0 for h in before.values())
    pipe.enable_model_cpu_offload(device="cpu")
    after = offload.hook_summary(pipe)
    assert all(h["accelerate_hook_types"] == ["CpuOffload"] and h["accelerate_hooks"] == 1 for h in after.values())


def test_group_offload_hooks_and_stream_refusal_on_cpu():
    pipe = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    def enable(stream: bool) -> None:
        pipe.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                                  offload_type="block_level", num_blocks_per_group=1, use_stream=stream)

    err = offload.error_of(lambda: enable(True))
    assert err.startswith("ValueError:") and "stream" in err
    enable(False)
    assert all(h["group_offload_hooks"] > 0 for h in offload.hook_summary(pipe).values())


def test_error_helpers():
    assert offload.error_of(lambda: None) == ""
    assert offload.error_of(lambda: int("x")).startswith("ValueError: invalid literal")
    assert offload.describe_error(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert offload.describe_error(TypeError("got (Tensor), but expected one of:\n * (int)")) == (
        "TypeError: got (Tensor), but expected one of: …")  # a line that goes on says so
    assert offload.describe_error(ValueError("x" * 400)).endswith("x …")
    assert text.cut("short", 90) == "short" and text.cut("y" * 100, 90) == "y" * 89 + "…"
    assert [text.count(n, "graph") for n in (0, 1, 3)] == ["0 graphs", "1 graph", "3 graphs"]  # no "graph(s)"
    assert text.count(1, "miss", "misses") == "1 miss" and text.count(2, "miss", "misses") == "2 misses"
    reason = offload.no_accelerator_reason("sequential")
    assert reason.startswith("sequential offload") and "no CUDA GPU" in reason


NF4 = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": torch.bfloat16}


def load_nf4(cls, folder):
    """The notebook's recipe on a CPU: transformers' from_pretrained for T5, diffusers' quantizer steps for the DiT."""
    import diffusers
    import transformers

    if issubclass(cls, transformers.PreTrainedModel):
        config = transformers.BitsAndBytesConfig(**NF4)
        return cls.from_pretrained(folder, quantization_config=config, dtype=torch.bfloat16, device_map={"": "cpu"})
    config = diffusers.BitsAndBytesConfig(**NF4)
    with pytest.raises(RuntimeError, match="No GPU found"):  # why the steps are needed on a CPU
        cls.from_pretrained(folder, quantization_config=config, torch_dtype=torch.bfloat16)
    return quantize.quantizer_steps(cls, folder, config, "cpu", torch.bfloat16)


@pytest.mark.parametrize("name", ["transformer", "text_encoder_2"])
def test_load_nf4_sizes_and_output(tiny_pipe, tmp_path, name):
    bf16 = getattr(tiny_pipe, name)
    bf16.save_pretrained(tmp_path / name)
    model = load_nf4(type(bf16), tmp_path / name)
    quantize.generic_cpu_path_for_narrow_layers(model)
    quantize.decode_by_format(model)  # layers this CPU's bitsandbytes kernel misdecodes compute as the format says
    weight_err = quantize.weight_error(model, bf16)  # before the first forward, as the notebook does
    expected = quantize.nf4_format_error(quantize.reference_linear_weights(model, bf16))
    assert quantize.weight_error_problem(weight_err, expected) == ""
    sizes = quantize.linear4bit_bytes(model)
    names = quantize.linear4bit_names(model)
    kept = quantize.unquantized_linear_names(model)
    assert sizes["layers"] == len(names) and len(names) + len(kept) == sum(
        isinstance(m, torch.nn.Linear) for m in bf16.modules())
    if name == "transformer":  # diffusers converts every linear layer of the DiT
        assert kept == []
        assert all(p.dtype in (torch.bfloat16, torch.uint8) for p in model.parameters())
    else:  # transformers keeps T5's feed-forward output projections ("wo") out of 4-bit
        assert kept and all(n.endswith(".wo") for n in kept)
    assert sizes["bf16_bytes"] == quantize.linear_weight_bytes(bf16, names)
    assert sizes["packed_bytes"] * 4 == sizes["bf16_bytes"]  # two 4-bit codes per byte vs two bytes per weight
    assert sizes["nf4_bytes"] / sizes["bf16_bytes"] == pytest.approx(0.5625 / 2)  # + one fp32 scale per 64
    if name == "transformer":
        inputs = pipelines.denoiser_inputs(tiny_pipe, height=64, width=64, max_sequence_length=16)
        with torch.inference_mode():
            ref, out = bf16(**inputs)[0], model(**inputs)[0]
    else:
        ids = torch.arange(16).unsqueeze(0)
        with torch.inference_mode():
            ref, out = bf16(ids)[0], model(ids)[0]
    assert out.isfinite().all()
    assert quantize.drift_problems({name: quantize.relative_l2(ref, out)}, {name: weight_err}) == []


def test_weight_error_measures_the_rounding():
    """NF4 moves Gaussian weights by about 9% (relative L2); a model compared with itself dequantized shows 0."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Linear(64, 64))
    with torch.no_grad():
        for layer in ref:
            layer.weight.normal_()
    nf4 = torch.nn.Sequential(*(bnb.nn.Linear4bit(m.in_features, m.out_features, quant_type="nf4") for m in ref))
    nf4.load_state_dict(ref.state_dict())
    nf4 = nf4.to("cpu")  # quantizes the weights
    for layer in nf4:
        if getattr(layer.weight, "quant_state", None) is None:
            layer.weight = bnb.nn.Params4bit(layer.weight.data, requires_grad=False, quant_type="nf4")._quantize("cpu")
    err = quantize.weight_error(nf4, ref)
    assert quantize.weight_error_problem(err, quantize.nf4_format_error([m.weight for m in ref])) == ""
    planted = torch.nn.Sequential(*(torch.nn.Linear(m.in_features, m.out_features) for m in ref))
    with torch.no_grad():  # a reference equal to the dequantized weights: nothing left to measure
        for p_layer, q_layer in zip(planted, nf4, strict=True):
            p_layer.weight.copy_(bnbf.dequantize_4bit(q_layer.weight.data, q_layer.weight.quant_state))
    assert quantize.weight_error(nf4, planted) < 1e-6


def test_drift_band_fails_on_planted_drifts():
    """The notebook's drift check: inside (err / 10, min(1, 10 err)); fails for no change, noise, NaN, blow-ups."""
    assert quantize.drift_band(0.09) == pytest.approx((0.009, 0.9))
    assert quantize.drift_band(0.2) == pytest.approx((0.02, 1.0))  # never above 1: a zero output is 1 away
    err = {"transformer": 0.09, "latents": 0.09}
    assert quantize.drift_problems({"transformer": 0.25, "latents": 0.17}, err) == []
    assert quantize.drift_problems({"transformer": 0.0, "latents": 0.17}, err)[0].startswith("transformer: drift 0")
    for planted in (0.0, 0.005, 0.95, 2 ** 0.5, float("nan"), float("inf")):
        assert len(quantize.drift_problems({"latents": planted}, err)) == 1, planted


def test_compile_drift_problem_fails_on_planted_values():
    """Compiled NF4 must sit closer to eager NF4 than half of eager NF4's drift from the reference."""
    assert quantize.compile_drift_problem(0.005, 0.17) == ""
    assert quantize.compile_drift_problem(1e-6, 0.17) == ""
    for planted in (0.17, 0.1, float("nan"), None):  # 0.17: the compiled model lost what eager NF4 computes
        assert quantize.compile_drift_problem(planted, 0.17), planted


def test_relative_l2():
    x = torch.randn(10)
    assert quantize.relative_l2(x, x) == 0.0
    assert quantize.relative_l2(x, 2 * x) == pytest.approx(1.0)


def test_narrow_layers_go_to_the_generic_cpu_kernel(tiny_pipe, tmp_path):
    import bitsandbytes as bnb

    tiny_pipe.text_encoder_2.save_pretrained(tmp_path / "t5")
    model = load_nf4(type(tiny_pipe.text_encoder_2), tmp_path / "t5")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    narrow = [m for m in layers if m.in_features % 64]
    assert narrow and quantize.generic_cpu_path_for_narrow_layers(model) == len(narrow)
    assert all(m.support_avx512bf16_for_cpu is False for m in narrow)


def test_sequential_cpu0_cause_and_stand_in(tiny_pipe):
    """diffusers' sequential offload passes 'cpu:0', which accelerate's hooks cannot handle; 'cpu' works."""
    from helpers import params, workloads

    cpu, cpu0 = offload.execution_device_check("cpu"), offload.execution_device_check("cpu:0")
    assert cpu == {"nn.Parameter(cpu tensor).to(device) returns": "the same Parameter",
                   "nn.Linear under accelerate.cpu_offload": "runs"}
    assert cpu0["nn.Parameter(cpu tensor).to(device) returns"] == "a new Tensor"
    assert cpu0["nn.Linear under accelerate.cpu_offload"].startswith("TypeError")

    run = params.resolve("08_cpu_offload", PROFILE="smoke")
    tiny_pipe.set_progress_bar_config(disable=True)
    reference = workloads.pipeline_call(tiny_pipe, run, output_type="latent")().images
    diffusers_way = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    diffusers_way.set_progress_bar_config(disable=True)
    diffusers_way.enable_sequential_cpu_offload(device="cpu")
    assert str(diffusers_way._execution_device) == "cpu:0"
    diffusers_hooks = offload.hook_summary(diffusers_way)
    error = offload.error_of(lambda: workloads.pipeline_call(diffusers_way, run, output_type="latent")())
    assert error == cpu0["nn.Linear under accelerate.cpu_offload"]

    stand_in = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    stand_in.set_progress_bar_config(disable=True)
    offload.accelerate_sequential_offload(stand_in, torch.device("cpu"))
    assert offload.hook_summary(stand_in) == diffusers_hooks
    out = workloads.pipeline_call(stand_in, run, output_type="latent")().images
    assert torch.equal(out, reference)


def test_regional_trace_model_vs_group_offload(tiny_pipe):
    """Model offload's hooks sit outside the blocks (one graph each); group offload's stop fullgraph tracing."""
    from helpers import params, workloads

    inputs = workloads.run_inputs(tiny_pipe, params.resolve("08_cpu_offload", PROFILE="smoke"))
    model = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    model.enable_model_cpu_offload(device="cpu")
    error, counts = offload.regional_trace(model, inputs)
    assert error == "" and counts.graphs >= 2 and counts.graph_breaks == 0
    net = pipelines.denoiser(model)
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in net.modules()), "blocks left compiled"
    group = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    group.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                               offload_type="block_level", num_blocks_per_group=1, use_stream=False)
    error, counts = offload.regional_trace(group, inputs)
    assert "torch.compiler.disable" in error and counts.graph_breaks >= 1


def test_free_pipeline_empties_tensors_and_compile_state(tmp_path):
    from torch._dynamo.utils import counters

    pipe = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    bf16 = pipe.text_encoder_2
    bf16.save_pretrained(tmp_path / "t5")
    nf4 = load_nf4(type(bf16), tmp_path / "t5")
    pipe.enable_sequential_cpu_offload(device="cpu")  # hooks keep references; freeing must not depend on them going away
    linear = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    linear(torch.ones(2, 4))
    assert counters["stats"]["unique_graphs"] > 0
    assert offload.free_pipeline(pipe, nf4) == 0  # no CUDA here: nothing left on an accelerator
    assert counters["stats"]["unique_graphs"] == 0, "compiled graphs must be dropped"
    for module in [*(m for m in pipe.components.values() if isinstance(m, torch.nn.Module)), nf4]:
        assert all(t.numel() == 0 for t in [*module.parameters(), *module.buffers()])
    assert all(getattr(p, "quant_state", None) is None for p in nf4.parameters())


def test_footprint_counts_quant_state(tiny_pipe, tmp_path):
    """get_memory_footprint() leaves out the NF4 scales and code books; footprint_bytes counts them."""
    bf16 = tiny_pipe.transformer
    full = quantize.footprint_bytes(bf16)
    assert full == {"parameter_bytes": bf16.get_memory_footprint(), "buffer_bytes": 0, "quant_state_bytes": 0,
                    "total_bytes": bf16.get_memory_footprint()}
    bf16.save_pretrained(tmp_path / "dit")
    nf4 = load_nf4(type(bf16), tmp_path / "dit")
    sizes, linear = quantize.footprint_bytes(nf4), quantize.linear4bit_bytes(nf4)
    assert sizes["parameter_bytes"] + sizes["buffer_bytes"] == nf4.get_memory_footprint()
    # the scales (absmax, fp32, one per 64 weights) plus one 16-entry fp32 code book per layer
    assert sizes["quant_state_bytes"] == linear["scale_bytes"] + linear["layers"] * 16 * 4
    assert sizes["total_bytes"] == nf4.get_memory_footprint() + sizes["quant_state_bytes"]
    assert linear["nf4_bytes"] < sizes["total_bytes"] < full["total_bytes"]


def test_dynamo_config_at_compile_reads_the_setting_when_dynamo_traces():
    """torch.compile is lazy: a setting patched only around .compile() is gone when the first call traces."""
    from helpers import compile_tools

    class Scaled(torch.nn.Module):  # dynamo skips a bare torch.nn layer at the top level: wrap one
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * self.linear(x)

    compile_tools.reset()
    linear = Scaled()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        linear.compile(backend="eager")  # the wrong scope: nothing is traced here
    with quantize.dynamo_config_at_compile("capture_dynamic_output_shape_ops") as seen:
        linear(torch.ones(2, 4))
    assert seen == [{"capture_dynamic_output_shape_ops": False}]
    assert quantize.config_held(seen, "capture_dynamic_output_shape_ops", True) is False
    with (torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True),
          quantize.dynamo_config_at_compile("capture_dynamic_output_shape_ops") as seen):
        linear(torch.ones(3, 4))  # a new shape: traced again, now inside the scope
    assert seen and quantize.config_held(seen, "capture_dynamic_output_shape_ops", True) is True
    with quantize.dynamo_config_at_compile("capture_dynamic_output_shape_ops") as seen:
        linear(torch.ones(3, 4))  # cached: nothing compiles
    assert seen == [] and quantize.config_held(seen, "capture_dynamic_output_shape_ops", True) is None
    compile_tools.reset()


def test_compile_trace_under_leaf_offload_needs_the_raised_recompile_limit(tiny_pipe):
    """diffusers' recipe for group offload (transformer.compile(), recompile_limit raised) traces under the hooks;
    with dynamo's default limit of 8 the code after diffusers' hook runs out of versions and is left uncompiled."""
    from helpers import params, workloads

    inputs = workloads.run_inputs(tiny_pipe, params.resolve("08_cpu_offload", PROFILE="smoke"))
    pipe = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    pipe.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                              offload_type="leaf_level", use_stream=False)
    raised = offload.compile_trace(pipe, inputs, 1000)
    assert raised["traced"] and raised["trace_error"] == "" and raised["matches_eager"] is True
    assert raised["graph_breaks"] >= 1 and raised["recompiles"] == 0
    assert raised["recompile_limit_at_compile"] == [1000]
    default = offload.compile_trace(pipe, inputs, 8)
    assert default["recompile_limit_at_compile"] == [8] and default["matches_eager"] is True
    assert default["graphs_traced"] < raised["graphs_traced"], (default, raised)
    net = pipelines.denoiser(pipe)
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in net.modules()), "model left compiled"


@pytest.mark.parametrize("model, offload_type, inside", [
    ("flux-dev", "block_level", True),  # Flux's blocks are the groups: a hook on every repeated block
    ("sdxl", "block_level", False),     # SDXL's groups are the down/up blocks that contain the repeated blocks
    ("sdxl", "leaf_level", True),       # a hook on every leaf, inside the blocks
])
def test_hooks_in_repeated_blocks_follow_where_group_offload_hooks_sit(model, offload_type, inside):
    pipe = pipelines.build_pipeline(model, "smoke", device="cpu")
    net = pipelines.denoiser(pipe)
    assert offload.hooks_in_repeated_blocks(net) == 0, "no offload yet"
    extra = {"num_blocks_per_group": 1} if offload_type == "block_level" else {}
    net.enable_group_offload(onload_device=torch.device("cpu"), offload_type=offload_type, **extra)
    assert (offload.hooks_in_repeated_blocks(net) > 0) is inside


@pytest.mark.parametrize("config", ["Int8DynamicActivationInt8WeightConfig", "Int8WeightOnlyConfig"])
def test_free_pipeline_empties_torchao_inner_tensors(config):
    """torchao's 8-bit weights keep their data in inner tensors (qdata, scale); emptying the wrapper alone left
    them allocated (planted: the wrapper reads 0 elements while qdata still holds 64 x 64)."""
    import torchao.quantization as tq

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    tq.quantize_(model, getattr(tq, config)())
    weight = model[0].weight
    inner = weight.__tensor_flatten__()[0]
    assert inner and getattr(weight, inner[0]).numel() == 64 * 64
    offload.free_pipeline(model)
    for w in (model[0].weight, model[1].weight):
        assert w.numel() == 0 and all(getattr(w, name).numel() == 0 for name in w.__tensor_flatten__()[0])


class _Weight:
    """A stand-in 4-bit weight: packed codes and their quant state."""

    def __init__(self, data, quant_state):
        self.data, self.quant_state = data, quant_state


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (64, 160), (128, 64)])
def test_nf4_dequantize_is_bitsandbytes_generic_decode(shape, nested):
    """The format decode equals bitsandbytes' generic kernel on every shape, whole blocks per row or not."""
    import bitsandbytes.functional as bnbf
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute

    w = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    q, qs = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)
    absmax = (bnbf.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset) if nested else qs.absmax
    generic = _dequantize_4bit_compute(q.view(torch.uint8).reshape(-1), absmax.float(), qs.code, 64, shape,
                                       torch.float32)
    assert torch.equal(quantize.nf4_dequantize(_Weight(q, qs)), generic)
    measured = quantize.relative_l2(w, quantize.nf4_dequantize(_Weight(q, qs)))
    assert quantize.weight_error_problem(measured, quantize.nf4_format_error([w])) == ""


def test_weight_error_problem_fails_on_the_avx512_values():
    """The values issue 27 reported: the AVX512 kernel's decode read 0.218 and 0.239 for a format error of ~0.092."""
    assert quantize.weight_error_problem(0.0921, 0.0921) == ""
    for planted in (0.21825382452965347, 0.23931466442772703, 0.0, 0.08, float("nan")):
        assert "not within" in quantize.weight_error_problem(planted, 0.0921), planted


def _narrow_nf4_layer(seed: int = 0, width: int = 32, dtype: torch.dtype = torch.float32):
    """One NF4 layer (32 wide: as in the smoke models), quantized on the CPU from weights in dtype."""
    import bitsandbytes as bnb

    ref = torch.nn.Linear(width, 64, bias=True, dtype=dtype)
    with torch.no_grad():
        ref.weight.normal_(generator=torch.Generator().manual_seed(seed))
    layer = bnb.nn.Linear4bit(width, 64, bias=True, quant_type="nf4", compute_dtype=dtype, quant_storage=torch.uint8)
    layer.load_state_dict(ref.state_dict())
    layer = layer.to("cpu")
    if getattr(layer.weight, "quant_state", None) is None:
        layer.weight = bnb.nn.Params4bit(layer.weight.data, requires_grad=False, quant_type="nf4")._quantize("cpu")
    return torch.nn.Sequential(layer).eval(), torch.nn.Sequential(ref).eval()


def test_misdecoded_layers_finds_a_planted_bad_decode(monkeypatch):
    """On any machine: a dequantize_4bit that misplaces the block scales (what the AVX512 kernel does) is found,
    and decode_by_format makes the layer compute with the format's weights."""
    import bitsandbytes.functional as bnbf

    model, _ = _narrow_nf4_layer()
    right = bnbf.dequantize_4bit

    def misplaced(data, quant_state):
        out = right(data, quant_state)
        return out.roll(1, dims=0)  # every row scaled by its neighbour's block

    monkeypatch.setattr(bnbf, "dequantize_4bit", misplaced)
    assert quantize.misdecoded_layers(model) == ["0"]
    assert quantize.decode_by_format(model) == ["0"]
    x = torch.randn(3, 32)
    with torch.inference_mode():
        expected = torch.nn.functional.linear(x, quantize.nf4_dequantize(model[0].weight), model[0].bias)
        assert torch.allclose(model(x), expected, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_right_decode_is_not_flagged(dtype):
    """Rows of whole blocks decode right on every machine, with fp32 or bf16 scales (a bf16 decode is one rounding
    away from the format's fp32 one, which the comparison allows)."""
    model, _ = _narrow_nf4_layer(width=128, dtype=dtype)
    assert model[0].weight.quant_state.nested  # Linear4bit's default: double quantization, decoded too
    assert quantize.misdecoded_layers(model) == []


def _kernel_misdecodes_narrow_rows() -> bool:
    """Whether this machine's bitsandbytes CPU dequantize_4bit misdecodes a 32-wide row (AVX512 CPUs)."""
    model, _ = _narrow_nf4_layer()
    return bool(quantize.misdecoded_layers(model))


@pytest.mark.skipif(not _kernel_misdecodes_narrow_rows(),
                    reason="this CPU's bitsandbytes kernel decodes 32-wide rows right (the bug needs AVX512)")
def test_avx512_kernel_misdecode_is_routed_to_the_format():
    """On an AVX512 CPU: bitsandbytes' own decode of a 32-wide layer is off by far more than NF4 rounding; after
    decode_by_format the layer's output is the format's."""
    import bitsandbytes.functional as bnbf

    model, ref = _narrow_nf4_layer()
    w = model[0].weight
    kernel_error = quantize.relative_l2(ref[0].weight, bnbf.dequantize_4bit(w.data, w.quant_state))
    expected = quantize.nf4_format_error([ref[0].weight])
    assert "not within" in quantize.weight_error_problem(kernel_error, expected)
    assert quantize.weight_error_problem(quantize.weight_error(model, ref), expected) == ""
    assert quantize.decode_by_format(model) == ["0"] and quantize.misdecoded_layers(model) == ["0"]
    x = torch.randn(4, 32)
    with torch.inference_mode():
        assert quantize.relative_l2(ref(x), model(x)) < 3 * expected  # the format's weights, not the kernel's


def _has_avx512bf16() -> bool:
    import bitsandbytes.functional as bnbf

    return bool(bnbf.has_avx512bf16())


@pytest.mark.skipif(not _has_avx512bf16(), reason="bitsandbytes' AVX512-BF16 CPU path needs a CPU with avx512_bf16")
def test_avx512bf16_path_repacks_and_computes_the_format():
    """Where the CPU has AVX512-BF16: a layer whose rows are whole blocks is repacked at its first forward and
    computes (in bf16) what the format's weights give."""
    import bitsandbytes as bnb

    ref = torch.nn.Linear(128, 64, bias=False)
    with torch.no_grad():
        ref.weight.normal_(generator=torch.Generator().manual_seed(1))
    layer = bnb.nn.Linear4bit(128, 64, bias=False, quant_type="nf4", compute_dtype=torch.bfloat16)
    layer.load_state_dict(ref.state_dict())
    layer = layer.to("cpu").eval()
    assert layer.support_avx512bf16_for_cpu and quantize.misdecoded_layers(torch.nn.Sequential(layer)) == []
    expected_w = quantize.nf4_dequantize(layer.weight)
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    with torch.inference_mode():
        out = layer(x)
    assert layer.weight.quant_state.packing_format_for_cpu  # the AVX512-BF16 layout
    with pytest.raises(ValueError, match="repacked"):
        quantize.nf4_dequantize(layer.weight)
    want = torch.nn.functional.linear(x.float(), expected_w)
    assert quantize.relative_l2(want, out) < 2 ** -6  # bf16 inputs and outputs: a few bf16 roundings (2^-8 each)


def test_nf4_pipeline_on_cpu_loads_what_the_pipeline_call_would(tiny_pipe, tmp_path):
    """Notebook 09's CPU path: the pipeline call refuses without a GPU; the helper loads the named components in NF4
    (T5 by transformers, the DiT by diffusers' quantizer steps), the rest as saved, and says how."""
    import bitsandbytes as bnb
    from diffusers import FluxPipeline, PipelineQuantizationConfig

    tiny_pipe.save_pretrained(tmp_path / "pipe")
    config = PipelineQuantizationConfig(quant_backend="bitsandbytes_4bit", quant_kwargs=NF4,
                                        components_to_quantize=["transformer", "text_encoder_2"])
    with pytest.raises(RuntimeError, match="No GPU found") as refused:
        FluxPipeline.from_pretrained(tmp_path / "pipe", quantization_config=config, dtype=torch.bfloat16)
    pipe, how = quantize.nf4_pipeline_on_cpu(FluxPipeline, tmp_path / "pipe", config, "cpu", torch.bfloat16,
                                             refused.value)
    assert how["transformer"].startswith("diffusers BnB4BitDiffusersQuantizer steps") and "No GPU found" in how["transformer"]
    assert how["text_encoder_2"].startswith("transformers T5EncoderModel.from_pretrained(quantization_config=")
    for name in ("transformer", "text_encoder_2"):
        assert any(isinstance(m, bnb.nn.Linear4bit) for m in getattr(pipe, name).modules())
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in pipe.text_encoder.modules())
    summary = quantize.component_summary(pipe.transformer, tiny_pipe.transformer)
    assert quantize.weight_error_problem(summary["weight_error"], summary["weight_error_format"]) == ""
    assert summary["linear_bytes_ratio"] == pytest.approx(0.5625 / 2) and summary["linear_layers_kept"] == []
    assert summary["footprint_nf4_bytes"] < summary["footprint_reference_bytes"]
    assert quantize.format_mismatch(pipe.transformer) < 0.02  # misdecoded layers (AVX512 CPUs) routed to the format


def test_format_mismatch_finds_a_layer_left_misdecoded():
    """A layer that computes with misplaced block scales (the AVX512 kernel's fault) is far from the format's weights;
    the same layer decoding by the format is not."""
    import types

    assert quantize.format_mismatch(_narrow_nf4_layer(width=128)[0]) < 0.02
    model, _ = _narrow_nf4_layer(width=128)  # a fresh one: the first forward may have repacked the weights
    layer = model[0]

    def misplaced(self, x):  # every row scaled by its neighbour's block
        return torch.nn.functional.linear(x, quantize.nf4_dequantize(self.weight).roll(1, dims=0), self.bias)

    layer.forward = types.MethodType(misplaced, layer)
    assert quantize.format_mismatch(model) > 0.2


def test_time_compiled_records_a_failure_instead_of_raising():
    def boom():
        raise RuntimeError("no kernel for this\nsecond line")

    out = quantize.time_compiled(boom, boom, torch.device("cpu"), repeats=1, warmup=0)
    assert out == {"status": "failed", "reason": "RuntimeError: no kernel for this"}
    fine = quantize.time_compiled(lambda: torch.ones(2) * 2, lambda: torch.ones(2), torch.device("cpu"),
                                  repeats=2, warmup=0)
    assert fine["status"] == "ok" and fine["graph_breaks"] == 0 and fine["recompiles"] == 0
    assert fine["dynamic_shapes_at_compile"] is None  # nothing was compiled


def test_free_pipeline_drops_the_scales_a_linear4bit_keeps_on_itself():
    """bitsandbytes' Linear4bit holds its weight's QuantState (the absmax scales) on the layer as well: emptying the
    weight alone left them allocated (0.9 GiB on Flux-1-Dev's GPU, under a 16 GiB cap)."""
    import bitsandbytes as bnb

    layer = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4").to("cpu")
    layer(torch.randn(2, 64, dtype=torch.bfloat16))  # the forward puts the state on the layer
    assert layer.quant_state is not None and layer.weight.quant_state is not None
    offload.free_pipeline(torch.nn.Sequential(layer))
    assert layer.quant_state is None and layer.weight.quant_state is None and layer.weight.numel() == 0


def test_the_format_error_is_computed_on_the_device_asked(monkeypatch):
    """09 keeps its bf16 reference in CPU memory on a small card: the format's error is computed on the NF4 model's
    GPU, one weight at a time, not for minutes on the CPU. Planted: Tensor.to records where each weight goes."""
    weights = [torch.randn(64, 32), torch.randn(32, 64)]
    plain = quantize.nf4_format_error(weights)
    moved, to = [], torch.Tensor.to

    def spy(self, *args, **kwargs):
        moved.append((tuple(self.shape), str(args[0]) if args else str(kwargs.get("device"))))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    assert quantize.nf4_format_error(weights, device="cpu") == pytest.approx(plain, rel=1e-6)
    assert [m for m in moved if m[0] in ((64, 32), (32, 64))] == [((64, 32), "cpu"), ((32, 64), "cpu")]


def test_free_pipeline_drops_group_offloads_pinned_copies():
    """With a stream, group offload keeps each weight's pinned CPU copy in its group's cpu_param_dict, out of reach of
    the parameters: emptying the parameters alone left them (tens of GiB of page-locked memory for Flux-1-Dev).
    Planted: the CPU refuses a stream, so the dict is filled as a stream would fill it."""
    from diffusers.hooks import apply_group_offloading

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    apply_group_offloading(model, onload_device=torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)
    groups = [h.group for m in model.modules() for h in getattr(getattr(m, "_diffusers_hook", None), "hooks",
                                                                  {}).values() if hasattr(h, "group")]
    assert groups
    for g in groups:
        g.cpu_param_dict = {p: p.data.clone() for p in model.parameters()}
    offload.free_pipeline(model)
    assert all(not g.cpu_param_dict for g in groups)


def test_blocks_per_group_above_one_needs_the_stream_off():
    """diffusers resets a streamed group to one block (with a log line only), so 08 would time another setting than
    the one asked for, and its count of weights at once would not match the hooks: refused up front instead."""
    assert offload.check_blocks_per_group(1, True) == 1 and offload.check_blocks_per_group(3, False) == 3
    with pytest.raises(params.ParameterError, match="BLOCKS_PER_GROUP=2 with USE_STREAM=True.*USE_STREAM=False"):
        offload.check_blocks_per_group(2, True)
    with pytest.raises(params.ParameterError, match="BLOCKS_PER_GROUP"):
        offload.check_blocks_per_group(0, False)
