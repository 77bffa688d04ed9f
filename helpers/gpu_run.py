"""One GPU run: install the wheel bundle, run a group of notebooks within the time slot, pack what they wrote.

On the GPU host (the device tool runs this in a copy of the working tree, with .whl carried):

    python3 -m helpers.gpu_run G1 --out "$OUT"          # or: bash tools/gpu_run.sh G1 "$OUT"

Back here, unpack what came back into data/results/<hw>/ and figures/<hw>/ (rows are appended, never replaced):

    .venv/bin/python -m helpers.gpu_run merge /path/to/G1.tar.gz

The groups and their estimates are in docs/gpu-plan.md. This module imports only the standard library at the
top, so that a bad group or a missing bundle is refused before anything is installed or built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import kernel_env

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / ".whl"
BUDGET_S = 540  # the device tool ends a command at 600 s; stop starting notebooks before 9 minutes
MAX_FILE_MIB = 16  # the device tool brings back files of at most 16 MiB


@dataclass(frozen=True)
class Job:
    """One notebook run of a group: its parameters beyond PROFILE and its estimated GPU seconds (docs/gpu-plan.md)."""

    notebook: str
    estimate_s: int
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """File stem of the executed copy: the notebook plus the values that make this run differ (e.g. '.sdxl',
        '.cap24gib' for GPU_MEMORY_GIB=24, '.skips-eager' for SKIP_PARTS=['eager'])."""
        p = self.parameters
        return (self.notebook + (f".{p['MODEL']}" if "MODEL" in p else "")
                + (f".cap{p['GPU_MEMORY_GIB']:g}gib" if p.get("GPU_MEMORY_GIB") is not None else "")
                + (".skips-" + "-".join(s.replace(" ", "-") for s in p["SKIP_PARTS"]) if p.get("SKIP_PARTS") else ""))


# Groups in the order first planned; LEASES below runs them: after G1 and G2, the groups that answer the most
# published comparisons first (G5a + G5b: eleven; G8 + G3e, G6a + G3b: three each; G4b: two), then those that check
# claims on the full profile without one. Group names stay as first planned: the rows and notes of earlier runs name
# them. docs/gpu-plan-estimates.md gives each estimate's basis (published seconds and FLOPs). A reduced full-profile
# setting is always a notebook parameter, so it lands in the rows (steps, warm-up, samples, knobs) and in the
# executed notebook's injected-parameters cell.
GROUPS: dict[str, list[Job]] = {
    # 03 times eager beside every compiled mode (7 more eager pipelines per mode, ~50 s); 04 runs a fifth process
    # that compiles both ways from warm caches and times eager/full/regional in turn (~80 s)
    # H200 (2026-11-26): 84 s, 350 s; H100 (2026-11-28): 89 s, and 03 stopped by the budget after 362 s
    "G1": [Job("00_setup_and_baseline", 90), Job("03_torch_compile", 420, {"MODES": ["default"]})],
    "G2": [Job("04_regional_compilation", 360)],  # 319 s measured on an H200 before its pipe(...) cell
    "G5a": [Job("08_cpu_offload", 300, {"OFFLOAD_MODES": ["model"], "OFFLOAD_REPEATS": 1})],
    "G5b": [Job("09_nf4_quantization", 450, {"REPEATS": 3, "WARMUP": 1})],
    # 12, not timed on a GPU yet: each stage builds the pipeline and compiles the 12B DiT anew (~70 s cold, less
    # from the cache the stage before it filled), then times 4 images and 4 steps; max-autotune and the AOTInductor
    # package are the long ones, so they get a command of their own
    "G6a": [Job("12_maximum_speed", 500, {"LEVERS": ["cudnn-attention", "compile", "fused-qkv", "fp8"],
                                          "REPEATS": 3, "WARMUP": 1})],
    # SDXL's 01 and 02 answer one published comparison each; apart, each pairs with a long group in one lease
    "G3b": [Job("01_dtype", 180, {"MODEL": "sdxl"})],
    # 14, not timed on a GPU yet: two threshold caches at three thresholds, three step counts and two timed calls per
    # setting keep it in one command; the waterfall compiles the 12B DiT's blocks and recompiles them per lever
    # (docs/gpu-plan-estimates.md, G8)
    "G8": [Job("14_caching_attention_steps", 470, {"CACHES": ["first-block", "mag"], "THRESHOLDS": [0.0, 0.1, 0.2],
                                                   "STEP_COUNTS": [28, 12, 4], "REPEATS": 2, "WARMUP": 0})],
    "G3e": [Job("02_attention_sdpa", 155, {"MODEL": "sdxl"})],
    "G3c": [Job("02_attention_sdpa", 360)],
    # 10's fp8-base section (an fp8 DiT with the LoRA swapped in, compiled) is left to G0's smoke check on CUDA: at
    # full size it would add an fp8 quantization and a compile to a group estimated without them
    "G4b": [Job("10_lora_hotswap", 500, {"FP8_BASE": False})],  # +90 s: the timed graph compiles again
    "G3a": [Job("05_dynamic_shapes", 400)],
    "G6b": [Job("12_maximum_speed", 520, {"LEVERS": ["cudnn-attention", "compile", "fused-qkv", "fp8", "aoti"],
                                          "REPEATS": 2, "WARMUP": 1})],
    # 13 on one GPU: the split rows are recorded as skipped (the hosts have one GPU each); it builds Flux-1-Dev and
    # times the single-GPU step the scaling model needs (not timed on a GPU yet)
    "G7": [Job("13_beyond_one_gpu", 200)],
    "G4a": [Job("06_graph_breaks", 200), Job("07_scheduler_syncs", 200, {"STEPS": 10})],
    # 01 on Flux: an fp32 image is ~71 s on an H100's CUDA cores (estimate), and the profile's timing makes eight;
    # one timed call after the reference (which warms the fp32 path) keeps it to ~3 fp32 images
    "G3d": [Job("01_dtype", 380, {"REPEATS": 1, "WARMUP": 0})],
    # 16, not timed on a GPU yet: one model per command, its levers in the order a short lease must not miss (compile
    # first: its step speedup answers the Qwen-Image comparison); each probe compiles the 20-32B DiT anew with inductor
    # (~70 s whole, ~20 s by region, estimated from Flux-1-Dev's on the H200) and rebuilds it after a quantization.
    # New resolution, LoRA on FLUX.2, the offloads and NF4 wait for a later lease (docs/gpu-plan.md, G9a and G9b)
    "G9a": [Job("16_does_it_transfer", 420, {"MODEL": "qwen-image", "REPEATS": 3, "WARMUP": 1, "LEVERS": [
        "compile", "regional compile", "first-block cache", "mag cache", "taylorseer cache", "pab cache",
        "faster cache", "attention backends", "fp8", "int8", "lora hot-swap"]})],
    "G9b": [Job("16_does_it_transfer", 350, {"MODEL": "flux2-dev", "REPEATS": 3, "WARMUP": 1, "LEVERS": [
        "compile", "regional compile", "first-block cache", "mag cache", "taylorseer cache", "pab cache",
        "faster cache", "attention backends", "fp8", "int8"]})],
    # 15, the collection's headline (not timed on a GPU yet), estimated from the H200 rows of 00, 03 and 04 (eager
    # image 5.1 s, compiled 3.9 s, regional cold compile 15.5 s): the pipeline built (~25 s), eager and the recipe
    # timed in turn (3 rounds, ~27 s), four lossy settings each on a fresh pipeline (~20 s to build, a compile of
    # 15-30 s, 4 images: ~190 s in all), and the cold and warm processes (each ~40 s to start and build, a compile
    # cold or from artifacts, 3 images: ~125 s); docs/gpu-plan.md, G10
    "G10": [Job("15_the_recipe", 480, {"REPEATS": 2, "WARMUP": 1})],
    # 08 and 09 on a smaller card's memory (GPU_MEMORY_GIB, fit.apply_cap), not timed on a GPU yet: the parts
    # helpers.fit skips there (08 at 24 GiB: the no-offload reference; 09 at 16 GiB: the reference and NF4 alone) are
    # rows with their reason, the rest runs. Estimates (docs/gpu-plan.md, G5c and G5d): G5a's 300 s less the
    # reference's timings, plus block-level group offload eager (3 calls at ~2x model offload's 21.5 s) and the
    # full-size random pipeline built in CPU memory four times, drawn on the GPU (~30 s each, not measured); 09: G5b's 450 s less the
    # reference and NF4-alone timings, with one timed call per setting
    "G5c": [Job("08_cpu_offload", 480, {"GPU_MEMORY_GIB": 24, "OFFLOAD_MODES": ["model", "group_block"],
                                        "VARIANTS": ["eager"], "OFFLOAD_REPEATS": 1})],
    "G5d": [Job("09_nf4_quantization", 360, {"GPU_MEMORY_GIB": 16, "REPEATS": 1, "WARMUP": 1})],
    # Further than the guide: Flux-1-Dev at 1024x1024, 28 steps on a 12 GB card's memory (an RTX 3060), with group
    # offload at block and at leaf level, prefetching on a CUDA stream (08's USE_STREAM); each mode's peak is the
    # smallest cap it could run under. Estimated, not timed: four builds of the pipeline in CPU memory (~30 s each),
    # three eager calls per mode at about twice model offload's 21.5 s (the guide's H100 figure: ~130 s a mode), and
    # the dynamo traces of section 4 (~60 s)
    "G5e": [Job("08_cpu_offload", 480, {"GPU_MEMORY_GIB": 12, "OFFLOAD_MODES": ["group_block", "group_leaf"],
                                        "VARIANTS": ["eager"], "OFFLOAD_REPEATS": 1})],
}

# G0, the GPU check: every notebook once on CUDA on the smoke profile, several at a time, before any full-size group.
# It is not a published workload (its rows are never compared: they are merged into data/gpu-check/, which the report
# does not read); it runs the code paths that exist only on a GPU (bitsandbytes' CUDA NF4 kernels, offload hooks
# that move weights, torchao int8 and fp8, the SDPA / cuDNN / flash attention backends, CUDA graphs, the AOTInductor
# package), so a full-size lease never dies on one of them. The smoke Flux meets those kernels' shape rules (every
# linear's width a multiple of 16, as fp8's _scaled_mm needs; heads of 16, a multiple of 8, as the flash and cuDNN
# kernels need), and it is the trained model, so the images the GPU paths draw are judged as digits there too.
# Its first run in one command (G0, H100, 2026-11-28, 4 at a time on 16 cores) ran out of its 300 s: on CUDA the
# smoke notebooks compile Triton kernels and autotune, and took longer than on the 2-core CPU (03: 102 s, 05: 132 s
# against 90 and 60; 04 and 15 past 296 s; 12 failed after 188 s). So the check is two commands, G0a (the notebooks
# that did not start) and G0b (those that started), and the slow parts that are no GPU-only path are cut: 04 on 2 + 4
# blocks (as its CPU test), 12 without max-autotune and the inductor flags (GEMM autotuning: 151 s of its first
# cell) and without Going deeper's cold compiles, 15 with fp8 as its one lossy setting. Estimates: the seconds that
# run measured where a notebook finished (03, 05), else above what it ran before the deadline, else 2.5 times the
# notebook's smoke seconds on the 2-core CPU (05's ratio, 132 s against 60 s, rounded up; 15 ran past 296 s against
# its 120 s, so 2.5 may still fall short: the budget stops a notebook and keeps its rows). 10 ran 108 s into its
# fp8 cell before G0's deadline: 200 s. 12 compiles the whole denoiser cold for its AOTInductor package, which took
# 04's cold compile 105 s on the H100, on top of its 2.5 x 72 s ladder: 330 s.
CHECK_GROUPS: tuple[str, ...] = ("G0a", "G0b")
CHECK_BUDGET_S = 360
PARALLEL: dict[str, int] = {g: 4 for g in CHECK_GROUPS}
_SMOKE = {"PROFILE": "smoke"}
GROUPS["G0a"] = ([Job(nb, est, _SMOKE) for nb, est in {
    "00_setup_and_baseline": 75, "01_dtype": 100, "02_attention_sdpa": 100, "06_graph_breaks": 115,
    "07_scheduler_syncs": 75, "08_cpu_offload": 150, "09_nf4_quantization": 75, "13_beyond_one_gpu": 100}.items()]
                 + [Job(nb, 100, _SMOKE | {"MODEL": "sdxl"}) for nb in ("01_dtype", "02_attention_sdpa")]
                 # 16: the levers whose code differs on a GPU (fp8, bitsandbytes NF4, offload hooks that move
                 # weights, the CUDA attention backends), on its three smoke models
                 + [Job("16_does_it_transfer", 150, _SMOKE | {"LEVERS": [
                     "int8", "fp8", "nf4", "model offload", "group offload", "attention backends"]})])
GROUPS["G0b"] = [Job("03_torch_compile", 102, _SMOKE), Job("04_regional_compilation", 150, _SMOKE | {"BLOCKS": [2, 4]}),
                 Job("05_dynamic_shapes", 132, _SMOKE), Job("10_lora_hotswap", 200, _SMOKE),
                 Job("12_maximum_speed", 330, _SMOKE | {"COMPARE_REGIONAL": False, "LEVERS": [
                     "cudnn-attention", "channels-last", "compile", "fused-qkv", "vae-compile", "int8", "fp8",
                     "aoti"]}),
                 Job("14_caching_attention_steps", 150, _SMOKE), Job("15_the_recipe", 240, _SMOKE | {"LOSSY": ["fp8"]})]
# (08 and 09 with SKIP_PARTS, the path without a reference on CUDA, are left to G5c and G5d at full size)


def check_wall_s(group: str) -> float:
    """Estimated wall seconds of a parallel group: longest-first onto PARALLEL workers (list scheduling)."""
    workers = [0.0] * PARALLEL.get(group, 1)
    for est in sorted((j.estimate_s for j in GROUPS[group]), reverse=True):
        workers[workers.index(min(workers))] += est
    return max(workers)


# The commands of one lease, in the order they are run. A lease holds 900 s of device time: about 35 s go to the
# machine's start, about 15 s between the two commands, about 30 s to the second command's install, packing and
# return, and 40 s are left for estimates that run long; so a lease's estimates sum to at most LEASE_S
# (docs/gpu-plan.md, "The leases"). Each long group is paired with a short one.
LEASE_S = 780
# The leases run so far, as docs/gpu-plan.md's table lists them (G0 was the GPU check in one command; it is now
# G0a and G0b). G1 ran in lease 2 on an H100 and stopped in 03 before its emulated default mode: it runs again last.
LEASES_DONE: list[tuple[str, ...]] = [("G1", "G2"), ("G0", "G1")]
# The leases to come, in order: the GPU check in two commands first; then G10 (notebook 15, the headline) with G7.
LEASES: list[tuple[str, ...]] = [("G0a", "G0b"), ("G10", "G7"), ("G5a", "G5b"), ("G8", "G3e"), ("G6a", "G3b"),
                                 ("G4b",), ("G6b",), ("G3a", "G3d"), ("G3c", "G2"), ("G9a", "G9b"), ("G5c",),
                                 ("G4a", "G5d"), ("G5e",), ("G1",)]
RERUNS = {"G1", "G2"}  # run again at the current revision: the committed copies come from older ones


def lease_estimate_s(lease: tuple[str, ...]) -> float:
    """Estimated device seconds of a lease's commands (a parallel group counts its wall estimate)."""
    return sum(check_wall_s(g) if g in PARALLEL else sum(j.estimate_s for j in GROUPS[g]) for g in lease)


class UsageError(ValueError):
    """The command line names something this script cannot run."""


def check_group(group: str) -> list[Job]:
    """The jobs of group, or an error naming the known groups."""
    if group not in GROUPS:
        raise UsageError(f"unknown group {group!r}; known groups: {', '.join(GROUPS)} (see docs/gpu-plan.md)")
    return GROUPS[group]


def check_bundle(bundle: Path = BUNDLE) -> list[Path]:
    """The bundle's wheels, or an error saying how to build and carry them."""
    wheels = sorted(bundle.glob("*.whl"))
    if not wheels or not (bundle / "MANIFEST.txt").exists():
        raise UsageError(f"no wheel bundle in {bundle}: build it on the development machine with `make gpu-bundle` "
                         f"and carry it (device run: carry=['.whl'])")
    return wheels


def install(wheels: list[Path], site: Path) -> dict[str, str]:
    """pip-install the wheels into site exactly as the GPU host does; the environment the notebooks must see."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)], check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["MPLBACKEND"] = "Agg"
    env["PYTHONUNBUFFERED"] = "1"
    # --no-compile leaves the bundle without .pyc, so Python compiles torchao on import and prints its
    # "invalid escape sequence" SyntaxWarnings into every executed copy (seen on the H200, 2026-11-26)
    env["PYTHONWARNINGS"] = ",".join(w for w in [env.get("PYTHONWARNINGS"), "ignore::SyntaxWarning"] if w)
    env = kernel_env.quiet_progress(env)  # executed copies without stored progress bars
    if (BUNDLE / "REVISION").exists():  # the commit the bundle was made at; the host's .git may be stale
        env["FASTDIFF_GIT_REV"] = (BUNDLE / "REVISION").read_text().strip()
    kernels = site.parent / f"{site.name}-kernels"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(kernels), "--name", "python3"],
                   check=True, env=env, capture_output=True)
    env["JUPYTER_PATH"] = str(kernels / "share" / "jupyter")
    return env


def rehearsal_parameters(notebook: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A job's parameters for the CPU rehearsal (--profile smoke): a GPU_MEMORY_GIB cap, which a machine without CUDA
    refuses, becomes the SKIP_PARTS the cap's decision gives on the full profile, so the rehearsal takes the path the
    capped run takes (notebooks 08 and 09)."""
    if parameters.get("GPU_MEMORY_GIB") is None:
        return parameters
    from helpers import fit  # torch-heavy: only where a cap is rehearsed

    cap = float(parameters["GPU_MEMORY_GIB"])
    decision = fit.decide(notebook, parameters.get("MODEL", "flux-dev"), cap, cap)
    rest = {k: v for k, v in parameters.items() if k != "GPU_MEMORY_GIB"}
    return rest | ({"SKIP_PARTS": sorted(decision.skipped)} if decision.skipped else {})  # SKIP_PARTS=[] is refused


def run_job(job: Job, profile: str, work: Path, env: dict[str, str], deadline: float) -> str:
    """Execute one notebook with papermill in its own process group, killed at the deadline; its status line."""
    executed = work / "executed"
    executed.mkdir(parents=True, exist_ok=True)
    params = {"PROFILE": profile, "RESULTS_DIR": str(work / "results"), "FIGURES_DIR": str(work / "figures")}
    params |= rehearsal_parameters(job.notebook, job.parameters) if profile == "smoke" else job.parameters
    pfile = work / f"{job.label}.params.json"
    pfile.write_text(json.dumps(params))
    cmd = [sys.executable, "-m", "papermill", str(ROOT / "notebooks" / f"{job.notebook}.ipynb"),
           str(executed / f"{job.label}.ipynb"), "-f", str(pfile), "--kernel", "python3",
           "--cwd", str(ROOT / "notebooks"), "--no-progress-bar", "--log-level", "WARNING"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=max(1.0, deadline - t0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return f"stopped at the deadline after {time.monotonic() - t0:.0f} s (rows written so far are kept)"
    return f"{'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - t0:.0f} s"


def row_summary(results: Path) -> list[str]:
    """One line per rows file: how many rows of each status."""
    lines = []
    for path in sorted(results.glob("*/*.jsonl")):
        counts: dict[str, int] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                status = json.loads(line).get("status", "?")
                counts[status] = counts.get(status, 0) + 1
        lines.append(f"{path.parent.name}/{path.name}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return lines


def pack(work: Path, out: Path, group: str) -> Path:
    """Write results, executed notebooks and figures of the run as one archive under out."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{group}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for sub in ("results", "executed", "figures"):
            if (work / sub).exists():
                tar.add(work / sub, arcname=sub)
    return archive


def run_group(group: str, out: Path, *, profile: str = "full", budget_s: float = BUDGET_S,
              site: Path | None = None, bundle: Path = BUNDLE) -> int:
    """Install the bundle, run the group's notebooks while time is left, pack the results; 0 when all ran ok."""
    start = time.monotonic()
    jobs = check_group(group)
    wheels = check_bundle(bundle)
    deadline = start + budget_s
    site = site or Path(tempfile.gettempdir()) / "site"
    env = install(wheels, site)
    work = Path(tempfile.mkdtemp(prefix=f"gpu-run-{group}-"))
    lines = [(f"group {group}, profile {profile}, budget {budget_s:.0f} s, revision "
              f"{env.get('FASTDIFF_GIT_REV', 'from git')}, bundle installed in {time.monotonic() - start:.0f} s, "
              f"C++ compiler (AOTInductor) {shutil.which(os.environ.get('CXX', 'g++')) or 'none'}")]
    print(lines[0], flush=True)
    def one(job: Job) -> str:
        left = deadline - time.monotonic()
        if job.estimate_s > left:
            return f"not started: {left:.0f} s left, estimated {job.estimate_s} s (run it in the next command)"
        print(f"=== {job.label} {job.parameters or ''} (estimate {job.estimate_s} s, {left:.0f} s left)", flush=True)
        status = run_job(job, profile, work, env, deadline)
        print(f"{job.label}: {status}", flush=True)
        return status

    workers = PARALLEL.get(group, 1)
    if workers > 1:  # longest first, so the long notebooks do not start last
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            futures = {j.label: pool.submit(one, j) for j in sorted(jobs, key=lambda j: -j.estimate_s)}
        statuses = {label: f.result() for label, f in futures.items()}
    else:
        statuses = {j.label: one(j) for j in jobs}
    all_ok = all(st.startswith("ok") for st in statuses.values())
    lines += [f"{j.label}: {statuses[j.label]}" for j in jobs]
    lines += ["rows:"] + row_summary(work / "results")
    archive = pack(work, out, group)
    size = archive.stat().st_size / 2**20
    lines.append(f"archive {archive.name}: {size:.1f} MiB{' (OVER the device tool limit)' if size > MAX_FILE_MIB else ''}"
                 f"; total {time.monotonic() - start:.0f} s")
    (out / f"{group}.summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(["", "summary:"] + lines), flush=True)
    return 0 if all_ok else 1


def merge(archive: Path, results_dir: Path | None = None, figures_dir: Path | None = None) -> list[str]:
    """Unpack a run's archive into the project: rows appended (lines already present skipped), executed copies
    added (an existing copy moved to executed/previous/), figures copied. Returns what was done, a line each.

    The GPU check (G0a.tar.gz, G0b.tar.gz; G0.tar.gz before) goes to data/gpu-check/ (rows, executed copies,
    figures/), which the report never reads: its smoke-profile rows check the GPU code paths, not a published
    workload."""
    from helpers import paths, results  # here: the host needs no pandas before install

    if Path(archive).name.startswith(tuple(f"{g}." for g in ("G0", *CHECK_GROUPS))):
        results_dir = results_dir or paths.DATA_DIR / "gpu-check"
        figures_dir = figures_dir or paths.DATA_DIR / "gpu-check" / "figures"
    results_dir, figures_dir = results_dir or paths.RESULTS_DIR, figures_dir or paths.FIGURES_DIR
    done = []
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tmp = Path(tmp)
        hardware = sorted({p.parent.name for p in (tmp / "results").glob("*/*.jsonl")})
        for path in sorted((tmp / "results").glob("*/*.jsonl")):
            dest = results_dir / path.parent.name / path.name
            have = set(dest.read_text().splitlines()) if dest.exists() else set()
            new = [json.loads(line) for line in path.read_text().splitlines() if line.strip() and line not in have]
            if new:
                results.append_rows(dest, new)
            done.append(f"{paths.relative(dest)}: {len(new)} rows appended")
        if len(hardware) == 1:
            executed = results_dir / hardware[0] / "executed"
            for nb in sorted((tmp / "executed").glob("*.ipynb")):
                executed.mkdir(parents=True, exist_ok=True)
                results.set_aside(executed / nb.name)
                shutil.copy2(nb, executed / nb.name)
                results.strip_root(executed / nb.name)  # the host's folder, as reproduce strips this machine's
                done.append(f"{paths.relative(executed / nb.name)}: executed copy")
        for fig in sorted((tmp / "figures").glob("*/*")):
            dest = figures_dir / fig.parent.name / fig.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(fig, dest)
            done.append(f"{paths.relative(dest)}: figure")
    return done


def main(argv: list[str] | None = None) -> int:
    """Command line: `GROUP --out DIR` runs a group; `merge ARCHIVE` brings its results into the project."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("group", help=f"one of {', '.join(GROUPS)}, or 'merge'")
    ap.add_argument("archive", nargs="?", help="merge: the .tar.gz a run wrote")
    ap.add_argument("--out", type=Path, help="folder for the archive and summary (the device tool's $OUT)")
    ap.add_argument("--profile", default="full", choices=("full", "smoke"), help="smoke: the CPU rehearsal")
    ap.add_argument("--budget", type=float, default=None,
                    help=f"seconds before no notebook is started (default {BUDGET_S}; {CHECK_BUDGET_S} for "
                         f"{' and '.join(CHECK_GROUPS)})")
    ap.add_argument("--site", type=Path, help="where the bundle is installed (default: <tmp>/site)")
    args = ap.parse_args(argv)
    try:
        if args.group == "merge":
            if not args.archive:
                raise UsageError("merge needs the archive a run wrote, e.g. merge /path/to/G1.tar.gz")
            print("\n".join(merge(Path(args.archive))))
            return 0
        check_group(args.group)
        if args.out is None:
            raise UsageError("--out DIR is required (on the device machine: --out \"$OUT\")")
        budget = args.budget if args.budget is not None else CHECK_BUDGET_S if args.group in CHECK_GROUPS else BUDGET_S
        return run_group(args.group, args.out, profile=args.profile, budget_s=budget, site=args.site)
    except UsageError as err:
        print(f"gpu_run: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
