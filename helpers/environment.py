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

    def as_table(self) -> list[tuple[str, str]]:
        """Rows of (field, value) for display."""
        rows = [(k, str(v)) for k, v in asdict(self).items() if k != "versions"]
        if self.device == "cpu":
            rows = [(k, "n/a (CPU)") if k == "device_memory_gib" else (k, v) for k, v in rows]
        rows += [(f"version: {k}", v) for k, v in self.versions.items()]
        return rows


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that change the numbers."""
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# Paths a run writes, excluded from the dirty check (git pathspec syntax).
_RUN_OUTPUTS: tuple[str, ...] = (":(exclude)data/results", ":(exclude)figures", ":(exclude)README.md")


def git_revision() -> str:
    """Commit of the project checkout, '+dirty' when tracked code differs from it; 'unknown' outside git.

    What runs write (data/results/, figures/, the README's generated table) does not count as a change: a rerun
    on top of committed results must still name the clean commit it ran."""
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


def _sync(device: torch.device) -> None:
    """Wait for queued work on device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.lru_cache(maxsize=8)
def measure_matmul_peak(device_str: str, dtype: torch.dtype = torch.bfloat16) -> float:
    """Measured dense matmul throughput (TFLOP/s) on device in dtype: the best of several timed runs."""
    device = torch.device(device_str)
    n = 8192 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    for _ in range(3):
        a @ b
    _sync(device)
    reps, best = (20 if device.type == "cuda" else 3), float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - start) / reps)
    return 2 * n**3 / best / 1e12


def environment_card(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> EnvironmentCard:
    """Describe this machine and measure its matmul peak in dtype."""
    is_cuda = device.type == "cuda"
    props = torch.cuda.get_device_properties(device) if is_cuda else None
    peak = measure_matmul_peak(str(device), dtype)
    dname = str(dtype).replace("torch.", "")
    note = (
        f"best of 5 x 20 runs of an 8192^3 {dname} matmul (cuBLAS)" if is_cuda
        else f"best of 5 x 3 runs of a 1024^3 {dname} matmul on {torch.get_num_threads()} CPU threads"
    )
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
        peak_tflops=round(peak, 3),
        peak_dtype=dname,
        peak_note=note,
    )
