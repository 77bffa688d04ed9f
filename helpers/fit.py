"""GPU memory: the cap a run may use (GPU_MEMORY_GIB), so a big GPU stands for a smaller card's memory.

`check_cap` validates the parameter before anything is built; `apply_cap` sets the CUDA caching allocator's limit
so that the allocator plus the CUDA context (which lives outside the allocator) use at most the cap, as on a card
of that size. A cap stands for a card's memory, never for its speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2**30


class CapError(ValueError):
    """GPU_MEMORY_GIB has a value this machine cannot honour."""


@dataclass(frozen=True)
class Cap:
    """A memory cap as applied: the card size it stands for, the CUDA context's share, the allocator's limit."""

    cap_gib: float
    total_gib: float
    context_gib: float
    allocator_gib: float

    def __str__(self) -> str:
        return (f"capped at {self.cap_gib:g} GiB of {self.total_gib:.1f} GiB (allocator {self.allocator_gib:.2f} GiB "
                f"+ CUDA context {self.context_gib:.2f} GiB)")


def check_cap(value: object, total_gib: float) -> float | None:
    """GPU_MEMORY_GIB as a float, or None (no cap); an error naming what is allowed when it cannot be honoured.

    total_gib is the GPU's memory (0 without a CUDA GPU)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CapError(f"GPU_MEMORY_GIB={value!r} is not allowed; use None (all of the GPU) or a number of GiB > 0, "
                       f"e.g. 24 for an RTX 4090's memory")
    if total_gib <= 0:
        raise CapError(f"GPU_MEMORY_GIB={value!r} caps a CUDA GPU's memory, and no CUDA GPU is visible here; "
                       f"use None")
    if value > total_gib:
        raise CapError(f"GPU_MEMORY_GIB={value!r} is more than this GPU's {total_gib:.1f} GiB; use None or a "
                       f"number up to {total_gib:.1f}")
    return float(value)


def context_gib(device: int = 0) -> float:
    """GiB the CUDA context holds on device outside PyTorch's allocator (driver, kernels), after initialising it."""
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    return max(0.0, (total - free - torch.cuda.memory_reserved(device)) / GIB)


def apply_cap(cap_gib: float, device: int = 0) -> Cap:
    """Limit the caching allocator so that it and the CUDA context fit in cap_gib; allocations past it raise
    torch.OutOfMemoryError as on a card of that size."""
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    ctx = context_gib(device)
    allocator = cap_gib - ctx
    if allocator <= 0:
        raise CapError(f"GPU_MEMORY_GIB={cap_gib:g} leaves nothing beside the CUDA context ({ctx:.2f} GiB)")
    torch.cuda.set_per_process_memory_fraction(min(1.0, allocator / total), device)
    return Cap(cap_gib, total, ctx, allocator)
