"""Unit tests of helpers.graph_breaks and helpers.syncs on tiny modules (CPU, seconds)."""

import io

import numpy as np
import pytest
import torch
from diffusers import FluxTransformer2DModel

from helpers import graph_breaks, syncs
from helpers.compile_tools import relative_error
from tests.test_graph_breaks import FIX_SETTINGS, ITEM_AT, plant_breaks, restore, rewrite_like_the_notebook


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
    plant_breaks(model, stream)
    with torch.inference_mode():
        assert relative_error(model(**inputs)[0], ref) == 0.0
    assert "attention output" in stream.getvalue()
    found = graph_breaks.find_breaks(model, inputs)
    assert found.breaks > 0 and found.explain_graphs > 1 and found.log_lines
    kinds = graph_breaks.kinds_found(found.explain_reasons + list(found.counter_reasons))
    assert set(kinds) == set(graph_breaks.PLANTED) and all(n > 0 for n in kinds.values()), kinds
    with pytest.raises(torch._dynamo.exc.Unsupported), torch.inference_mode():  # fullgraph=True refuses a break
        torch.compile(model, fullgraph=True, backend="eager")(**inputs)

    rewrite_like_the_notebook(model, stream)
    with torch._dynamo.config.patch(**FIX_SETTINGS):
        fixed = graph_breaks.find_breaks(model, inputs)
        assert fixed.breaks == 0 and fixed.explain_graphs == 1 and fixed.counter_unimplemented == 0
        stats = model.attn_processors[ITEM_AT]
        stats.last_std = None
        torch._dynamo.reset()
        with torch.inference_mode():
            out = torch.compile(model, fullgraph=True, backend="eager")(**inputs)
    assert relative_error(out[0], ref) < 1e-5
    assert isinstance(stats.last_std, float), "the captured .item() still reaches the processor"
    restore(model)
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


def test_relative_error_and_kinds():
    a = torch.tensor([1.0, -2.0])
    assert relative_error(a, a) == 0.0
    assert relative_error(a + torch.tensor([0.2, 0.0]), a) == pytest.approx(0.2 / 5 ** 0.5)
    kinds = graph_breaks.kinds_found(["Data-dependent branching", "Unsupported Tensor.item() call"])
    assert kinds["data-dependent branch"] == 1 and kinds[".item() in attention processor"] == 1
    assert kinds["print in attention processor"] == 0


def test_count_syncs_sees_item_and_nonzero_with_their_source():
    x = torch.tensor([0.0, 1.0, 2.0])

    def fn():
        idx = (x > 0.5).nonzero()
        return idx[0].item() + float(x.sum())

    counts, out = syncs.count_syncs(fn, torch.device("cpu"))
    assert out == 4.0 and counts.modeled
    assert counts.scalar_reads == 2 and counts.nonzero_calls == 1 and counts.host_reads == 3
    assert counts.device_syncs == 0 and counts.gpu_syncs == 0 and counts.copies == []
    assert counts.dtoh_memcpy is None and counts.htod_memcpy is None and counts.cuda_sync_warnings is None
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
    assert counts.device_reads == 2 and counts.gpu_syncs == 2 and counts.device_syncs == 0  # a CPU never waits
    assert [r.device_placed for r in counts.reads] == [True, False, True]
    assert any(k.startswith("item of a device-placed tensor") for k in counts.by_source())
    # outside count_syncs marking does nothing, and a later count starts clean
    syncs.stand_in_for_device(y)
    again, _ = syncs.count_syncs(lambda: y.item(), torch.device("cpu"))
    assert again.host_reads == 1 and again.device_reads == 0


def test_modeled_copies_move_values_between_host_and_stand_in_device():
    a = torch.tensor([1.0, 2.0, 3.0])

    def fn():
        syncs.stand_in_for_device(a)
        dev = a.device
        assert dev == syncs.STAND_IN_DEVICE and torch.ones(1).device == torch.device("cpu")
        with syncs.phase("setup"):
            b = torch.ones(3).to(dev)                       # host to device: a blocking copy
            z = torch.zeros(1, device=dev)                  # made on the device: no copy
        same = a.to(torch.float64) + a.to(dev) + b + z      # dtype change / already there: no copy
        host = same.cpu()                                   # device to host: a blocking copy
        ahead = torch.ones(3).to(dev, non_blocking=True)    # a copy the host does not wait for
        a.copy_(torch.full((3,), 2.0))                      # host into device memory: a blocking copy
        fresh = torch.tensor([4.0], device=dev)             # from Python data to the device: a blocking copy
        return host.sum().item() + (same + ahead).sum().item() + fresh.item()

    counts, out = syncs.count_syncs(fn, torch.device("cpu"), warmup=False)
    assert out == pytest.approx((3 + 5 + 7) + (4 + 6 + 8) + 4)
    kinds = [(c.direction, c.blocking, c.phase) for c in counts.copies]
    assert kinds == [("host to device", True, "setup"), ("device to host", True, "call"),
                     ("host to device", False, "call"), ("host to device", True, "call"),
                     ("host to device", True, "call")], kinds
    assert counts.blocking_copies == 4 and counts.syncs_in("setup") == 1
    assert [r.device_placed for r in counts.reads] == [False, True, True]  # host.sum() is a host read
    assert counts.gpu_syncs == 4 + 2 and counts.device_syncs == 0
    assert counts.syncs_from("test_graph_breaks_syncs.py") == 6
    assert torch.equal(a, torch.full((3,), 2.0))


def test_recorder_on_a_real_second_device_sees_copies():
    # the CUDA code path (real devices, no stand-ins), exercised with the meta device as the "accelerator"
    recorder = syncs._Recorder(modeled=False)
    with recorder:
        torch.ones(2).to("meta")
        torch.tensor([1.0, 2.0], device="meta")
        torch.empty(2, device="meta").copy_(torch.ones(2))
        torch.ones(2).to("meta", non_blocking=True)
        torch.zeros(2, device="meta") + torch.ones(2, device="meta")  # made there: no copy
        torch.ones(2).to(torch.float64)  # dtype only: no copy
    assert [(c.direction, c.blocking) for c in recorder.copies] == [("host to device", True)] * 3 + [
        ("host to device", False)]
    assert recorder.placed(torch.ones(1, device="meta")) and not recorder.placed(torch.ones(1))


def test_count_syncs_warms_up_once_outside_the_count():
    calls = []

    def fn():
        calls.append(1)
        return torch.ones(1).item()

    counts, _ = syncs.count_syncs(fn, torch.device("cpu"))
    assert len(calls) == 2 and counts.host_reads == 1
    syncs.count_syncs(fn, torch.device("cpu"), warmup=False)
    assert len(calls) == 3


def test_count_syncs_of_a_read_free_function_is_zero():
    counts, _ = syncs.count_syncs(lambda: torch.ones(3) * 2, torch.device("cpu"))
    assert counts.host_reads == 0 and counts.reads == [] and counts.copies == []


def _mu(sched, image_seq_len):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    c = sched.config
    return calculate_shift(image_seq_len, c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)


def flux_schedule(sched, steps, image_seq_len, placement, begin_index, host_timesteps=False):
    """The schedule notebook 07 writes (sigmas on the device or on the CPU, begin index set or not)."""
    assert placement in syncs.PLACEMENTS

    def schedule(device):
        sigmas, mu = np.linspace(1.0, 1 / steps, steps), _mu(sched, image_seq_len)
        if placement == "device":
            sched.set_timesteps(sigmas=sigmas, mu=mu, device=device)
        else:
            sched.set_timesteps(sigmas=sigmas, mu=mu, device="cpu")
            if not host_timesteps:
                sched.timesteps = sched.timesteps.to(device)
        if begin_index:
            sched.set_begin_index(0)
    return schedule


def flux_loop(net, sched, inputs):
    """FluxPipeline's denoising loop as notebook 07 writes it."""
    conditioning = {k: v for k, v in inputs.items() if k not in ("hidden_states", "timestep")}

    def loop():
        latents = inputs["hidden_states"].clone()
        for t in sched.timesteps:
            timestep = t.expand(latents.shape[0]).to(latents.device, latents.dtype)
            noise = net(hidden_states=latents, timestep=timestep / 1000, **conditioning)[0]
            latents = sched.step(noise, t, latents, return_dict=False)[0]
        return latents
    on_device = [inputs["hidden_states"], *(v for v in conditioning.values() if torch.is_tensor(v)),
                 *net.parameters(), *net.buffers()]
    return loop, on_device


def test_schedule_matches_flux_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import retrieve_timesteps

    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    flux_schedule(sched, 3, 64, "cpu", True)(torch.device("cpu"))
    assert sched.begin_index == 0 and len(sched.timesteps) == 3 and sched.sigmas.device.type == "cpu"
    mine = sched.timesteps.clone()
    flux_schedule(sched, 3, 64, "device", False)(torch.device("cpu"))
    assert sched.begin_index is None and torch.equal(sched.timesteps, mine)  # set_timesteps resets the index
    ref = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)  # FluxPipeline's own schedule
    timesteps, _ = retrieve_timesteps(ref, 3, "cpu", sigmas=np.linspace(1.0, 1 / 3, 3), mu=_mu(ref, 64))
    assert torch.equal(timesteps, mine)


def test_counted_loop_needs_a_device_tensor():
    with pytest.raises(ValueError, match="on_device"):
        syncs.counted_loop(lambda device: None, lambda: None, [])


def test_flux_loop_syncs_by_placement_and_begin_index():
    from diffusers import FlowMatchEulerDiscreteScheduler

    model, inputs = _tiny_flux()
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=16, max_image_seq_len=64)
    steps, tokens = 3, inputs["hidden_states"].shape[1]
    loop, on_device = flux_loop(model, sched, inputs)
    got = {}
    for placement in syncs.PLACEMENTS:
        for begin in (False, True):
            call = syncs.counted_loop(flux_schedule(sched, steps, tokens, placement, begin), loop, on_device)
            c, out = syncs.count_syncs(call, torch.device("cpu"))
            got[(placement, begin)] = c
            assert out.shape == inputs["hidden_states"].shape
            assert c.syncs_in("setup") == c.blocking_copies == 1, c.by_source()
            assert c.syncs_in("steps") == (0 if begin else 2) == c.syncs_from("(index_for_timestep)"), c.by_source()
            assert c.host_reads == c.device_reads  # every read the profiler saw, the recorder placed
    assert got[("device", False)].gpu_syncs == got[("cpu", False)].gpu_syncs == 3
    assert got[("device", True)].gpu_syncs == got[("cpu", True)].gpu_syncs == 1
    # the mistake to avoid: timesteps on the host, so every step copies its timestep (named by the loop's line)
    call = syncs.counted_loop(flux_schedule(sched, steps, tokens, "cpu", True, host_timesteps=True), loop, on_device)
    c, _ = syncs.count_syncs(call, torch.device("cpu"))
    assert c.syncs_in("setup") == 0 and c.syncs_in("steps") == c.blocking_copies == steps, c.by_source()
    assert all(x.direction == "host to device" and "(loop)" in x.source for x in c.copies)
    # outside a count the loop runs as written, on the real device
    assert syncs.counted_loop(flux_schedule(sched, steps, tokens, "device", True), loop, on_device)().shape == \
        inputs["hidden_states"].shape


def test_euler_loop_sigma_reads_by_placement():
    from diffusers import EulerDiscreteScheduler

    from helpers import pipelines

    folder = pipelines.config_dir("sdxl", "smoke") / "scheduler"
    sched = EulerDiscreteScheduler.from_pretrained(folder)
    gen = torch.Generator().manual_seed(0)
    sample, model_output = torch.randn(1, 4, 16, 16, generator=gen), torch.randn(1, 4, 16, 16, generator=gen)

    def schedule(placement):
        def set_schedule(device):
            sched.set_timesteps(3, device=device)
            sched.set_begin_index(0)
            if placement == "device":
                sched.sigmas = sched.sigmas.to(device)
        return set_schedule

    def loop():
        latents = sample
        for t in sched.timesteps:
            latents = sched.scale_model_input(latents, t)
            latents = sched.step(model_output, t, latents, return_dict=False)[0]
        return latents

    cpu, out = syncs.count_syncs(syncs.counted_loop(schedule("cpu"), loop, [sample, model_output]), torch.device("cpu"))
    dev, _ = syncs.count_syncs(syncs.counted_loop(schedule("device"), loop, [sample, model_output]),
                               torch.device("cpu"))
    assert out.shape == (1, 4, 16, 16)
    for c in (cpu, dev):
        assert c.scalar_reads == 6 and c.reads_from("scheduling_euler_discrete") == 6
    assert cpu.syncs_in("steps") == 0 and dev.syncs_in("steps") == 6 == dev.syncs_from("(step)")
    assert cpu.syncs_in("setup") == 3 and dev.syncs_in("setup") == 4  # set_timesteps: 2 copies in, 1 back
    assert cpu.gpu_syncs < dev.gpu_syncs


def _counts(warnings, reads, copies):
    read = syncs.HostRead("item", "cuda", "x.py:1 (f)", device_placed=True)
    copy = syncs.Copy("host to device", True, "x.py:2 (f)")
    return syncs.SyncCounts(profiler_ops={}, reads=[read] * reads, copies=[copy] * copies, modeled=False,
                            cuda_sync_warnings=warnings)


def test_debug_mode_disagreements_fails_on_planted_counts():
    agree = {"a": _counts(3, 2, 1), "b": _counts(0, 0, 0)}
    assert syncs.debug_mode_disagreements(agree) == {}
    planted = {**agree, "missed a sync": _counts(2, 2, 1), "invented one": _counts(4, 2, 1),
               "not on CUDA": _counts(None, 0, 0)}
    bad = syncs.debug_mode_disagreements(planted)
    assert set(bad) == {"missed a sync", "invented one", "not on CUDA"}
    assert bad["missed a sync"] == {"sync-debug warnings": 2, "syncs counted": 3}


def test_sync_debug_mode_reason():
    assert syncs.sync_debug_mode_unavailable_reason(torch.device("cuda")) == ""
    why = syncs.sync_debug_mode_unavailable_reason(torch.device("cpu"))
    assert "device is cpu" in why and "nothing to warn" in why
    if not torch.backends.cuda.is_built():
        assert "cannot even be switched on" in why


def test_a_read_in_a_notebook_cell_is_named_by_its_line_not_the_cell_file():
    scope = {"torch": torch}
    exec(compile("def cell_fn():\n    return torch.ones(1).item()\n", "/tmp/ipykernel_1/123456.py", "exec"), scope)  # noqa: S102 (a planted cell)
    counts, _ = syncs.count_syncs(scope["cell_fn"], torch.device("cpu"))
    assert [r.source for r in counts.reads] == ["notebook cell, line 2 (cell_fn)"]
