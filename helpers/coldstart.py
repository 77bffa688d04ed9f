"""Cold and warm compile latency, measured where 'cold' is true: a fresh Python process with its own compile cache.

The parent side (`measure_fresh`) starts `python -m helpers.coldstart ...` with TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR pointing at a folder it chooses (a new empty one for a cold start). The child builds the
pipeline, runs the denoiser once eagerly for reference, compiles it one way, times the first (compiling) call
and the steady calls, optionally saves or loads portable compile artifacts, and prints one JSON line back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from helpers import paths

HOWS: tuple[str, ...] = ("full", "regional")
_MARK = "COLDSTART_JSON "


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
    """One fresh process: compile seconds of the first call, steady latency, parity and what dynamo compiled."""

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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steady_median_s(self) -> float:
        """Median of the steady (already compiled) calls."""
        s = sorted(self.steady_samples_s)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def fresh_cache_dir(prefix: str = "coldstart-") -> Path:
    """A new, empty folder to serve as the inductor and triton cache of one process."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove_dirs(dirs: list[Path]) -> None:
    """Delete folders made by fresh_cache_dir once their measurements are recorded."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def copy_cache_dir(source: str | Path) -> Path:
    """A new folder holding a copy of another process's compile caches: a warm start from the cache directory."""
    target = fresh_cache_dir("warmdir-")
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


def measure_fresh(work: Workload, how: str, cache_dir: Path, *, repeats: int, warmup: int,
                  emulate_precision_casts: bool, save_artifacts: Path | None = None,
                  load_artifacts: Path | None = None, timeout_s: float = 1800) -> ColdStart:
    """Run one compile-and-time in a fresh Python process whose compile caches live in cache_dir."""
    if how not in HOWS:
        raise ValueError(f"how={how!r}; allowed: {HOWS}")
    cmd = [sys.executable, "-m", "helpers.coldstart", "--how", how, "--repeats", str(repeats),
           "--warmup", str(warmup), "--work", json.dumps(asdict(work))]
    if emulate_precision_casts:
        cmd.append("--emulate-precision-casts")
    if save_artifacts:
        cmd += ["--save-artifacts", str(save_artifacts)]
    if load_artifacts:
        cmd += ["--load-artifacts", str(load_artifacts)]
    env = os.environ | cache_env(cache_dir)
    kernels_before = kernel_files(cache_dir)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"helpers.coldstart child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    data = json.loads(lines[-1][len(_MARK):])
    result = ColdStart(process_wall_s=wall, cache_dir=str(cache_dir), **data)
    result.extra["kernel_files_built"] = kernel_files(cache_dir) - kernels_before
    return result


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the fresh process: build, reference eager call, compile, time first and steady calls."""
    t_start = time.perf_counter()
    import torch

    from helpers import compile_tools, measure, params, pipelines

    work = Workload(**json.loads(args.work))
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    pipe = pipelines.build_pipeline(work.model, work.profile, weights=work.weights,
                                    dtype=params.DTYPES[work.dtype], device=device, seed=work.seed,
                                    denoiser_config=work.denoiser_config or None)
    inputs = pipelines.denoiser_inputs(pipe, height=work.height, width=work.width, guidance=work.guidance,
                                       max_sequence_length=work.max_sequence_length, seed=work.seed)
    net = pipelines.denoiser(pipe)
    with torch.inference_mode():
        reference = net(**inputs)[0]
    loaded = False
    if args.load_artifacts:
        loaded = torch.compiler.load_cache_artifacts(Path(args.load_artifacts).read_bytes()) is not None
    if args.how == "full":
        net.compile(fullgraph=True)
    else:
        net.compile_repeated_blocks(fullgraph=True)
    startup = time.perf_counter() - t_start

    def call() -> Any:
        with torch.inference_mode():
            return net(**inputs)[0]

    with compile_tools.precision_casts(args.emulate_precision_casts):
        with compile_tools.counting() as first:
            first_s, out = measure.first_call_seconds(call, device)
        with compile_tools.counting() as later:
            timing = measure.time_callable(call, device, repeats=args.repeats, warmup=args.warmup)
    saved = 0
    if args.save_artifacts:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            Path(args.save_artifacts).write_bytes(artifacts[0])
            saved = len(artifacts[0])
    return {"how": args.how, "first_call_s": first_s, "steady_samples_s": list(timing.samples_s),
            "rel_error": compile_tools.relative_error(out, reference), "graphs": first.graphs,
            "ops_captured": first.ops_captured, "recompiles_after_first": later.graphs, "artifacts_loaded": loaded,
            "artifacts_saved_bytes": saved, "startup_s": startup, "timing_method": timing.method}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process: parse arguments, measure, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--how", choices=HOWS, required=True)
    parser.add_argument("--work", required=True, help="Workload as JSON")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--emulate-precision-casts", action="store_true")
    parser.add_argument("--save-artifacts", default="")
    parser.add_argument("--load-artifacts", default="")
    result = _child(parser.parse_args(argv))
    print(_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
