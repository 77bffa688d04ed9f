"""Time callables, track peak memory and count FLOPs, the same honest way in every notebook."""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch._C._autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class Timing:
    """Wall-clock samples of a callable after warm-up, with summary statistics in seconds."""

    samples_s: list[float]
    warmup: int
    method: str

    @property
    def median_s(self) -> float:
        """Median of the samples."""
        return statistics.median(self.samples_s)

    @property
    def spread_s(self) -> float:
        """Max minus min of the samples: the honest width of what was seen."""
        return max(self.samples_s) - min(self.samples_s)

    @property
    def min_s(self) -> float:
        """Fastest sample."""
        return min(self.samples_s)

    def told_apart(self, other: Timing) -> bool:
        """Whether the two medians differ by more than the larger max-min spread (else: noise, not a difference)."""
        return told_apart(self.median_s, other.median_s, self.spread_s, other.spread_s)


@dataclass(frozen=True)
class Memory:
    """Peak memory during a call, what kind of number it is, and the baseline it is measured from."""

    peak_bytes: int
    baseline_bytes: int
    kind: str

    @property
    def peak_gib(self) -> float:
        """Peak in GiB."""
        return self.peak_bytes / 2**30

    @property
    def peak_text(self) -> str:
        """The peak in a unit that shows it: '22.50 GiB', or '3.8 MiB' below 1 GiB."""
        return f"{self.peak_gib:.2f} GiB" if self.peak_bytes >= 2**30 else f"{self.peak_bytes / 2**20:.1f} MiB"

    @property
    def kind_label(self) -> str:
        """What the peak counts, in a few words: 'CUDA tensors (max_memory_allocated)' or 'CPU memory the call
        allocated'."""
        return MEMORY_LABELS.get(self.kind, self.kind)


MEMORY_LABELS: dict[str, str] = {
    "cuda_max_allocated": "CUDA tensors, torch.cuda.max_memory_allocated",
    "cpu_allocated_during_call": "CPU memory the call allocated, weights not included",
}

MEMORY_KINDS: dict[str, str] = {
    "cuda_max_allocated": "CUDA caching allocator: torch.cuda.max_memory_allocated() during the call "
    "(tensors only; excludes the CUDA context and allocator slack)",
    "cpu_allocated_during_call": "CPU: peak of the bytes that the call allocated through PyTorch's CPU allocator "
    "and had not yet freed (the profiler's memory events: activations, temporaries, outputs); weights and inputs "
    "allocated before the call are not included, so it is the call's working memory, not the process's",
}


def synchronize(device: torch.device) -> None:
    """Block until all queued work on device is done (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_callable(fn: Callable[[], Any], device: torch.device, *, repeats: int, warmup: int) -> Timing:
    """Run fn warmup times untimed, then repeats times timed (CUDA events on GPU, synchronized clock on CPU)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        method = "cuda_events"
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        method = "perf_counter"
    return Timing(samples_s=samples, warmup=warmup, method=method)


def time_interleaved(calls: dict[str, Callable[[], Any]], device: torch.device, *, repeats: int, warmup: int,
                     setup: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Time each callable once per round, in turn (warmup untimed rounds, then `repeats` timed ones), so load that
    changes during the measurement lands on every setting alike; setup(name), if given, runs untimed before each
    call. A Timing per name."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    method = ""
    for round_ in range(warmup + repeats):
        for name, fn in calls.items():
            if setup is not None:
                setup(name)
            timing = time_callable(fn, device, repeats=1, warmup=0)
            method = timing.method
            if round_ >= warmup:
                samples[name].extend(timing.samples_s)
    return {name: Timing(samples_s=v, warmup=warmup, method=method) for name, v in samples.items()}


def first_call_seconds(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Wall-clock seconds of one synchronized call (e.g. the compiling first call), and its result."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null inside the block (for C++ log lines that bypass Python)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _single_cycle() -> Iterator[None]:
    """Ignore the profiler's note that it keeps only the current cycle's events: these profiles have one cycle.

    (torch warns once per process as a profile starts; under torch 2.11 the note reached notebook outputs.)"""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        yield


@contextlib.contextmanager
def quiet_profile(**kwargs: Any) -> Iterator[profile]:
    """torch.profiler.profile(**kwargs) without the log lines kineto prints to stderr as it starts and stops."""
    prof = profile(**kwargs)
    with _stderr_silenced(), _single_cycle():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _stderr_silenced():
            prof.__exit__(None, None, None)


_PRIMED: list[bool] = [False]


def _prime_allocation_tracking() -> None:
    """Trigger, with stderr silenced, the once-per-process C++ warning that a block freed while profiling
    memory was allocated before it started (every measured call frees such blocks; the warning says nothing)."""
    if _PRIMED[0]:
        return
    block = [torch.ones(16)]
    with _stderr_silenced(), _single_cycle(), profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        block.clear()
    _PRIMED[0] = True


def _allocation_peak(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run fn under the profiler's memory tracking; peak of bytes allocated during the call and not yet freed."""
    _prime_allocation_tracking()
    with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, out


# Ops that only hand out memory for the op that called them: allocations are credited to that caller instead.
ALLOCATOR_OPS: frozenset[str] = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::resize_", "aten::zeros",
})


def cpu_allocations_by_op(fn: Callable[[], Any]) -> tuple[dict[str, int], Any]:
    """Run fn once under the profiler; CPU bytes each op allocated (net of what it freed itself), largest first."""
    _prime_allocation_tracking()
    with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    by_op: dict[str, int] = {}
    for e in prof.events():
        if e.self_cpu_memory_usage <= 0:
            continue
        owner = e
        while owner.name in ALLOCATOR_OPS and owner.cpu_parent is not None:
            owner = owner.cpu_parent
        by_op[owner.name] = by_op.get(owner.name, 0) + e.self_cpu_memory_usage
    return dict(sorted(by_op.items(), key=lambda kv: -kv[1])), out


def peak_memory(fn: Callable[[], Any], device: torch.device) -> tuple[Memory, Any]:
    """Run fn once and return the peak memory it reached (CUDA allocator; on CPU, bytes allocated by the call)."""
    gc.collect()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        synchronize(device)
        return Memory(torch.cuda.max_memory_allocated(device), baseline, "cuda_max_allocated"), out
    peak, out = _allocation_peak(fn)
    return Memory(peak, 0, "cpu_allocated_during_call"), out


def count_flops(fn: Callable[[], Any]) -> int:
    """Floating-point operations of one call of fn, counted by torch.utils.flop_counter, attention included.

    SDPA runs its math backend while counting: the counter has formulas for the fused CUDA kernels but not for the
    CPU's flash kernel, and the math backend's two matmuls are the same operations on any device."""
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def fraction_of_peak(flops: float, seconds: float, peak_tflops: float) -> float:
    """Achieved throughput (flops / seconds) as a fraction of the measured matmul peak."""
    if seconds <= 0 or peak_tflops <= 0:
        raise ValueError(f"seconds and peak_tflops must be positive, got {seconds}, {peak_tflops}")
    return flops / seconds / (peak_tflops * 1e12)


# A step cannot run faster than the best matmul the same device and dtype manage on their own; the margin absorbs
# timing noise between the card's peak measurement and the step's (both medians or bests of several runs).
PEAK_NOISE_MARGIN = 0.10


def check_fraction_of_peak(fraction: float, peak_is_native: bool) -> str:
    """Raise if a step beat the measured peak by more than the noise margin; '' or why the check does not apply."""
    if not fraction > 0:
        raise AssertionError(f"fraction of peak {fraction!r}: no FLOPs counted, or no time measured")
    if not peak_is_native:
        return ("not bounded: the peak's dtype runs a fallback kernel on this device, whose rate depends on the "
                "operands' shapes, so a square-matmul peak does not bound the step's own products")
    if fraction > 1 + PEAK_NOISE_MARGIN:
        raise AssertionError(f"the step ran at {100 * fraction:.0f}% of the measured matmul peak, above the "
                             f"{100 * (1 + PEAK_NOISE_MARGIN):.0f}% noise allows: the peak or the step time is wrong")
    return ""


T = TypeVar("T")


def out_of_memory(fn: Callable[[], T]) -> tuple[T | None, str]:
    """(fn's result, '') or, when it ran out of device memory, (None, the error's first line) with the cache freed."""
    try:
        return fn(), ""
    except torch.OutOfMemoryError as err:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None, (str(err).strip().splitlines() or ["out of memory"])[0]


def told_apart(median_a: float, median_b: float, spread_a: float, spread_b: float) -> bool:
    """Whether two medians differ by more than the larger of their max-min spreads (else: noise, not a difference)."""
    return abs(median_a - median_b) > max(spread_a, spread_b)


def compare_medians(a: Timing, b: Timing, name_a: str, name_b: str) -> str:
    """A sentence comparing two timings: faster, slower, or not told apart (medians within the larger spread)."""
    gap = abs(a.median_s - b.median_s)
    spread = max(a.spread_s, b.spread_s)
    ms = f"{a.median_s * 1e3:.1f} ms vs {b.median_s * 1e3:.1f} ms median"
    if not told_apart(a.median_s, b.median_s, a.spread_s, b.spread_s):
        return (f"{name_a} and {name_b} are not told apart by this run: {ms}, a gap of {gap * 1e3:.1f} ms within "
                f"the larger max-min spread ({spread * 1e3:.1f} ms)")
    word = "faster" if a.median_s < b.median_s else "slower"
    return f"{name_a} is {word} than {name_b}: {ms}, a gap of {gap * 1e3:.1f} ms beyond either max-min spread"


def human_seconds(seconds: float) -> str:
    """A duration in the unit that reads: '2.1 s' from 1 s up, '0.31 ms' below 1 ms, '12.4 ms' between."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e3:.2g} ms"


def human_speedup(speedup: float) -> str:
    """A speedup that reads: '1.59x'; below 1 it says the slowdown too: '0.06x (16.7x slower)'."""
    return f"{speedup:.2f}x" if speedup >= 1 else f"{speedup:.2f}x ({1 / speedup:.3g}x slower)"


def human_flops(flops: float) -> str:
    """A FLOP count with a readable prefix: '1.23 GFLOP'."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if flops >= scale:
            return f"{flops / scale:.3g} {prefix}FLOP"
    return f"{flops:.3g} FLOP"
