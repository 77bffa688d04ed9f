"""Cold and warm compile latency, measured where 'cold' is true: a fresh Python process with its own compile cache.

The parent side (`measure_fresh`) starts `python -m helpers.coldstart ...` with TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR pointing at a folder it chooses (a new empty one for a cold start). The child builds the
pipeline, runs the denoiser once eagerly for reference and times steady eager calls, optionally loads portable
compile artifacts, compiles the denoiser by running the recipe the parent passed (a line of code such as
`pipe.transformer.compile(fullgraph=True)`, executed as written with `pipe` bound to the child's pipeline),
times the first (compiling) call with the compile caches' hits and misses, times the steady calls, profiles a
few more (where the host time of the fastest goes: compiled graphs, their wrappers, guard lookups, eager ops
between compiled regions), optionally saves the artifacts, and prints one JSON line back.

`measure_steady` runs several recipes in one process instead (warm from a cache that already holds their
kernels) and times eager and each compiled denoiser interleaved, round by round, so every speedup compares
calls made in the same process under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from helpers import paths

HOWS: tuple[str, ...] = ("full", "regional")
_MARK = "COLDSTART_JSON "


def run_recipe(recipe: str, pipe: Any) -> None:
    """Execute a compile recipe, a line such as `pipe.transformer.compile(fullgraph=True)`, with `pipe` bound."""
    exec(compile(recipe, "<recipe>", "exec"), {"pipe": pipe})  # noqa: S102 - the notebook's own visible line


@dataclass(frozen=True)
class Workload:
    """What the child builds and runs: model, profile, dtype, seed, denoiser config overrides, one call's shape."""

    model: str
    profile: str
    dtype: str
    seed: int
    height: int
    width: int
    max_sequence_length: int
    guidance: float
    weights: str = "random"
    denoiser_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ColdStart:
    """One fresh process: eager and compiled steady latency, compile seconds of the first call with its compile-cache
    hits and misses, parity, what dynamo compiled, one profiled step, and the process's CUDA peak (0 on a CPU)."""

    how: str
    first_call_s: float
    steady_samples_s: list[float]
    rel_error: float
    graphs: int
    ops_captured: int
    recompiles_after_first: int
    artifacts_loaded: bool
    artifacts_saved_bytes: int
    process_wall_s: float
    startup_s: float
    cache_dir: str
    timing_method: str = ""
    eager_samples_s: list[float] = field(default_factory=list)
    first_call_cache_hits: int = 0
    first_call_cache_misses: int = 0
    artifacts_load_s: float = 0.0
    step_profile: dict[str, float] = field(default_factory=dict)
    cuda_peak_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steady_median_s(self) -> float:
        """Median of the steady (already compiled) calls."""
        return statistics.median(self.steady_samples_s)

    @property
    def eager_median_s(self) -> float:
        """Median of the steady eager calls timed in the same process before compiling."""
        return statistics.median(self.eager_samples_s)

    @property
    def speedup_vs_eager(self) -> float:
        """Eager steady latency over compiled steady latency, both timed in this process."""
        return self.eager_median_s / self.steady_median_s


# Profiler event names (torch 2.13): a call of compiled code, the compiled graph inside it, dynamo's guard lookup.
REGION_EVENT = "Torch-Compiled Region"
GRAPH_EVENT = "## Call CompiledFxGraph"
GUARD_EVENT = "TorchDynamo Cache Lookup"


def step_profile(fn: Callable[[], Any], device: Any, *, calls: int = 3) -> dict[str, float]:
    """Profile `calls` calls of fn and split the host (CPU-side) time of the fastest one: compiled regions entered,
    time inside their compiled graphs, in the regions' wrappers around those graphs, in dynamo's guard lookups, and
    in eager aten ops run outside any compiled region (the uncompiled code between regions). Seconds; the profiler
    adds its own cost per recorded op, so compare the parts with each other, not with unprofiled timings."""
    from torch.profiler import ProfilerActivity

    from helpers import measure

    def seconds(events: list[Any]) -> float:
        return sum(e.time_range.elapsed_us() for e in events) / 1e6

    profiles = []
    for _ in range(calls):
        with measure.quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
            measure.synchronize(device)
            t0 = time.perf_counter()
            fn()
            measure.synchronize(device)
            wall = time.perf_counter() - t0
        events = prof.events()
        top = [e for e in events if e.cpu_parent is None]
        regions = [e for e in top if e.name.startswith(REGION_EVENT)]
        graphs = [e for e in events if e.name.startswith(GRAPH_EVENT)]
        guards = [e for e in top if e.name.startswith(GUARD_EVENT)]
        eager = [e for e in top if e.name.startswith("aten::")]
        profiles.append({"wall_s": wall, "region_calls": len(regions), "graph_s": seconds(graphs),
                         "region_wrapper_s": seconds(regions) - seconds(graphs), "guard_calls": len(guards),
                         "guard_s": seconds(guards), "eager_ops_outside": len(eager),
                         "eager_ops_outside_s": seconds(eager)})
    return min(profiles, key=lambda p: p["wall_s"])


def fresh_cache_dir(prefix: str = "coldstart-") -> Path:
    """A new, empty folder to serve as the inductor and triton cache of one process."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove_dirs(dirs: list[Path]) -> None:
    """Delete folders made by fresh_cache_dir once their measurements are recorded."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def copy_cache_dir(*sources: str | Path) -> Path:
    """A new folder holding a copy of other processes' compile caches (merged: entries are named by content
    hashes): a warm start from the cache directory."""
    target = fresh_cache_dir("warmdir-")
    for source in sources:
        shutil.copytree(source, target, dirs_exist_ok=True)
    return target


# Compiled kernel files in a cache: C++ kernel libraries (CPU) and triton's cubins and launchers (CUDA).
KERNEL_SUFFIXES: tuple[str, ...] = (".so", ".cubin")


def kernel_files(cache_dir: str | Path) -> int:
    """Compiled kernel files under cache_dir (a process that finds its kernels cached builds none)."""
    return sum(1 for p in Path(cache_dir).rglob("*") if p.suffix in KERNEL_SUFFIXES)


def cache_env(cache_dir: Path) -> dict[str, str]:
    """Environment variables that point inductor's and triton's caches into cache_dir."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"), "TRITON_CACHE_DIR": str(cache_dir / "triton")}


def measure_fresh(work: Workload, how: str, recipe: str, cache_dir: Path, *, repeats: int, warmup: int,
                  emulate_precision_casts: bool, save_artifacts: Path | None = None,
                  load_artifacts: Path | None = None, timeout_s: float = 1800) -> ColdStart:
    """Run one compile-and-time in a fresh Python process whose compile caches live in cache_dir; the child compiles
    by executing `recipe` (labelled `how`)."""
    if how not in HOWS:
        raise ValueError(f"how={how!r}; allowed: {HOWS}")
    cmd = [sys.executable, "-m", "helpers.coldstart", "--how", how, "--recipe", recipe, "--repeats", str(repeats),
           "--warmup", str(warmup), "--work", json.dumps(asdict(work))]
    if emulate_precision_casts:
        cmd.append("--emulate-precision-casts")
    if save_artifacts:
        cmd += ["--save-artifacts", str(save_artifacts)]
    if load_artifacts:
        cmd += ["--load-artifacts", str(load_artifacts)]
    kernels_before = kernel_files(cache_dir)
    data, wall = _run_child(cmd, cache_dir, timeout_s)
    result = ColdStart(process_wall_s=wall, cache_dir=str(cache_dir), **data)
    result.extra["kernel_files_built"] = kernel_files(cache_dir) - kernels_before
    return result


def _run_child(cmd: list[str], cache_dir: Path, timeout_s: float) -> tuple[dict[str, Any], float]:
    """Run a child command with its caches in cache_dir; its JSON answer and the process's wall seconds."""
    env = os.environ | cache_env(cache_dir)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"helpers.coldstart child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(_MARK):]), wall


@dataclass
class SteadyCompare:
    """Eager and compiled steady steps timed interleaved in one process: samples per setting ('eager' and each
    recipe's label), graphs compiled while timing, each compiled setting's profiled step and parity with eager,
    and each recipe's first call (seconds, compile-cache hits: warm when the cache held its entries)."""

    samples_s: dict[str, list[float]]
    graphs_while_timing: int
    step_profiles: dict[str, dict[str, float]]
    rel_errors: dict[str, float]
    first_call_s: dict[str, float]
    first_call_cache_hits: dict[str, int] = field(default_factory=dict)
    process_wall_s: float = 0.0
    timing_method: str = ""

    def median_s(self, label: str) -> float:
        """Median steady step of one setting."""
        return statistics.median(self.samples_s[label])

    def speedup_vs_eager(self, label: str) -> float:
        """Eager median over this setting's median, both from this process's interleaved rounds."""
        return self.median_s("eager") / self.median_s(label)


def measure_steady(work: Workload, recipes: dict[str, str], cache_dir: Path, *, repeats: int, warmup: int,
                   emulate_precision_casts: bool, timeout_s: float = 1800) -> SteadyCompare:
    """In one fresh process with caches in cache_dir: compile by each recipe, then time eager and every compiled
    setting interleaved (warmup rounds untimed, then `repeats` rounds), and profile each compiled setting."""
    cmd = [sys.executable, "-m", "helpers.coldstart", "--steady", json.dumps(recipes), "--repeats", str(repeats),
           "--warmup", str(warmup), "--work", json.dumps(asdict(work))]
    if emulate_precision_casts:
        cmd.append("--emulate-precision-casts")
    data, wall = _run_child(cmd, cache_dir, timeout_s)
    return SteadyCompare(process_wall_s=wall, **data)


def _built(args: argparse.Namespace) -> tuple[Any, Any, Callable[[], Any], Any]:
    """Inside the fresh process: the workload's pipeline, its denoiser, one step as a callable, and the device."""
    import torch

    from helpers import params, pipelines

    work = Workload(**json.loads(args.work))
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    pipe = pipelines.build_pipeline(work.model, work.profile, weights=work.weights,
                                    dtype=params.DTYPES[work.dtype], device=device, seed=work.seed,
                                    denoiser_config=work.denoiser_config or None)
    inputs = pipelines.denoiser_inputs(pipe, height=work.height, width=work.width, guidance=work.guidance,
                                       max_sequence_length=work.max_sequence_length, seed=work.seed)
    net = pipelines.denoiser(pipe)

    def call() -> Any:
        with torch.inference_mode():
            return net(**inputs)[0]
    return pipe, net, call, device


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the fresh process: build, eager reference and timing, compile, time first and steady calls, profile."""
    t_start = time.perf_counter()
    import torch

    from helpers import compile_tools, measure

    pipe, _net, call, device = _built(args)

    reference = call()
    eager = measure.time_callable(call, device, repeats=args.repeats, warmup=args.warmup)
    loaded, load_s = False, 0.0
    if args.load_artifacts:
        t0 = time.perf_counter()
        loaded = torch.compiler.load_cache_artifacts(Path(args.load_artifacts).read_bytes()) is not None
        load_s = time.perf_counter() - t0
    run_recipe(args.recipe, pipe)  # the notebook's line, e.g. pipe.transformer.compile(fullgraph=True)
    startup = time.perf_counter() - t_start

    with compile_tools.precision_casts(args.emulate_precision_casts):
        with compile_tools.counting() as first:
            first_s, out = measure.first_call_seconds(call, device)
        with compile_tools.counting() as later:
            timing = measure.time_callable(call, device, repeats=args.repeats, warmup=args.warmup)
            profiled = step_profile(call, device, calls=args.repeats)
    saved = 0
    if args.save_artifacts:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            Path(args.save_artifacts).write_bytes(artifacts[0])
            saved = len(artifacts[0])
    return {"how": args.how, "first_call_s": first_s, "steady_samples_s": list(timing.samples_s),
            "rel_error": compile_tools.relative_error(out, reference), "graphs": first.graphs,
            "ops_captured": first.ops_captured, "recompiles_after_first": later.graphs, "artifacts_loaded": loaded,
            "artifacts_saved_bytes": saved, "startup_s": startup, "timing_method": timing.method,
            "eager_samples_s": list(eager.samples_s), "first_call_cache_hits": first.cache_hits,
            "first_call_cache_misses": first.cache_misses, "artifacts_load_s": load_s, "step_profile": profiled,
            "cuda_peak_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else 0}


def _steady_child(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the fresh process: build, compile by each recipe (warm caches), time all settings interleaved, profile."""

    from helpers import compile_tools, measure

    recipes: dict[str, str] = json.loads(args.steady)
    pipe, net, call, device = _built(args)

    reference = call()
    states: dict[str, dict[Any, Any]] = {"eager": {}}
    errors, first_s, hits = {}, {}, {}
    with compile_tools.precision_casts(args.emulate_precision_casts):
        for label, recipe in recipes.items():
            compile_tools.set_compiled_state(net, {})
            run_recipe(recipe, pipe)
            with compile_tools.counting() as first:
                first_s[label], out = measure.first_call_seconds(call, device)
            hits[label] = first.cache_hits
            errors[label] = compile_tools.relative_error(out, reference)
            states[label] = compile_tools.compiled_state(net)

        with compile_tools.counting() as later:
            timings = measure.time_interleaved({k: call for k in states}, device, repeats=args.repeats,
                                                     warmup=args.warmup,
                                                     setup=lambda label: compile_tools.set_compiled_state(
                                                         net, states[label]))
            profiles = {}
            for label in recipes:
                compile_tools.set_compiled_state(net, states[label])
                profiles[label] = step_profile(call, device, calls=args.repeats)
    return {"samples_s": {k: list(t.samples_s) for k, t in timings.items()}, "graphs_while_timing": later.graphs,
            "step_profiles": profiles, "rel_errors": errors, "first_call_s": first_s, "first_call_cache_hits": hits,
            "timing_method": timings["eager"].method}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process: parse arguments, measure, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--how", choices=HOWS)
    parser.add_argument("--recipe", default="", help="the line of code that compiles pipe's denoiser")
    parser.add_argument("--steady", default="", help="label -> recipe as JSON: time them all in this process")
    parser.add_argument("--work", required=True, help="Workload as JSON")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--emulate-precision-casts", action="store_true")
    parser.add_argument("--save-artifacts", default="")
    parser.add_argument("--load-artifacts", default="")
    args = parser.parse_args(argv)
    if not args.steady and not (args.how and args.recipe):
        parser.error("give --how and --recipe, or --steady")
    result = _steady_child(args) if args.steady else _child(args)
    print(_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
