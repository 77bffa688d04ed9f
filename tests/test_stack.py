"""helpers.stack: each check of notebook 12's ladder fails on a planted wrong value."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from helpers import measure, quantize, stack


class Rows:
    """A stand-in for the result writer that keeps what was recorded."""

    def __init__(self):
        self.rows = []

    def record(self, scenario, **fields):
        self.rows.append((scenario, fields))


def _stage(**changes):
    t = measure.Timing(samples_s=[0.01, 0.01], warmup=0, method="perf_counter")
    good = stack.Stage(name="+ compile", lever="compile", first_image_s=1.0, step=t, image=t,
                       memory=measure.Memory(0, 0, "cpu_allocated_during_call"), graphs=2, graph_breaks=0,
                       recompiles=0, step_drift=1e-6, image_drift=1e-6, tolerance=1e-4, finite=True)
    return replace(good, **changes)


def test_a_clean_stage_has_no_problem():
    assert stack.stage_problems(_stage(), fullgraph=True) == []


@pytest.mark.parametrize("changes, words", [
    ({"step_drift": 2e-4}, "differs from eager"),
    ({"step_drift": math.nan}, "differs from eager"),
    ({"finite": False}, "non-finite"),
    ({"recompiles": 1}, "compiled after the first image"),
    ({"graph_breaks": 1}, "graph break"),
])
def test_each_planted_fault_is_caught(changes, words):
    problems = stack.stage_problems(_stage(**changes), fullgraph=True)
    assert any(words in p for p in problems), problems


def test_graph_breaks_count_only_with_fullgraph():
    assert stack.stage_problems(_stage(graph_breaks=1), fullgraph=False) == []


@pytest.mark.parametrize("lever, quantized, linears, bad", [
    ("int8", 10, 10, False), ("int8", 9, 10, True), ("int8", 0, 0, True),
    ("fp8", 3, 10, False), ("fp8", 0, 10, True),
    ("compile", 0, 10, False), ("compile", 1, 10, True),
])
def test_quantization_problem(lever, quantized, linears, bad):
    assert bool(stack.quantization_problem(lever, quantized, linears)) is bad


def test_quantized_linears_counts_torchao_weights():
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    assert stack.quantized_linears(net) == (0, 2)
    quantize_(net, Int8DynamicActivationInt8WeightConfig())
    assert stack.quantized_linears(net) == (2, 2)


def test_quantized_tensors_counts_what_an_exported_program_keeps():
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert stack.quantized_tensors(torch.export.export(net, (x,))) == 0
        quantize_(net, Int8DynamicActivationInt8WeightConfig())
        assert stack.quantized_tensors(torch.export.export(net, (x,))) == 2


def test_skip_reasons_on_a_cpu():
    cpu = torch.device("cpu")
    assert "CUDA" in stack.skip_reason("cudnn-attention", "flux-dev", cpu)
    assert "dispatcher" in stack.skip_reason("cudnn-attention", "sdxl", cpu)
    assert "8.9" in stack.skip_reason("fp8", "flux-dev", cpu)
    for model in ("flux-dev", "sdxl"):  # channels_last acts on the VAE of both (and on SDXL's UNet)
        for lever in ("channels-last", "compile", "inductor-flags", "fused-qkv", "max-autotune", "vae-compile",
                      "int8"):
            assert stack.skip_reason(lever, model, cpu) == ""
    assert "CUDA GPU" in stack.cuda_graphs_reason(cpu)


def test_cudnn_attention_and_fp8_are_skipped_in_a_dtype_they_refuse(monkeypatch):
    """SDPA's cuDNN kernel takes 16-bit inputs only, torchao's row-wise fp8 bf16 weights only: on a GPU a run in
    another dtype skips the lever, with why, instead of raising mid-ladder."""
    gpu = torch.device("cuda")
    assert "bf16 or fp16" in stack.skip_reason("cudnn-attention", "flux-dev", gpu, torch.float32)
    assert stack.skip_reason("cudnn-attention", "flux-dev", gpu, torch.bfloat16) == ""
    assert stack.skip_reason("cudnn-attention", "flux-dev", gpu, torch.float16) == ""
    assert stack.skip_reason("cudnn-attention", "flux-dev", gpu) == ""  # no dtype given: the device decides
    monkeypatch.setattr(stack, "fp8_refusal", lambda: "")  # a GPU torchao accepts, of compute capability 9.0
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "bf16 weights only" in stack.skip_reason("fp8", "flux-dev", gpu, torch.float16)
    assert stack.skip_reason("fp8", "flux-dev", gpu, torch.bfloat16) == ""


def test_ladder_measures_drift_from_its_first_stage():
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    scale = {"value": 1.0}

    def step():
        return (net(x) * scale["value"],)

    def image():
        return net(x).sum(0) * scale["value"]

    rows = Rows()
    ladder = stack.Ladder(rows, torch.device("cpu"), repeats=2, warmup=0)
    base = ladder.measure("eager", "none", step_call=step, image_call=image, image_tensor_call=image, tolerance=1e-4)
    assert base.step_drift == 0 and base.image_drift == 0 and base.recompiles == 0
    scale["value"] = 1.01  # a planted 1% change of the output
    moved = ladder.measure("+ x", "x", step_call=step, image_call=image, image_tensor_call=image, tolerance=1e-4)
    assert moved.step_drift == pytest.approx(0.01, rel=1e-3)
    assert stack.stage_problems(moved, fullgraph=True), "a 1% drift must fail a 1e-4 band"
    ladder.skip("+ y", "y", "not here")
    full = ladder.table()
    assert list(full.index) == ["eager", "+ x", "+ y"]
    assert "peak memory (MiB)" in full.columns, "peaks under 1 GiB read in MiB"
    assert full.loc["+ x", "peak memory (MiB)"] == pytest.approx(moved.memory.peak_gib * 1024)
    big = replace(moved.memory, peak_bytes=3 * 2**30)  # a planted GPU-sized peak: the column in GiB
    ladder.stages[1] = replace(moved, memory=big)
    assert ladder.table().loc["+ x", "peak memory (GiB)"] == pytest.approx(3.0)
    brief = ladder.table(brief=True)
    assert list(brief.index) == ["eager", "+ x"], "the brief table leaves skipped stages out"
    assert brief.loc["+ x", "step drift vs eager (rel. L2)"] == pytest.approx(0.01, rel=1e-3)
    assert brief.loc["+ x", "band (rel. L2)"] == 1e-4
    assert [r[0] for r in rows.rows] == ["stack: eager", "stack: + x", "stack: + y"]
    assert rows.rows[2][1]["status"] == "skipped"
    ladder.skip("+ aoti", "aoti", "the package did not build: CppCompileError: ...", status="failed")
    assert rows.rows[3][1]["status"] == "failed" and "+ aoti" in ladder.skipped


def test_reproduce_tolerance():
    assert stack.reproduce_tolerance(1e-4, stack.INT8_TOLERANCE, quantized=False) == 1e-4
    assert stack.reproduce_tolerance(1e-4, stack.INT8_TOLERANCE, quantized=True) == stack.INT8_TOLERANCE


def test_cold_compile_counts_one_compile_and_its_drift():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    x = torch.randn(4, 8)
    with torch.no_grad():
        ref = net(x)
        compiled = torch.compile(net, fullgraph=True)
        line, timed, first, later = stack.cold_compile(lambda: compiled(x), torch.device("cpu"), ref, repeats=2,
                                                       warmup=1)
    assert first.graphs >= 1 and first.cache_hits == 0 and later == 0
    assert line["rel. L2 vs eager (ratio)"] < 1e-5 and len(timed.samples_s) == 2
    assert line["step (ms)"] == pytest.approx(timed.median_s * 1e3)


def test_quiet_loading_turns_the_loading_bars_off_and_back():
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    before = (diffusers_logging.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled())
    with stack.quiet_loading():
        assert not diffusers_logging.is_progress_bar_enabled() and not transformers_logging.is_progress_bar_enabled()
    assert (diffusers_logging.is_progress_bar_enabled(), transformers_logging.is_progress_bar_enabled()) == before


@pytest.mark.parametrize("scope", ["full", "regional"])
@pytest.mark.parametrize("lever", stack.COMPILES)
def test_the_blocks_alone_never_capture_cuda_graphs(lever, scope):
    # the planted fault: regional max-autotune with CUDA graphs failed notebook 12 on an H100 (G0, 2026-11-28)
    from helpers import compile_tools

    mode = stack.compile_mode(lever, scope)
    captures = bool(compile_tools.mode_options(mode).get("triton.cudagraphs"))
    assert captures == (lever == "max-autotune" and scope == "full")
    if lever == "max-autotune":  # the same autotuning either way; only the CUDA graphs differ
        assert compile_tools.cuda_graph_twin("max-autotune") == stack.compile_mode(lever, "regional")


def test_apply_lever_compiles_the_blocks_with_the_mode_compile_mode_gives(monkeypatch):
    calls = []

    class Net:
        def compile_repeated_blocks(self, **kw):
            calls.append(("blocks", kw))

        def compile(self, **kw):
            calls.append(("whole", kw))

    class Pipe:
        transformer = Net()

    monkeypatch.setattr(stack.pipelines, "denoiser", lambda pipe: pipe.transformer)
    stack.apply_lever(Pipe(), "max-autotune", scope="regional", vae_mode="default")
    stack.apply_lever(Pipe(), "max-autotune", scope="full", vae_mode="default")
    assert calls == [("blocks", {"fullgraph": True, "mode": "max-autotune-no-cudagraphs"}),
                     ("whole", {"fullgraph": True, "mode": "max-autotune"})]


def test_compile_mode_refuses_what_is_not_a_compile_lever_or_scope():
    with pytest.raises(ValueError, match="not a compile lever"):
        stack.compile_mode("fp8", "full")
    with pytest.raises(ValueError, match="scope="):
        stack.compile_mode("compile", "blocks")


def _smoke_flux_step(lever: str, monkeypatch: pytest.MonkeyPatch, weight_scale: float = 1.0) -> float:
    """Relative L2 from the bf16 step of one step of the trained smoke Flux with its Linear weights quantized: torchao's
    int8 or fp8 (fused QKV first, as notebook 12 stacks them), or bitsandbytes' NF4 round trip (quantize, dequantize)."""
    import bitsandbytes.functional as bnb
    from torchao.quantization import quant_api, quantize_

    from helpers import compile_tools, params, pipelines, transfer

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda *a: None)  # fp8's kernels run on a CPU too
    weights, _ = params.resolve_weights("auto", "flux-dev", "smoke")
    pipe = pipelines.build_pipeline("flux-dev", "smoke", weights=weights, dtype=torch.bfloat16, device="cpu", seed=0)
    net, inputs = pipe.transformer, pipelines.denoiser_inputs(pipe, height=128, width=128, max_sequence_length=32)
    with torch.inference_mode():
        reference = net(**inputs)[0].clone()
        for m in net.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(weight_scale)  # 1: the weights as trained; else a planted wrong scale
                if lever == "nf4":
                    packed, state = bnb.quantize_4bit(m.weight.data, blocksize=64, quant_type="nf4")
                    # decoded as the format defines it (a GPU's decode): bitsandbytes' own CPU kernel misdecodes
                    # rows of these widths on AVX512 CPUs (quantize.misdecoded_layers): drift 1.17, not 0.43 (this one)
                    m.weight.copy_(quantize.nf4_dequantize(SimpleNamespace(data=packed, quant_state=state)))
    if lever != "nf4":
        net.fuse_qkv_projections()
        quantize_(net, transfer.quantize_config(lever))
    with torch.inference_mode():
        return compile_tools.relative_error(net(**inputs)[0], reference)


@pytest.mark.parametrize("lever", ["int8", "fp8", "nf4"])
def test_the_quantization_bands_hold_the_smoke_flux_and_fail_a_wrong_scale(monkeypatch, lever):
    """Each quantization's drift band (12's stages, 16's cells) holds what its kernels do to the trained smoke Flux
    in one step, and fails the same weights a fifth too large."""
    from helpers import transfer

    band = transfer.QUANTIZED_DRIFT_BAND[lever]
    if lever != "nf4":  # 12's stages and 16's cells hold the 8-bit levers to one band
        assert band == stack.band([lever], 0.03)
    assert _smoke_flux_step(lever, monkeypatch) <= band
    assert _smoke_flux_step(lever, monkeypatch, weight_scale=1.2) > band


def test_the_fp8_probe_leaves_inductors_flags_as_they_are():
    """torchao's fp8 config sets coordinate descent tuning globally before its hardware check; the probe asks it not to."""
    with torch._inductor.config.patch(coordinate_descent_tuning=False, force_fuse_int_mm_with_mul=False):
        stack.fp8_refusal()
        assert not torch._inductor.config.coordinate_descent_tuning
        assert not torch._inductor.config.force_fuse_int_mm_with_mul


def test_aoti_is_skipped_with_its_reason_where_no_cpp_compiler_is_found():
    """AOTInductor's package is C++: a host without the compiler inductor names gets a skip reason, not a crash."""
    if stack.aoti_refusal():
        pytest.skip(f"this machine has no C++ compiler: {stack.aoti_refusal()}")
    assert stack.skip_reason("aoti", "flux-dev", torch.device("cpu")) == ""
    with torch._inductor.config.patch({"cpp.cxx": ("no-such-cxx-compiler",)}):  # planted: none found (restored after)
        assert "finds no C++ compiler" in stack.skip_reason("aoti", "flux-dev", torch.device("cuda"))
    assert stack.aoti_refusal() == ""


def test_the_package_is_compiled_under_the_sdpa_kernel_the_cudnn_lever_chose():
    """torch.export keeps attention as one op, not diffusers' cuDNN choice: the package compiles under it instead."""
    from torch.backends import cuda

    with stack.sdpa_choice(["compile", "int8"]):
        assert cuda.flash_sdp_enabled() and cuda.math_sdp_enabled()  # no lever: nothing chosen
    with stack.sdpa_choice(["cudnn-attention", "fused-qkv"]):
        assert cuda.cudnn_sdp_enabled() and not cuda.flash_sdp_enabled() and not cuda.math_sdp_enabled()
    assert cuda.flash_sdp_enabled() and cuda.math_sdp_enabled()  # restored
