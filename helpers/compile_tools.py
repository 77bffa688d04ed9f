"""Count what torch.compile does (graphs, recompiles, graph breaks, traced ops) and set the knobs it is checked with."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
import torch._inductor.utils
import torch.fx.experimental._config
from torch._dynamo.utils import counters

from helpers import text

COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
# Modes that capture CUDA graphs on a CUDA device (inductor's option triton.cudagraphs); elsewhere they run without.
CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
# Raised when a function needs more compiled versions than `recompile_limit` allows.
RecompileLimitHit = torch._dynamo.exc.FailOnRecompileLimitHit


@dataclass
class CompileCounts:
    """What dynamo did inside a `counting()` block: graphs compiled, ops traced, and graph breaks with their reasons.

    Breaks are read from both of dynamo's counter keys: most land under `graph_break`, but torch 2.13 files some
    only under `unimplemented`: a Python `if` on a tensor value, and a break inside a frame dynamo then gives up
    on (a break in a loop or a try block), which can be counted there twice (its reason and "graph break in
    loop"); `unimplemented` holds that key's share.
    cache_hits / cache_misses add up inductor's FX-graph cache and AOTAutograd's cache lookups: a cold compile
    has hits == 0. cudagraph_skips counts graphs of a CUDA-graph mode that inductor ran without capturing a CUDA
    graph (on a CPU, every one; on a GPU, those with a CPU tensor, a mutated input or a dynamic shape)."""

    graphs: int = 0
    frames: int = 0
    graph_breaks: int = 0
    break_reasons: dict[str, int] = field(default_factory=dict)
    ops_captured: int = 0
    unimplemented: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cudagraph_skips: int = 0

    @property
    def recompiles(self) -> int:
        """Graphs compiled in the block: after a warm first call, every new graph is a recompile."""
        return self.graphs


def _snapshot() -> tuple[int, int, dict[str, int], dict[str, int], int, int, int, int]:
    """Current totals of compiled graphs, compiled frames, breaks by reason (both keys), traced ops, cache hits/misses,
    CUDA-graph skips."""
    stats, inductor, aot = counters["stats"], counters["inductor"], counters["aot_autograd"]
    hits = inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"]
    misses = inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"]
    return (stats["unique_graphs"], counters["frames"]["ok"], dict(counters["graph_break"]),
            dict(counters["unimplemented"]), stats["calls_captured"], hits, misses, inductor["cudagraph_skips"])


def _new(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counts added between two snapshots of one counter key, by the first line of the reason."""
    added: dict[str, int] = {}
    for key, n in after.items():
        if n - before.get(key, 0) > 0:
            reason = key.split("\n")[0].strip()
            added[reason] = added.get(reason, 0) + n - before.get(key, 0)
    return added


@contextlib.contextmanager
def counting() -> Iterator[CompileCounts]:
    """Count graphs compiled, ops traced and graph breaks hit inside the block (filled in on exit)."""
    result = CompileCounts()
    graphs0, frames0, breaks0, unimpl0, ops0, hits0, misses0, skips0 = _snapshot()
    try:
        yield result
    finally:
        graphs1, frames1, breaks1, unimpl1, ops1, hits1, misses1, skips1 = _snapshot()
        result.graphs, result.frames, result.ops_captured = graphs1 - graphs0, frames1 - frames0, ops1 - ops0
        result.cache_hits, result.cache_misses = hits1 - hits0, misses1 - misses0
        result.cudagraph_skips = skips1 - skips0
        unimplemented = _new(unimpl0, unimpl1)
        result.break_reasons = _new(breaks0, breaks1)
        for reason, n in unimplemented.items():
            result.break_reasons[reason] = result.break_reasons.get(reason, 0) + n
        result.unimplemented = sum(unimplemented.values())
        result.graph_breaks = sum(result.break_reasons.values())


def reset() -> None:
    """Forget every compiled graph and zero the counters, so the next call compiles from scratch."""
    torch._dynamo.reset()
    counters.clear()


@contextlib.contextmanager
def fresh_cache() -> Iterator[None]:
    """Compile inside the block against a new, empty inductor (and triton) cache, deleted on exit: a cold compile."""
    with torch._inductor.utils.fresh_cache():
        yield


@contextlib.contextmanager
def error_on_recompile() -> Iterator[None]:
    """Make any recompile inside the block raise, the check diffusers' own compile tests use."""
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield


@contextlib.contextmanager
def recompile_limit(limit: int) -> Iterator[None]:
    """Allow at most `limit` compiled versions per function and raise beyond it (diffusers' regional-compile check)."""
    with torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True):
        yield


@contextlib.contextmanager
def precision_casts(emulate: bool) -> Iterator[None]:
    """Whether inductor rounds every intermediate to bf16/fp16 as eager does (True) or keeps fp32 inside fusions."""
    with torch._inductor.config.patch(emulate_precision_casts=emulate):
        yield


@contextlib.contextmanager
def no_duck_shapes() -> Iterator[None]:
    """Give every dynamic dimension its own symbol even when sizes coincide (use_duck_shape=False), then restore."""
    old = torch.fx.experimental._config.use_duck_shape
    torch.fx.experimental._config.use_duck_shape = False
    try:
        yield
    finally:
        torch.fx.experimental._config.use_duck_shape = old


def mark_dynamic(inputs: dict[str, Any], dims: dict[str, int]) -> dict[str, Any]:
    """Mark dimension dims[name] of each named input tensor as dynamic for dynamo; returns inputs."""
    for name, dim in dims.items():
        torch._dynamo.mark_dynamic(inputs[name], dim)
    return inputs


def mode_options(mode: str) -> dict[str, Any]:
    """The inductor options a compile mode sets (torch._inductor.list_mode_options): 'default' sets none."""
    import torch._inductor

    return dict(torch._inductor.list_mode_options(mode))


def cuda_graph_twin(mode: str, options: dict[str, dict[str, Any]] | None = None) -> str:
    """The mode that sets the same inductor options as `mode` except CUDA graphs ('' if mode captures none).

    On a device without CUDA graphs a CUDA-graph mode runs, captures no graph, and so compiles what its twin does:
    reduce-overhead -> default, max-autotune -> max-autotune-no-cudagraphs (torch 2.13). `options` (mode -> its
    options) defaults to torch's own table."""
    table = options if options is not None else {m: mode_options(m) for m in COMPILE_MODES}
    if not table[mode].get("triton.cudagraphs"):
        return ""
    rest = {k: v for k, v in table[mode].items() if k != "triton.cudagraphs"}
    twins = [m for m in COMPILE_MODES if m != mode and not table[m].get("triton.cudagraphs") and table[m] == rest]
    return twins[0] if twins else ""


def mode_skip_reason(mode: str, device: torch.device, modes: list[str]) -> str:
    """Why measuring `mode` on device would repeat another measured mode ('' when it must be measured).

    A CUDA-graph mode is skipped only off CUDA and only when its twin without CUDA graphs is in `modes`: there it
    runs the same compiled code (inductor skips CUDA graphs for graphs on a CPU device)."""
    twin = cuda_graph_twin(mode)
    if device.type == "cuda" or not twin or twin not in modes:
        return ""
    return (f"on {device.type}, mode {mode!r} runs but captures no CUDA graph (CUDA graphs exist only on CUDA "
            f"devices); apart from CUDA graphs it sets the same inductor options as {twin!r}, which this run "
            f"measures, so it would compile the same code: not measured twice")


def cold_compile_problem(first: CompileCounts) -> str:
    """What is wrong with a first call that should have compiled one whole graph cold ('' when nothing is).

    Cold: inductor's caches were looked up and nothing hit. Whole: at least one graph, no graph break."""
    if first.graphs < 1:
        return f"the first call compiled no graph (it did not compile: {first})"
    if first.graph_breaks:
        return f"{text.count(first.graph_breaks, 'graph break')} {first.break_reasons}: not one full graph"
    if first.cache_hits or first.cache_misses < 1:
        return (f"the first call was not cold: {text.count(first.cache_hits, 'cache hit')}, "
                f"{text.count(first.cache_misses, 'miss', 'misses')}")
    return ""


def share_word(share: float) -> str:
    """Words for a part's share of a whole: 'almost all' (>= 90%), 'most' (>= 50%), 'less than half'."""
    if share >= 0.9:
        return "almost all"
    return "most" if share >= 0.5 else "less than half"


def speed_word(ratio: float, *, same_within: float = 0.05) -> str:
    """'faster', 'slower' or 'about as fast' for a speedup (old time / new time), with a band for noise."""
    if ratio > 1 + same_within:
        return "faster"
    if ratio < 1 / (1 + same_within):
        return "slower"
    return "about as fast"


def speed_phrase(ratio: float, other: str, *, same_within: float = 0.05) -> str:
    """'faster than <other>', 'slower than <other>' or 'about as fast as <other>' for a speedup over other."""
    word = speed_word(ratio, same_within=same_within)
    return f"{word} {'as' if word == 'about as fast' else 'than'} {other}"


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error ||out - ref|| / ||ref||, computed in fp32."""
    out, ref = out.detach().float(), ref.detach().float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# Parity tolerance (relative L2) of a compiled denoiser against eager in the same dtype: a few units of the
# dtype's rounding error accumulated over the blocks (bf16 eps 7.8e-3, fp16 eps 9.8e-4).
PARITY_TOLERANCE: dict[str, float] = {"bf16": 3e-2, "fp16": 5e-3, "fp32": 1e-4}


def compiled_state(net: torch.nn.Module) -> dict[torch.nn.Module, Any]:
    """The compiled wrappers `Module.compile()` put on net and its submodules (module -> wrapper): full compile,
    regional compile (one per block), or none (eager)."""
    return {m: m._compiled_call_impl for m in net.modules() if getattr(m, "_compiled_call_impl", None) is not None}


def set_compiled_state(net: torch.nn.Module, state: dict[torch.nn.Module, Any]) -> None:
    """Make net run as recorded by compiled_state (an empty state: eager), without compiling anything."""
    for m in net.modules():
        m._compiled_call_impl = state.get(m)


def uncompile(module: torch.nn.Module) -> torch.nn.Module:
    """Undo `compile()` on module and its submodules (full or regional), so the next compile starts from eager."""
    for m in module.modules():
        m._compiled_call_impl = None
    return module


# --- One compile of a denoiser, measured (notebook 03): first call, parity, the pipeline's first call, steady ---

# The four calls timed in turn, round by round: eager and compiled, one denoiser step and one whole image.
STEADY_CALLS: tuple[str, ...] = ("eager step", "compiled step", "eager pipeline", "compiled pipeline")


def run_as(name: str) -> None:
    """Before a timed call named 'eager ...': run compiled modules eagerly (their compiled code kept, nothing
    compiles); before any other: run them compiled. torch.compiler.set_stance, public since torch 2.6."""
    torch.compiler.set_stance("force_eager" if name.startswith("eager") else "default")


@dataclass
class CompiledRun:
    """One compile of a denoiser, measured: the cold first call (seconds, what dynamo and inductor did), its output
    against eager, the pipeline's own first call after it, and the eager and compiled steady calls timed in turn
    (STEADY_CALLS -> measure.Timing) with what compiled while they ran."""

    mode: str
    emulate_precision_casts: bool
    compile_s: float
    first: CompileCounts
    rel_error: float
    finite: bool
    pipe_first: CompileCounts
    later: CompileCounts
    timed: dict[str, Any]

    def speedup(self, what: str) -> float:
        """Eager median over compiled median of 'step' or 'pipeline', both from the same rounds."""
        return self.timed[f"eager {what}"].median_s / self.timed[f"compiled {what}"].median_s

    def step_share(self, steps: int) -> float:
        """The eager pipeline's share spent in its `steps` denoiser steps (eager step x steps, at most 1)."""
        return min(1.0, steps * self.timed["eager step"].median_s / self.timed["eager pipeline"].median_s)

    def amdahl(self, steps: int) -> float:
        """Amdahl's law: the pipeline speedup expected when only the steps' share gets the step's speedup."""
        p = self.step_share(steps)
        return 1 / ((1 - p) + p / self.speedup("step"))

    def payback_images(self) -> float:
        """Images after which the compile has paid for itself: (first call - one compiled step) over the time a
        compiled image saves; inf when it saves none."""
        saved = self.timed["eager pipeline"].median_s - self.timed["compiled pipeline"].median_s
        cost = self.compile_s - self.timed["compiled step"].median_s
        return cost / saved if saved > 0 else float("inf")

    def record(self, rows: Any, label: str, *, tolerance: float, flops: int, peak_tflops: float) -> None:
        """Write the rows 'denoiser step compiled (<label>)' and 'pipeline compiled (<label>)' (a ResultWriter)."""
        from helpers import measure

        step, eager_step = self.timed["compiled step"], self.timed["eager step"]
        whole, eager_whole = self.timed["compiled pipeline"], self.timed["eager pipeline"]
        f = self.first
        rows.record(f"denoiser step compiled ({label})", timing=step, compile_s=self.compile_s,
                    recompiles=self.later.graphs, graph_breaks=f.graph_breaks, mode=self.mode,
                    graphs_first_call=f.graphs, cache_hits_first_call=f.cache_hits,
                    cache_misses_first_call=f.cache_misses, cudagraph_skips_first_call=f.cudagraph_skips,
                    rel_error=self.rel_error, finite=self.finite, tolerance=tolerance,
                    emulate_precision_casts=self.emulate_precision_casts, eager_samples_s=eager_step.samples_s,
                    eager_latency_median_s=eager_step.median_s, speedup=self.speedup("step"),
                    flops_per_step=flops,
                    fraction_of_peak=measure.fraction_of_peak(flops, step.median_s, peak_tflops))
        rows.record(f"pipeline compiled ({label})", timing=whole, compile_s=self.compile_s,
                    recompiles=self.later.graphs, mode=self.mode, graphs_first_call=self.pipe_first.graphs,
                    emulate_precision_casts=self.emulate_precision_casts, eager_samples_s=eager_whole.samples_s,
                    eager_latency_median_s=eager_whole.median_s, speedup=self.speedup("pipeline"))

    def summary(self) -> dict[str, Any]:
        """One row of a table of compiles: first call, step and pipeline against eager, parity, recompiles."""
        return {"first call incl. compile (s)": self.compile_s,
                "eager step (ms)": self.timed["eager step"].median_s * 1e3,
                "compiled step (ms)": self.timed["compiled step"].median_s * 1e3,
                "step speedup (x)": self.speedup("step"), "pipeline speedup (x)": self.speedup("pipeline"),
                "rel. L2 error vs eager": f"{self.rel_error:.2e}",
                "recompiles after the first call (count)": self.later.graphs}


def measure_compile(step_call: Callable[[], Any], pipe_call: Callable[[], Any], eager_out: torch.Tensor,
                    device: torch.device, *, mode: str, repeats: int, warmup: int) -> CompiledRun:
    """Measure a denoiser the notebook has just compiled (not called yet), as notebook 03's section 2 does in view:
    the first step call against an empty compile cache (cold), its output against eager_out, the pipeline's own
    first call, then eager and compiled steps and pipelines timed in turn under error_on_recompile. Records
    whether inductor emulated eager's roundings (torch._inductor.config.emulate_precision_casts) as it compiled."""
    from helpers import measure

    emulate = bool(torch._inductor.config.emulate_precision_casts)
    with fresh_cache(), counting() as first:
        compile_s, out = measure.first_call_seconds(step_call, device)
    out = out[0] if isinstance(out, (tuple, list)) else out
    error, finite = relative_error(out, eager_out), bool(torch.isfinite(out).all())
    with counting() as pipe_first:
        pipe_call()
    calls = dict(zip(STEADY_CALLS, (step_call, step_call, pipe_call, pipe_call)))
    try:
        with counting() as later, error_on_recompile():
            timed = measure.time_interleaved(calls, device, repeats=repeats, warmup=warmup, setup=run_as)
    finally:
        torch.compiler.set_stance("default")
    return CompiledRun(mode, emulate, compile_s, first, error, finite, pipe_first, later, timed)
