"""Measure one stage of a stack of speed levers (notebook 12): first image, steady step and image, memory, drift."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch._inductor.config

from helpers import attention_backends, compile_tools, measure, pipelines, quality, report, text, workloads
from helpers.params import Run
from helpers.results import ResultWriter
from helpers.workloads import first_output

# Two notices a bf16 or 8-bit stage prints that say nothing about the stage (only these texts are dropped):
# - diffusers' VAE upsampler asks `is_torch_version` (an lru_cache-wrapped function) for bf16 inputs; dynamo traces
#   the wrapped function instead of the cache and says so, once per call site;
# - AOTAutograd's cache asks torchao's Int8Tensor for a stable hash it does not implement, so the cache keys of a
#   quantized stage are computed another way (the stage compiles and runs the same).
warnings.filterwarnings("ignore", message=r"Dynamo detected a call to a `functools.lru_cache`-wrapped function")
warnings.filterwarnings("ignore", message=r"Int8Tensor does not implement _stable_hash_for_caching")

# The levers of notebook 12 in the order they are stacked; int8 and fp8 are alternatives (fp8 replaces int8).
LEVERS: tuple[str, ...] = ("cudnn-attention", "channels-last", "compile", "inductor-flags", "fused-qkv",
                           "max-autotune", "vae-compile", "int8", "fp8", "aoti")
QUANTIZATIONS: tuple[str, ...] = ("int8", "fp8")
COMPILES: tuple[str, ...] = ("compile", "max-autotune")  # the last one stacked sets the denoiser's compile mode

# The four inductor flags the diffusers docs, diffusion-fast and flux-fast set (global: every later compile uses them),
# and inductor's values at import, before any notebook cell changed them (torchao's configs also switch on
# coordinate_descent_tuning and force_fuse_int_mm_with_mul, globally).
INDUCTOR_FLAGS: dict[str, bool] = {"conv_1x1_as_mm": True, "coordinate_descent_tuning": True,
                                   "epilogue_fusion": False, "coordinate_descent_check_all_directions": True}
INDUCTOR_DEFAULTS: dict[str, Any] = {flag: getattr(torch._inductor.config, flag)
                                     for flag in (*INDUCTOR_FLAGS, "force_fuse_int_mm_with_mul")}

# Looser parity band for dynamic int8 (torchao): weights and activations rounded to 255 levels per row/token give a
# relative error of ~1e-2 per matmul; 0.1 relative L2 on the denoiser output allows that through every block, and
# still fails a stage whose scales are wrong (errors of order 1).
INT8_TOLERANCE = 0.1
# fp8 e4m3 (torchao's row-wise dynamic recipe) keeps 3 mantissa bits: each weight and activation is rounded to within
# 1/16 of itself, several times int8's error for values inside the row's range, so the band is three times int8's;
# it still fails a stage whose scales are wrong. The trained smoke Flux drifts 0.15 in one step (torchao's fp8
# kernels run on the CPU with its hardware check lifted: tests/test_stack.py), above int8's 0.1, with every digit
# still read (15's fp8 images on an H100); weights a fifth too large, as a wrong scale makes them, drift about 1.
FP8_TOLERANCE = 0.3


def reproduce_tolerance(dtype_tolerance: float, quantized_band: float, quantized: bool) -> float:
    """Band for an ahead-of-time package against its JIT-compiled stage: the dtype's compile tolerance, or with 8-bit
    weights the quantization's own band (dynamic quantization rounds every activation to 255 levels, so two
    compilers that order the scale's arithmetic differently can differ by up to the order of the quantization
    error)."""
    return quantized_band if quantized else dtype_tolerance


@dataclass
class Stage:
    """What one stage of the stack measured: first image (compile included), steady step and image, memory, drift."""

    name: str
    lever: str
    first_image_s: float
    step: measure.Timing
    image: measure.Timing
    memory: measure.Memory
    graphs: int
    graph_breaks: int
    recompiles: int
    step_drift: float
    image_drift: float
    tolerance: float
    finite: bool
    cache_hits: int = 0  # inductor cache hits at the first image (the cache is used as found)
    step_out: torch.Tensor = field(repr=False, default_factory=lambda: torch.empty(0))
    extra: dict[str, Any] = field(default_factory=dict)


def stage_problems(stage: Stage, *, fullgraph: bool) -> list[str]:
    """What is wrong with a measured stage: drift beyond its band, non-finite output, recompiles, graph breaks."""
    problems = []
    if not stage.finite:
        problems.append(f"{stage.name}: the denoiser output has non-finite values")
    if not math.isfinite(stage.step_drift) or stage.step_drift > stage.tolerance:
        problems.append(f"{stage.name}: denoiser output differs from eager by {stage.step_drift:.2e} "
                        f"> {stage.tolerance:g}")
    if stage.recompiles != 0:
        problems.append(f"{stage.name}: {text.count(stage.recompiles, 'graph')} compiled after the first image")
    if fullgraph and stage.graph_breaks != 0:
        problems.append(f"{stage.name}: {text.count(stage.graph_breaks, 'graph break')} with fullgraph=True")
    return problems


def quantization_problem(lever: str, quantized: int, linears: int) -> str:
    """'' when a quantization lever swapped every Linear weight of the denoiser (int8) or at least one (fp8, whose
    recipe skips layers the fp8 kernels cannot take); for other levers, '' when none was swapped."""
    if lever == "int8" and not quantized == linears > 0:
        return f"int8: {quantized} of {linears} Linear layers hold quantized weights (all expected)"
    if lever == "fp8" and quantized == 0:
        return f"fp8: none of {linears} Linear layers holds quantized weights"
    if lever not in QUANTIZATIONS and quantized:
        return f"{lever}: {quantized} of {linears} Linear layers hold quantized weights, without a quantization lever"
    return ""


def _is_subclass(tensor: torch.Tensor) -> bool:
    """A tensor subclass such as torchao's quantized weights (not a plain tensor or parameter)."""
    return type(tensor) not in (torch.Tensor, torch.nn.Parameter)


def quantized_tensors(exported: torch.export.ExportedProgram) -> int:
    """Tensor subclasses (torchao's quantized weights) among an exported program's parameters and constants."""
    values = list(exported.state_dict.values()) + list(exported.constants.values())
    return sum(_is_subclass(v) for v in values)


def quantized_linears(module: torch.nn.Module) -> tuple[int, int]:
    """(Linear layers whose weight is a tensor subclass, e.g. torchao's quantized weights; all Linear layers)."""
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    quantized = [m for m in linears if _is_subclass(m.weight)]
    return len(quantized), len(linears)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Inside the block, diffusers' and transformers' loading progress bars are off (a pipeline rebuilt for every
    stage from a folder would print three bars each time); each is restored as it was."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    states = [(m, m.is_progress_bar_enabled()) for m in (diffusers_logging, transformers_logging)]
    for module, _ in states:
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module, was_on in states:
            if was_on:
                module.enable_progress_bar()


def cuda_graphs_reason(device: torch.device) -> str:
    """Why a CUDA graph cannot be captured on device ('' on a CUDA GPU)."""
    return "" if device.type == "cuda" else "CUDA graphs record and replay GPU kernels, so they need a CUDA GPU"


def cold_compile(call: Callable[[], Any], device: torch.device, reference: torch.Tensor, *, repeats: int,
                 warmup: int) -> tuple[dict[str, Any], measure.Timing, compile_tools.CompileCounts, int]:
    """Compile call's module from an empty inductor cache at its first call, then time its steady step with
    recompiling an error: (table line with units, steady timing, counts of the first call, graphs compiled later)."""
    with compile_tools.fresh_cache(), compile_tools.counting() as first:
        compile_s, out = measure.first_call_seconds(call, device)
    error = compile_tools.relative_error(first_output(out), reference)
    with compile_tools.counting() as later, compile_tools.error_on_recompile():
        timed = measure.time_callable(call, device, repeats=repeats, warmup=warmup)
    line = {"first call incl. compile (s)": compile_s, "graphs (count)": first.graphs,
            "graph breaks (count)": first.graph_breaks, "cache hits (count)": first.cache_hits,
            "rel. L2 vs eager (ratio)": error, "step (ms)": timed.median_s * 1e3}
    return line, timed, first, later.graphs


def fp8_refusal() -> str:
    """torchao's own refusal of its row-wise fp8 recipe on this machine, as it words it ('' when it accepts): its
    config checks the hardware (CUDA compute capability 8.9+, MI300+ or XPU) before quantizing any weight."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    probe = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False, dtype=torch.bfloat16))
    try:  # set_inductor_config=False: the probe leaves inductor's global flags as they are (torchao's default sets
        # coordinate descent tuning for every later compile of the process, before its hardware check refuses)
        quantize_(probe, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False))
    except AssertionError as err:
        return f"torchao refuses its fp8 recipe here: '{err}'"
    return ""


def sdpa_choice(levers: list[str]) -> contextlib.AbstractContextManager[Any]:
    """The SDPA kernel the levers choose, for AOTInductor's compile: torch.export keeps the attention op but not the
    kernel diffusers' cuDNN backend picks at call time, so the package would use the default one."""
    if "cudnn-attention" not in levers:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)


def aoti_refusal() -> str:
    """Why AOTInductor cannot build a package here ('' when it can): the package is C++ that inductor compiles with
    the compiler its config names (g++ unless CXX or inductor's cpp.cxx says otherwise)."""
    from torch._inductor import cpp_builder, exc

    try:
        cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler as err:
        return f"AOTInductor compiles its package's C++ and finds no C++ compiler here ({str(err).splitlines()[0]})"
    return ""


def skip_reason(lever: str, model: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """Why a lever cannot run for this model on this device, in this dtype where given ('' when it can)."""
    cuda, dtype_name = device.type == "cuda", str(dtype).removeprefix("torch.")
    if lever == "aoti":
        return aoti_refusal()
    if lever == "cudnn-attention":
        if model == "sdxl":
            return ("SDXL's UNet attention processors call SDPA directly, not diffusers' attention dispatcher, so "
                    "set_attention_backend does not reach them")
        if not cuda:
            return "SDPA's cuDNN attention backend needs a CUDA GPU"
        if dtype is not None and dtype not in (torch.bfloat16, torch.float16):
            return f"SDPA's cuDNN attention takes bf16 or fp16 inputs only; this run is {dtype_name}"
    if lever == "fp8":
        refused = fp8_refusal()
        if refused or not cuda:  # torchao's own refusal names the compute capability it needs
            return refused or ("torchao's fp8 recipe runs on CUDA (or XPU) here, not on this device (fp8 matmuls "
                               "need compute capability 8.9 or newer: Ada, Hopper)")
        if torch.cuda.get_device_capability(device) < (8, 9):
            return (f"fp8 matmuls need compute capability 8.9 or newer (Ada, Hopper); this GPU is "
                    f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}")
        if dtype is not None and dtype != torch.bfloat16:
            return f"torchao's row-wise fp8 takes bf16 weights only; this run is {dtype_name}"
    return ""


def restore_inductor_defaults() -> None:
    """Put inductor's global flags (the four of INDUCTOR_FLAGS and torchao's int8 fusion flag) back to their defaults."""
    for flag, value in INDUCTOR_DEFAULTS.items():
        setattr(torch._inductor.config, flag, value)


def compile_mode(lever: str, scope: str) -> str:
    """The denoiser's torch.compile mode for a compile lever: 'max-autotune' compiles the whole denoiser with CUDA
    graphs, its blocks alone without them ('max-autotune-no-cudagraphs'); else 'default'."""
    # Every repeated block calls one compiled function, and CUDA graph trees take each call for a new step, so a
    # block's replay overwrites the output the next block still reads (torch 2.11 on an H100, notebook 12, 2026-11-28)
    if lever not in COMPILES:
        raise ValueError(f"lever {lever!r} is not a compile lever; allowed: {COMPILES}")
    if scope not in ("full", "regional"):
        raise ValueError(f"scope={scope!r}: 'full' or 'regional'")
    if lever != "max-autotune":
        return "default"
    return "max-autotune" if scope == "full" else "max-autotune-no-cudagraphs"


def apply_lever(pipe: Any, lever: str, *, scope: str, vae_mode: str) -> None:
    """Apply one lever of LEVERS (not 'aoti') to pipe in place, with the calls notebook 12's whole-stack cell shows;
    scope 'full' compiles the whole denoiser, 'regional' its repeated blocks."""
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        PerRow,
        quantize_,
    )

    net = pipelines.denoiser(pipe)
    if lever == "cudnn-attention":
        attention_backends.set_model_backend(net, "_native_cudnn")  # the model's layers only, not the process
    elif lever == "channels-last":
        pipe.vae.to(memory_format=torch.channels_last)
        if hasattr(pipe, "unet"):
            pipe.unet.to(memory_format=torch.channels_last)
    elif lever == "inductor-flags":
        for flag, value in INDUCTOR_FLAGS.items():
            setattr(torch._inductor.config, flag, value)
    elif lever == "fused-qkv":
        net.fuse_qkv_projections()
        pipe.vae.fuse_qkv_projections()
    elif lever in COMPILES:
        mode = compile_mode(lever, scope)
        if scope == "full":
            net.compile(fullgraph=True, mode=mode)
        else:
            net.compile_repeated_blocks(fullgraph=True, mode=mode)
    elif lever == "vae-compile":
        pipe.vae.decode = torch.compile(pipe.vae.decode, mode=vae_mode, fullgraph=True)
    elif lever == "int8":
        quantize_(net, Int8DynamicActivationInt8WeightConfig())
    elif lever == "fp8":
        quantize_(net, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
    else:
        raise ValueError(f"lever {lever!r} is not applied to a pipeline; allowed: {LEVERS[:-1]}")


def build(run: Run, levers: list[str], *, scope: str, vae_mode: str) -> Any:
    """A fresh pipeline of the run (the load of notebook 12's section 1, without its progress bars) with the levers
    applied: the model changes first, the denoiser's compile last (the last compile lever stacked wins)."""
    with quiet_loading():
        pipe = pipelines.build_pipeline(run.model, run.profile, weights=run.weights, dtype=run.dtype,
                                        device=run.device, seed=run.seed)
    pipe.set_progress_bar_config(disable=True)  # every stage calls the pipeline many times
    for lever in levers:
        if lever not in COMPILES:
            apply_lever(pipe, lever, scope=scope, vae_mode=vae_mode)
    compiles = [lever for lever in levers if lever in COMPILES]
    if compiles:
        apply_lever(pipe, compiles[-1], scope=scope, vae_mode=vae_mode)
    return pipe


def band(levers: list[str], tolerance: float) -> float:
    """The drift band of a stage: the 8-bit quantization's own where it holds one, else the dtype's tolerance."""
    return INT8_TOLERANCE if "int8" in levers else FP8_TOLERANCE if "fp8" in levers else tolerance


def draw_digits(pipe: Any, run: Run) -> list[Any]:
    """One image per digit 0-9 at the run's workload (the shapes a stage compiled for), same seed each."""
    return [pipe(**workloads.pipeline_kwargs(run) | {"prompt": quality.prompt(d)}).images[0] for d in range(10)]


def call_args(inputs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The denoiser's inputs as the pipeline passes them: SDXL's sample and timestep by position, the rest by name."""
    positional = [k for k in ("sample", "timestep") if "sample" in inputs]
    return tuple(inputs[k] for k in positional), {k: v for k, v in inputs.items() if k not in positional}


def cuda_graphed(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
    """Capture one call of fn in a CUDA graph (as flux-fast does around its AOTInductor package); each later call
    copies its inputs into the captured ones, replays the graph and clones the outputs out (a CUDA graph holds
    fixed memory addresses)."""
    static_args, static_kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
    fn(*static_args, **static_kwargs)  # warm-up: lazy initialisation must not happen inside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static_args, **static_kwargs)

    def replay(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        pairs = list(zip(static_args, args)) + [(static_kwargs[k], v) for k, v in kwargs.items()]
        for old, new in pairs:
            for a, b in zip(torch.utils._pytree.tree_leaves(old), torch.utils._pytree.tree_leaves(new)):
                if isinstance(a, torch.Tensor):
                    a.copy_(b)
        graph.replay()
        return [o.clone() for o in out]
    return replay


def published_lines(stages: dict[str, Stage], run: Run, hardware: str) -> list[str]:
    """One line per published comparison of notebook 12: this run's image speedup or seconds of the stage the
    recipe is compared with, beside the published figure (off the full profile, no value: a tiny model)."""
    def image_s(scenario: str) -> float | None:
        st = stages.get(scenario.removeprefix("stack: "))
        return None if st is None else st.image.median_s

    comps, lines = report.comparisons(), []
    for c in comps[comps["notebook"] == run.notebook].itertuples():
        if c.model != run.model and run.profile == "full":
            continue  # a figure published for the other model
        ours = c.model == run.model  # off the full profile the other model's figure is shown, without a value
        m = image_s(c.measured_scenario) if ours else None
        base = image_s(c.measured_base_scenario) if ours and c.measured_base_scenario else None
        value = m if c.kind == "absolute" else None if m is None or base is None else (
            base / m if c.kind == "speedup" else m / base)  # a factor's scenarios stand the other way round
        lines.append(report.published_line(c.id, value, hardware, run.profile))
    return lines


class Ladder:
    """The stages measured so far on one pipeline, each compared with the eager references of stage one."""

    def __init__(self, writer: ResultWriter, device: torch.device, *, repeats: int, warmup: int) -> None:
        """Record rows through writer; time repeats calls after warmup ones on device."""
        self.writer, self.device, self.repeats, self.warmup = writer, device, repeats, warmup
        self.stages: list[Stage] = []
        self.skipped: dict[str, str] = {}
        self.order: list[str] = []
        self.step_ref: torch.Tensor | None = None
        self.image_ref: torch.Tensor | None = None

    def measure(self, name: str, lever: str, *, step_call: Callable[[], Any], image_call: Callable[[], Any],
                image_tensor_call: Callable[[], torch.Tensor], tolerance: float, **extra: Any) -> Stage:
        """Measure a stage: its first image (compiles happen here), then, with recompiling an error, the steady
        step and image, peak memory of an image, and drift of the step output and the image from stage one's."""
        with compile_tools.counting() as first:
            first_s, _ = measure.first_call_seconds(image_call, self.device)
        with compile_tools.counting() as later, compile_tools.error_on_recompile():
            step_out = first_output(step_call()).clone()
            image_out = image_tensor_call().clone()
            timed = measure.time_interleaved({"step": step_call, "image": image_call}, self.device,
                                             repeats=self.repeats, warmup=self.warmup)
            memory, _ = measure.peak_memory(image_call, self.device)
        if self.step_ref is None:
            self.step_ref, self.image_ref = step_out, image_out
        stage = Stage(name=name, lever=lever, first_image_s=first_s, step=timed["step"], image=timed["image"],
                      memory=memory, graphs=first.graphs, graph_breaks=first.graph_breaks,
                      recompiles=later.graphs, step_drift=compile_tools.relative_error(step_out, self.step_ref),
                      image_drift=compile_tools.relative_error(image_out, self.image_ref), tolerance=tolerance,
                      finite=bool(torch.isfinite(step_out).all()), cache_hits=first.cache_hits, step_out=step_out,
                      extra=extra)
        self.stages.append(stage)
        self.order.append(name)
        base = self.stages[0]
        self.writer.record(f"stack: {name}", timing=stage.image, memory=memory, lever=lever,
                           first_image_s=first_s, step_latency_median_s=stage.step.median_s,
                           step_samples_s=stage.step.samples_s, graphs_first_image=first.graphs,
                           graph_breaks=first.graph_breaks, recompiles=later.graphs,
                           cache_hits_first_image=first.cache_hits, step_drift=stage.step_drift,
                           image_drift=stage.image_drift, tolerance=tolerance, finite=stage.finite,
                           speedup=base.image.median_s / stage.image.median_s,
                           step_speedup=base.step.median_s / stage.step.median_s, **extra)
        return stage

    def measure_pipeline(self, name: str, lever: str, pipe: Any, run: Run, inputs: dict[str, Any], tolerance: float,
                         **extra: Any) -> Stage:
        """measure() for a whole pipeline at the run's workload: its denoiser step on inputs, its image."""
        return self.measure(name, lever, step_call=workloads.denoiser_call(pipe, inputs),
                            image_call=workloads.pipeline_call(pipe, run),
                            image_tensor_call=lambda: workloads.pipeline_call(pipe, run, output_type="pt")()[0],
                            tolerance=tolerance, **extra)

    def skip(self, name: str, lever: str, reason: str, status: str = "skipped") -> None:
        """Record a stage the hardware or the model cannot run (or that failed: status='failed'), with the reason."""
        self.skipped[name] = reason
        self.order.append(name)
        self.writer.record(f"stack: {name}", status=status, reason=reason, lever=lever)

    def table(self, brief: bool = False) -> pd.DataFrame:
        """One line per stage, measured or skipped, in order, with units in the column names; brief=True keeps the
        columns a reader needs first (image, step, first image, drift and its band, graphs, breaks, recompiles) and
        leaves the skipped stages out (the ladder prints why each was skipped)."""
        base = self.stages[0] if self.stages else None
        small = all(s.memory.peak_bytes < 2**30 for s in self.stages)  # the smoke model's peaks read as 0.003 GiB
        unit, scale = ("MiB", 2**20) if small else ("GiB", 2**30)
        lines: dict[str, dict[str, Any]] = {}
        for s in self.stages:
            if brief:
                lines[s.name] = {"image (s)": s.image.median_s, "step (ms)": s.step.median_s * 1e3,
                                 "first image incl. compile, cache as found (s)": s.first_image_s,
                                 "step drift vs eager (rel. L2)": s.step_drift, "band (rel. L2)": s.tolerance,
                                 "graphs at first image (count)": s.graphs, "graph breaks (count)": s.graph_breaks,
                                 "recompiles after (count)": s.recompiles}
                continue
            lines[s.name] = {
                "lever": s.lever, "image (s)": s.image.median_s, "image spread max-min (s)": s.image.spread_s,
                "step (ms)": s.step.median_s * 1e3, "step spread max-min (ms)": s.step.spread_s * 1e3,
                "image speedup vs eager (x)": base.image.median_s / s.image.median_s if base else math.nan,
                "step speedup vs eager (x)": base.step.median_s / s.step.median_s if base else math.nan,
                "first image incl. compile, inductor cache as found (s)": s.first_image_s,
                "compile cache hits at first image (count)": s.cache_hits,
                f"peak memory ({unit})": s.memory.peak_bytes / scale,
                "step drift vs eager (rel. L2)": s.step_drift, "image drift vs eager (rel. L2)": s.image_drift,
                "graphs at first image (count)": s.graphs, "graph breaks (count)": s.graph_breaks,
                "recompiles after (count)": s.recompiles}
        for name, reason in self.skipped.items():
            if not brief:
                lines[name] = {"lever": f"skipped: {reason}"}
        return pd.DataFrame({name: lines[name] for name in self.order if name in lines}).T
