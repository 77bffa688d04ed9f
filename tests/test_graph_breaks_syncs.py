"""Unit tests of helpers.graph_breaks and helpers.syncs on tiny modules (CPU, seconds)."""

import io

import pytest
import torch
from diffusers import FluxTransformer2DModel

from helpers import graph_breaks, syncs


def _tiny_flux():
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=(4, 6, 6)).eval()
    inputs = {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 8, 32),
              "pooled_projections": torch.randn(1, 32), "timestep": torch.ones(1), "img_ids": torch.zeros(16, 3),
              "txt_ids": torch.zeros(8, 3), "return_dict": False}
    return model, inputs


def test_planted_breaks_are_found_and_fixed():
    model, inputs = _tiny_flux()
    with torch.inference_mode():
        ref = model(**inputs)[0]
    stream = io.StringIO()
    graph_breaks.plant_breaks(model, stream)
    with torch.inference_mode():
        assert graph_breaks.relative_error(model(**inputs)[0], ref) == 0.0
    assert "attention output" in stream.getvalue()
    found = graph_breaks.find_breaks(model, inputs)
    assert found.breaks > 0 and found.explain_graphs > 1 and found.log_lines
    kinds = graph_breaks.kinds_found(found.explain_reasons + list(found.counter_reasons))
    assert set(kinds) == set(graph_breaks.PLANTED) and all(n > 0 for n in kinds.values()), kinds
    ok, message, _, _ = graph_breaks.fullgraph_attempt(model, inputs, backend="eager")
    assert not ok and "Unsupported" in message

    graph_breaks.apply_fixes(model, stream)
    fixed = graph_breaks.find_breaks(model, inputs)
    assert fixed.breaks == 0 and fixed.explain_graphs == 1 and fixed.counter_unimplemented == 0
    ok, message, _, out = graph_breaks.fullgraph_attempt(model, inputs, backend="eager")
    assert ok and message == "" and graph_breaks.relative_error(out[0], ref) < 1e-5
    graph_breaks.restore(model)
    assert "forward" not in model.__dict__
    assert all(type(p).__name__ == "FluxAttnProcessor" for p in model.attn_processors.values())


def test_fp32_reference_is_lossless_for_the_weights():
    model, inputs = _tiny_flux()
    model.to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    out = graph_breaks.fp32_reference(model, {k: v.to(torch.bfloat16) if torch.is_tensor(v) else v
                                              for k, v in inputs.items()})
    assert out.dtype == torch.float32 and next(model.parameters()).dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_debug_processor_rejects_unknown_kind():
    with pytest.raises(ValueError, match="print"):
        graph_breaks.DebugAttnProcessor("log", io.StringIO())


def test_relative_error_and_kinds():
    a = torch.tensor([1.0, -2.0])
    assert graph_breaks.relative_error(a, a) == 0.0
    assert graph_breaks.relative_error(a + torch.tensor([0.2, 0.0]), a) == pytest.approx(0.1)
    kinds = graph_breaks.kinds_found(["Data-dependent branching", "Unsupported Tensor.item() call"])
    assert kinds["data-dependent branch"] == 1 and kinds[".item() in attention processor"] == 1
    assert kinds["print in attention processor"] == 0


def test_count_syncs_sees_item_and_nonzero_with_their_source():
    x = torch.tensor([0.0, 1.0, 2.0])

    def fn():
        idx = (x > 0.5).nonzero()
        return idx[0].item() + float(x.sum())

    counts, out = syncs.count_syncs(fn, torch.device("cpu"))
    assert out == 4.0
    assert counts.scalar_reads == 2 and counts.nonzero_calls == 1 and counts.host_reads == 3
    assert counts.device_syncs == 0 and counts.dtoh_memcpy is None and counts.cuda_sync_warnings is None
    assert counts.reads_from("test_graph_breaks_syncs.py") == 3
    assert counts.reads_from("test_graph_breaks_syncs.py", device_only=True) == 0
    assert {r.op for r in counts.reads} == {"nonzero", "item", "float"}


def test_stand_ins_mark_reads_of_values_computed_from_them():
    x, y = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([5.0])

    def fn():
        syncs.stand_in_for_device(x)
        derived = (x * 2)[1:]  # computed from a stand-in: device-placed too
        return derived.sum().item() + y.item() + float(x[0])

    counts, out = syncs.count_syncs(fn, torch.device("cpu"))
    assert out == 11.0 and counts.host_reads == 3
    assert counts.device_reads == 2 and counts.device_syncs == 0  # marked, but a CPU has nothing to wait for
    assert [r.device_placed for r in counts.reads] == [True, False, True]
    assert any(k.startswith("item of a device-placed tensor") for k in counts.by_source())
    # outside count_syncs marking does nothing, and a later count starts clean
    syncs.stand_in_for_device(y)
    again, _ = syncs.count_syncs(lambda: y.item(), torch.device("cpu"))
    assert again.host_reads == 1 and again.device_reads == 0


def test_count_syncs_of_a_read_free_function_is_zero():
    counts, _ = syncs.count_syncs(lambda: torch.ones(3) * 2, torch.device("cpu"))
    assert counts.host_reads == 0 and counts.reads == []


def test_set_schedule_and_begin_index():
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="placement"):
        syncs.set_schedule(sched, 2, "gpu", False, 64, torch.device("cpu"))
    syncs.set_schedule(sched, 3, "cpu", True, 64, torch.device("cpu"))
    assert sched.begin_index == 0 and len(sched.timesteps) == 3 and sched.sigmas.device.type == "cpu"
    syncs.set_schedule(sched, 3, "device", False, 64, torch.device("cpu"))
    assert sched.begin_index is None


def test_euler_step_loop_reads_sigma_twice_per_step():
    from helpers import pipelines

    fn = syncs.euler_step_loop(str(pipelines.config_dir("sdxl", "smoke") / "scheduler"), 3, "cpu",
                               torch.device("cpu"))
    counts, out = syncs.count_syncs(fn, torch.device("cpu"))
    assert counts.scalar_reads == 6 and counts.reads_from("scheduling_euler_discrete") == 6
    assert out.shape == (1, 4, 16, 16)
