"""The environment card: which device, which versions, and the matmul peak measured here."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

from helpers import paths

LIBRARIES: tuple[str, ...] = (
    "torch", "diffusers", "transformers", "peft", "bitsandbytes", "accelerate", "triton", "numpy",
)


@dataclass(frozen=True)
class EnvironmentCard:
    """What this run executes on; printed first by every notebook and stored with every row."""

    hardware: str
    device: str
    device_name: str
    device_memory_gib: float
    cpu: str
    cpu_cores: int
    python: str
    cuda: str
    cudnn: str
    versions: dict[str, str]
    git_rev: str
    peak_tflops: float
    peak_dtype: str
    peak_note: str
    memory_cap: str = ""  # GPU_MEMORY_GIB as applied (helpers.fit.Cap), '' when the whole GPU is used

    def as_table(self) -> list[tuple[str, str]]:
        """Rows of (label, value) for display: each field under its CARD_LABELS label, then 'version: <library>'."""
        rows = [(CARD_LABELS.get(k, k), str(v)) for k, v in asdict(self).items() if k != "versions"]
        if self.device == "cpu":
            rows = [(k, "n/a (CPU)") if k == CARD_LABELS["device_memory_gib"] else (k, v) for k, v in rows]
        rows += [(f"version: {k}", v) for k, v in self.versions.items() if k != "cuda"]  # 'cuda' is a field above
        return rows


# The card's fields as a learner reads them (the rows keep the field names).
CARD_LABELS: dict[str, str] = {
    "hardware": "hardware (results folder)", "device": "torch device", "device_name": "device name",
    "device_memory_gib": "GPU memory (GiB)", "cpu": "CPU", "cpu_cores": "CPU cores", "python": "Python",
    "cuda": "CUDA", "cudnn": "cuDNN", "git_rev": "git revision", "peak_tflops": "measured matmul peak (TFLOP/s)",
    "peak_dtype": "peak measured in", "peak_note": "how the peak was measured", "memory_cap": "GPU memory cap",
}


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that change the numbers, and the CUDA that torch was built with."""
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["cuda"] = torch.version.cuda or "none"
    return out


# Paths a run writes, excluded from the dirty check (git pathspec syntax).
_RUN_OUTPUTS: tuple[str, ...] = (":(exclude)data/results", ":(exclude)figures", ":(exclude)README.md")


# Set by the GPU run script from .whl/REVISION: the GPU host's copy of the tree may carry no .git, or an older one
# (on 2026-11-26 it named 63970a9b374f+dirty while the tree of c069eed4059b ran), so the bundle's commit wins.
GIT_REV_ENV = "FASTDIFF_GIT_REV"


def git_revision() -> str:
    """$FASTDIFF_GIT_REV where set (what the GPU run script read from .whl/REVISION); else the checkout's commit,
    '+dirty' when tracked code differs from it; outside git, 'unknown'.

    What runs write (data/results/, figures/, the README's generated table) does not count as a change: a rerun
    on top of committed results must still name the clean commit it ran."""
    if os.environ.get(GIT_REV_ENV):
        return os.environ[GIT_REV_ENV]
    if not (paths.ROOT / ".git").exists():
        return "unknown"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=paths.ROOT, capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_RUN_OUTPUTS], cwd=paths.ROOT,
            capture_output=True, check=False,
            text=True, timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware_slug(device: torch.device) -> str:
    """Short folder name for the hardware: 'cpu', 'h100-80gb', 'h200', ..."""
    if device.type != "cuda":
        return "cpu"
    words = [w for w in re.split(r"[\s_-]+", torch.cuda.get_device_name(device).lower())
             if w and w not in ("nvidia", "geforce", "tesla")]
    memory = [i for i, w in enumerate(words) if re.fullmatch(r"\d+gb", w)]
    digits = [i for i, w in enumerate(words) if re.search(r"\d", w)]
    end = memory[0] + 1 if memory else (digits[0] + 1 if digits else len(words))
    return "-".join(re.sub(r"[^a-z0-9]", "", w) for w in words[:end]) or "cuda"


def _cpu_name() -> str:
    """The processor's model name where Linux tells it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The CPU features that change what a CPU run computes: oneDNN's bf16/fp16 kernels, bitsandbytes' AVX512 paths.
_CPU_FLAGS_OF_NOTE: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16",
                                        "amx_fp16", "amx_tile")


def cpu_note() -> str:
    """One line on the CPU a run's arithmetic depends on: name, cores, torch's capability, the flags of note, and
    whether bf16 is native (what DTYPE='auto' picks) and bitsandbytes' AVX512-BF16 path is taken."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    of_note = [flag for flag in _CPU_FLAGS_OF_NOTE if flag in flags] or ["(no /proc/cpuinfo flags)"]
    bf16 = "yes" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no"
    try:
        import bitsandbytes.functional as bnbf
        bnb = "yes" if bnbf.has_avx512bf16() else "no"
    except Exception as err:  # noqa: BLE001 - a missing or broken bitsandbytes is itself the note
        bnb = f"n/a ({type(err).__name__})"
    return (f"CPU: {_cpu_name()}, {os.cpu_count()} cores; torch capability {torch.backends.cpu.get_cpu_capability()}; "
            f"flags {' '.join(of_note)}; native bf16 (DTYPE='auto' -> bf16): {bf16}; "
            f"bitsandbytes AVX512-BF16 path: {bnb}")


def _sync(device: torch.device) -> None:
    """Wait for queued work on device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Square matmul sizes tried for the peak. On a GPU one large size saturates the tensor cores. On a CPU the best
# size depends on the kernel PyTorch picks for the dtype: oneDNN/MKL's blocked kernels are fastest at the largest
# size, but a dtype the CPU has no native instructions for (bf16 or fp16 on an AVX2-only processor) runs an
# unblocked fallback whose throughput collapses once the operands leave the cache, so several sizes are timed.
CPU_SIZES: tuple[int, ...] = (128, 256, 512, 1024)
CPU_BUDGET_S = 0.5  # timed seconds per size on a CPU, at least one call
SLOW_CALL_S = 1.0  # on a CPU, a size whose one call takes longer than this is the last one tried


@dataclass(frozen=True)
class MatmulPeak:
    """Measured dense matmul throughput and how it was measured."""

    tflops: float
    size: int
    note: str


def _time_matmul(n: int, device: torch.device, dtype: torch.dtype, rounds: int, reps: int | None) -> float:
    """Best seconds per call of an n x n x n matmul over rounds of reps calls (reps=None: what fits the CPU budget)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    start = time.perf_counter()
    a @ b  # warm-up: picks and loads the kernel
    _sync(device)
    first = time.perf_counter() - start
    if reps is None:  # CPU: about the budget in all; a call slower than SLOW_CALL_S is timed once, by its warm-up
        if first > SLOW_CALL_S:
            return first
        reps = max(1, int(CPU_BUDGET_S / rounds / max(first, 1e-6)))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - start) / reps)
    return best


@functools.lru_cache(maxsize=8)
def measure_matmul_peak(device_str: str, dtype: torch.dtype = torch.bfloat16) -> MatmulPeak:
    """Measured dense matmul throughput (TFLOP/s) on device in dtype: the best timed size and run."""
    device = torch.device(device_str)
    dname = str(dtype).replace("torch.", "")
    if device.type == "cuda":
        n = 8192
        seconds = _time_matmul(n, device, dtype, rounds=5, reps=20)
        return MatmulPeak(2 * n**3 / seconds / 1e12, n, f"best of 5 x 20 runs of an 8192^3 {dname} matmul (cuBLAS)")
    timed: dict[int, float] = {}
    for n in CPU_SIZES:
        seconds = _time_matmul(n, device, dtype, rounds=3, reps=None)
        timed[n] = 2 * n**3 / seconds / 1e12
        if seconds > SLOW_CALL_S:
            break
    n = max(timed, key=timed.get)
    tried = ", ".join(f"{k}^3: {v * 1e3:.3g}" for k, v in timed.items())
    return MatmulPeak(timed[n], n, f"best {dname} matmul over square sizes on {torch.get_num_threads()} CPU threads, "
                                   f"each timed for ~{CPU_BUDGET_S:g} s (GFLOP/s {tried})")


def environment_card(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> EnvironmentCard:
    """Describe this machine and measure its matmul peak in dtype."""
    is_cuda = device.type == "cuda"
    props = torch.cuda.get_device_properties(device) if is_cuda else None
    peak = measure_matmul_peak(str(device), dtype)
    return EnvironmentCard(
        hardware=hardware_slug(device),
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if is_cuda else _cpu_name(),
        device_memory_gib=round(props.total_memory / 2**30, 1) if props else 0.0,
        cpu=_cpu_name(),
        cpu_cores=os.cpu_count() or 0,
        python=f"{sys.version.split()[0]} ({sys.executable})",
        cuda=torch.version.cuda or "none",
        cudnn=str(torch.backends.cudnn.version()) if is_cuda else "none",
        versions=library_versions(),
        git_rev=git_revision(),
        peak_tflops=float(f"{peak.tflops:.4g}"),
        peak_dtype=str(dtype).replace("torch.", ""),
        peak_note=peak.note,
    )
