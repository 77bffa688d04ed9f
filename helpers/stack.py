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

from helpers import compile_tools, measure
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

# Looser parity band for dynamic int8 (torchao): weights and activations rounded to 255 levels per row/token give a
# relative error of ~1e-2 per matmul; 0.1 relative L2 on the denoiser output allows that through every block, and
# still fails a stage whose scales are wrong (errors of order 1).
INT8_TOLERANCE = 0.1
# fp8 e4m3 (torchao's row-wise dynamic recipe) keeps 3 mantissa bits, coarser than int8 for values inside the row's
# range: the same 0.1 band is applied and the measured drift is printed beside it.
FP8_TOLERANCE = 0.1


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
        problems.append(f"{stage.name}: {stage.recompiles} graph(s) compiled after the first image")
    if fullgraph and stage.graph_breaks != 0:
        problems.append(f"{stage.name}: {stage.graph_breaks} graph break(s) with fullgraph=True")
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


def skip_reason(lever: str, model: str, device: torch.device) -> str:
    """Why a lever cannot run for this model on this device ('' when it can)."""
    cuda = device.type == "cuda"
    if lever == "cudnn-attention":
        if model == "sdxl":
            return ("SDXL's UNet attention processors call SDPA directly, not diffusers' attention dispatcher, so "
                    "set_attention_backend does not reach them")
        if not cuda:
            return "SDPA's cuDNN attention backend needs a CUDA GPU"
    if lever == "fp8":
        if not cuda:
            return "torchao's fp8 matmuls (torch._scaled_mm) need a CUDA GPU of compute capability 8.9 or newer"
        if torch.cuda.get_device_capability(device) < (8, 9):
            return (f"fp8 matmuls need compute capability 8.9 or newer (Ada, Hopper); this GPU is "
                    f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}")
    return ""


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

    def skip(self, name: str, lever: str, reason: str) -> None:
        """Record a stage the hardware or the model cannot run, with the reason."""
        self.skipped[name] = reason
        self.order.append(name)
        self.writer.record(f"stack: {name}", status="skipped", reason=reason, lever=lever)

    def table(self, brief: bool = False) -> pd.DataFrame:
        """One line per stage, measured or skipped, in order, with units in the column names; brief=True keeps the
        columns a reader needs first (image, step, first image, drift and its band, graphs, breaks, recompiles) and
        leaves the skipped stages out (the ladder prints why each was skipped)."""
        base = self.stages[0] if self.stages else None
        lines: dict[str, dict[str, Any]] = {}
        for s in self.stages:
            if brief:
                lines[s.name] = {"image (s)": s.image.median_s, "step (ms)": s.step.median_s * 1e3,
                                 "first image incl. compile (s)": s.first_image_s,
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
                "compile cache hits at first image (count)": s.cache_hits, "peak memory (GiB)": s.memory.peak_gib,
                "step drift vs eager (rel. L2)": s.step_drift, "image drift vs eager (rel. L2)": s.image_drift,
                "graphs at first image (count)": s.graphs, "graph breaks (count)": s.graph_breaks,
                "recompiles after (count)": s.recompiles}
        for name, reason in self.skipped.items():
            if not brief:
                lines[name] = {"lever": f"skipped: {reason}"}
        return pd.DataFrame({name: lines[name] for name in self.order if name in lines}).T
