"""Cold and warm compile latency, measured where 'cold' is true: a fresh Python process with its own compile cache.

Notebook 04 writes its own script (a visible `%%writefile` cell): it loads the pipeline, compiles the denoiser one
way ("full" or "regional"), optionally loads or saves portable compile artifacts, and hands the measuring to
`Child` (eager reference and timings, the first call with the compile caches' hits and misses, steady calls, one
profiled step). The parent side (`run_script`) runs that script in a new process with the environment it is
given (TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR pointing at a folder the notebook chose: a new, empty one for a
cold start) and reads back the one JSON line it prints.

`run_steady` runs `python -m helpers.coldstart --steady SCRIPT ...` instead: one process that imports the script,
loads the pipeline and compiles it both ways with the script's own `load_pipeline` and `compile_denoiser`, then
times eager and each compiled denoiser interleaved, round by round, so every speedup compares calls made in the
same process under the same load. It compiles regional first, from a copy of the cold processes' cache folders, so
its first call is also the warm start from a cache directory (`SteadyCompare.warm_start`): one process fewer.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from helpers import paths, text

HOWS: tuple[str, ...] = ("full", "regional")
# The steady process compiles in this order: its first compile (regional) is a fresh process's warm start.
STEADY_ORDER: tuple[str, ...] = ("regional", "full")
_MARK = "COLDSTART_JSON "


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

    def timing(self, warmup: int) -> Any:
        """The steady compiled calls as a measure.Timing (for a row)."""
        from helpers import measure

        return measure.Timing(samples_s=self.steady_samples_s, warmup=warmup, method=self.timing_method)

    def row_fields(self) -> dict[str, Any]:
        """The fields of this process's row, besides its timing: compile seconds, counts, parity, profile, sizes."""
        return {"compile_s": self.first_call_s, "recompiles": self.recompiles_after_first, "how": self.how,
                "graphs": self.graphs, "ops_captured": self.ops_captured, "rel_error": self.rel_error,
                "artifacts_loaded": self.artifacts_loaded, "artifacts_saved_bytes": self.artifacts_saved_bytes,
                "artifacts_load_s": self.artifacts_load_s, "first_call_cache_hits": self.first_call_cache_hits,
                "first_call_cache_misses": self.first_call_cache_misses, "eager_samples_s": self.eager_samples_s,
                "eager_latency_median_s": self.eager_median_s, "speedup_vs_eager": self.speedup_vs_eager,
                "step_profile": self.step_profile, "cuda_peak_bytes": self.cuda_peak_bytes,
                "process_wall_s": self.process_wall_s, "startup_s": self.startup_s,
                "kernel_files_built": self.extra.get("kernel_files_built", 0)}

    def line(self, label: str, steady: bool = False) -> str:
        """One printed line: the first call with its cache lookups, parity, what was built; with steady=True also the
        steady step against eager in this process (off for the cold and warm starts: their processes ran minutes
        apart, and the steady comparison is the interleaved process's)."""
        parity = "bit-identical to eager" if self.rel_error == 0 else f"rel. L2 error vs eager {self.rel_error:.2e}"
        speed = (f"steady {self.steady_median_s * 1e3:.1f} ms vs eager {self.eager_median_s * 1e3:.1f} ms in the same "
                 f"process ({self.speedup_vs_eager:.2f}x); " if steady else "")
        return (f"{label}: first call {self.first_call_s:.1f} s (compile-cache hits {self.first_call_cache_hits}, "
                f"misses {self.first_call_cache_misses}), {text.count(self.graphs, 'graph')}, {self.ops_captured} ops traced, "
                f"{self.extra.get('kernel_files_built', 0)} kernel files built; {speed}{parity}; process "
                f"{self.process_wall_s:.0f} s in all"
                + (f", CUDA peak {self.cuda_peak_bytes / 2**30:.1f} GiB" if self.cuda_peak_bytes else ""))


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
    first_call_cache_misses: dict[str, int] = field(default_factory=dict)
    first_call_graphs: dict[str, int] = field(default_factory=dict)
    first_call_ops: dict[str, int] = field(default_factory=dict)
    startup_s: float = 0.0
    cache_dir: str = ""
    kernel_files_built: int = 0

    def warm_start(self) -> ColdStart:
        """The process's first compile (STEADY_ORDER[0]) as a fresh-process warm start from its cache folder: that
        first call, then its setting's and eager's samples from the interleaved rounds, its profiled step."""
        how = STEADY_ORDER[0]
        return ColdStart(
            how=how, first_call_s=self.first_call_s[how], steady_samples_s=self.samples_s[how],
            rel_error=self.rel_errors[how], graphs=self.first_call_graphs[how], ops_captured=self.first_call_ops[how],
            recompiles_after_first=self.graphs_while_timing, artifacts_loaded=False, artifacts_saved_bytes=0,
            process_wall_s=self.process_wall_s, startup_s=self.startup_s, cache_dir=self.cache_dir,
            timing_method=self.timing_method, eager_samples_s=self.samples_s["eager"],
            first_call_cache_hits=self.first_call_cache_hits[how],
            first_call_cache_misses=self.first_call_cache_misses[how], step_profile=self.step_profiles[how],
            extra={"kernel_files_built": self.kernel_files_built})

    def median_s(self, label: str) -> float:
        """Median steady step of one setting."""
        return statistics.median(self.samples_s[label])

    def speedup_vs_eager(self, label: str) -> float:
        """Eager median over this setting's median, both from this process's interleaved rounds."""
        return self.median_s("eager") / self.median_s(label)

    def timing(self, label: str, warmup: int) -> Any:
        """One setting's steady steps as a measure.Timing (for a row)."""
        from helpers import measure

        return measure.Timing(samples_s=self.samples_s[label], warmup=warmup, method=self.timing_method)




# --- The parent side: run the notebook's script in a new process ---


def settings(run: Any, *, denoiser_config: dict[str, Any]) -> dict[str, Any]:
    """What the notebook's script needs to rebuild this run's pipeline and step (a params.Run), as JSON-able values."""
    s = run.settings
    return {"model": run.model, "profile": run.profile, "weights": run.weights, "dtype": run.dtype_name,
            "seed": run.seed, "denoiser_config": denoiser_config, "height": s.height, "width": s.width,
            "max_sequence_length": s.max_sequence_length, "guidance": s.guidance, "repeats": s.repeats,
            "warmup": s.warmup}


def _run(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[dict[str, Any], float]:
    """Run a child command with env added (and the project importable); its JSON answer and its wall seconds."""
    path = os.pathsep.join(p for p in (str(paths.ROOT), os.environ.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=paths.ROOT, env=os.environ | env | {"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(_MARK):]), wall


def run_script(script: str | Path, cfg: dict[str, Any], *, env: dict[str, str], cache_dir: Path,
               timeout_s: float = 3600) -> ColdStart:
    """Run the notebook's script with cfg in a new Python process, env added to its environment (its compile cache
    folders, inside cache_dir); what it measured, its wall seconds and the kernel files it built in cache_dir."""
    if cfg.get("how") not in HOWS:
        raise ValueError(f"how={cfg.get('how')!r}; allowed: {HOWS}")
    kernels_before = kernel_files(cache_dir)
    data, wall = _run([sys.executable, str(script), json.dumps(cfg | {"launched_at": time.time()})], env, timeout_s)
    result = ColdStart(process_wall_s=wall, cache_dir=str(cache_dir), **data)
    result.extra["kernel_files_built"] = kernel_files(cache_dir) - kernels_before
    return result


def run_steady(script: str | Path, cfg: dict[str, Any], *, env: dict[str, str], cache_dir: Path,
               timeout_s: float = 3600) -> SteadyCompare:
    """In one new process (env added, its compile caches inside cache_dir): load the pipeline and compile it both
    ways with the script's own functions (STEADY_ORDER), then time eager, full and regional interleaved (cfg's
    warmup rounds untimed, then its repeats) and profile; with the kernel files it built in cache_dir."""
    kernels_before = kernel_files(cache_dir)
    cmd = [sys.executable, "-m", "helpers.coldstart", "--steady", str(script),
           json.dumps(cfg | {"launched_at": time.time()})]
    data, wall = _run(cmd, env, timeout_s)
    return SteadyCompare(process_wall_s=wall, cache_dir=str(cache_dir),
                         kernel_files_built=kernel_files(cache_dir) - kernels_before, **data)


# --- The child side: inside the fresh process ---


class Child:
    """The measuring half of the notebook's script: one denoiser step of `pipe` on the inputs the pipeline builds at
    its first step, timed eager, then (after the script compiles) its first call and steady calls; `json_line()` is
    what the script prints for the parent."""

    def __init__(self, pipe: Any, cfg: dict[str, Any]) -> None:
        """Build the step's inputs as the pipeline does (pipelines.denoiser_inputs) and a call of the denoiser."""
        import torch

        from helpers import pipelines

        self.cfg, self.device = cfg, pipe._execution_device
        inputs = pipelines.denoiser_inputs(pipe, height=cfg["height"], width=cfg["width"], guidance=cfg["guidance"],
                                           max_sequence_length=cfg["max_sequence_length"], seed=cfg["seed"])
        net = pipelines.denoiser(pipe)

        def call() -> Any:
            with torch.inference_mode():
                return net(**inputs)[0]
        self.call = call
        self.reference: Any = None
        self.result: dict[str, Any] = {"how": cfg.get("how", ""), "artifacts_loaded": False,
                                       "artifacts_saved_bytes": 0, "artifacts_load_s": 0.0}

    def eager(self) -> None:
        """The eager output (the reference the compiled one is compared with) and steady eager timings."""
        from helpers import measure

        self.reference = self.call()
        eager = measure.time_callable(self.call, self.device, repeats=self.cfg["repeats"], warmup=self.cfg["warmup"])
        self.result["eager_samples_s"] = list(eager.samples_s)

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        """Record the wall seconds of the block under `name` (e.g. loading compile artifacts)."""
        t0 = time.perf_counter()
        yield
        self.result[name] = time.perf_counter() - t0

    def note(self, **fields: Any) -> None:
        """Add fields to what the process reports (e.g. artifacts_loaded, artifacts_saved_bytes)."""
        self.result.update(fields)

    def first_and_steady_calls(self) -> None:
        """Time the first call (it compiles) counting graphs and compile-cache lookups, then steady calls (counting
        recompiles), and profile a few; startup_s is the wall time from the parent's launch to this point."""
        from helpers import compile_tools, measure

        self.result["startup_s"] = time.time() - self.cfg.get("launched_at", time.time())
        with compile_tools.counting() as first:
            first_s, out = measure.first_call_seconds(self.call, self.device)
        with compile_tools.counting() as later:
            steady = measure.time_callable(self.call, self.device, repeats=self.cfg["repeats"],
                                           warmup=self.cfg["warmup"])
            profiled = step_profile(self.call, self.device, calls=self.cfg["repeats"])
        self.note(first_call_s=first_s, steady_samples_s=list(steady.samples_s), timing_method=steady.method,
                  rel_error=compile_tools.relative_error(out, self.reference), graphs=first.graphs,
                  ops_captured=first.ops_captured, recompiles_after_first=later.graphs,
                  first_call_cache_hits=first.cache_hits, first_call_cache_misses=first.cache_misses,
                  step_profile=profiled)

    def json_line(self) -> str:
        """The line the parent reads back, with the process's CUDA peak (0 on a CPU) and the size of the artifacts
        file the script saved, if it saved one."""
        import torch

        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        saved = Path(self.cfg.get("save_artifacts") or "")
        size = saved.stat().st_size if self.cfg.get("save_artifacts") and saved.is_file() else 0
        return _MARK + json.dumps(self.result | {"cuda_peak_bytes": peak, "artifacts_saved_bytes": size})


def load_script(script: str | Path) -> ModuleType:
    """Import the notebook's script as a module (its `__main__` block does not run)."""
    spec = importlib.util.spec_from_file_location("notebook_script", script)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {script}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steady(script: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Inside the steady process: compile both ways by the script's functions, time all settings in turn, profile."""
    from helpers import compile_tools, measure

    module = load_script(script)
    pipe = module.load_pipeline(cfg)
    child = Child(pipe, cfg)
    net, call, device = pipe.transformer, child.call, child.device
    reference = call()
    states: dict[str, dict[Any, Any]] = {"eager": {}}
    errors, first_s, hits, misses, graphs, ops = {}, {}, {}, {}, {}, {}
    startup_s = time.time() - cfg.get("launched_at", time.time())
    for how in STEADY_ORDER:
        compile_tools.set_compiled_state(net, {})
        module.compile_denoiser(pipe, how)
        with compile_tools.counting() as first:
            first_s[how], out = measure.first_call_seconds(call, device)
        hits[how], misses[how], errors[how] = first.cache_hits, first.cache_misses, compile_tools.relative_error(
            out, reference)
        graphs[how], ops[how] = first.graphs, first.ops_captured
        states[how] = compile_tools.compiled_state(net)
    with compile_tools.counting() as later:
        timings = measure.time_interleaved({k: call for k in states}, device, repeats=cfg["repeats"],
                                           warmup=cfg["warmup"],
                                           setup=lambda label: compile_tools.set_compiled_state(net, states[label]))
        profiles = {}
        for how in HOWS:
            compile_tools.set_compiled_state(net, states[how])
            profiles[how] = step_profile(call, device, calls=cfg["repeats"])
    return {"samples_s": {k: list(t.samples_s) for k, t in timings.items()}, "graphs_while_timing": later.graphs,
            "step_profiles": profiles, "rel_errors": errors, "first_call_s": first_s, "first_call_cache_hits": hits,
            "first_call_cache_misses": misses, "first_call_graphs": graphs, "first_call_ops": ops,
            "startup_s": startup_s, "timing_method": timings["eager"].method}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the steady process: `--steady SCRIPT SETTINGS_JSON`; prints one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steady", required=True, help="the notebook's script (load_pipeline, compile_denoiser)")
    parser.add_argument("settings", help="settings as JSON (coldstart.settings)")
    args = parser.parse_args(argv)
    print(_MARK + json.dumps(_steady(args.steady, json.loads(args.settings))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
