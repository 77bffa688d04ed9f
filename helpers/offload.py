"""Turn on diffusers' CPU offload modes on a pipeline and report which hooks they installed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

MODES: tuple[str, ...] = ("model", "sequential", "group_block", "group_leaf")
DESCRIPTION: dict[str, str] = {
    "model": "pipe.enable_model_cpu_offload(): one whole component on the accelerator at a time",
    "sequential": "pipe.enable_sequential_cpu_offload(): every leaf module onloaded just before it runs",
    "group_block": "pipe.enable_group_offload(offload_type='block_level'): groups of transformer blocks",
    "group_leaf": "pipe.enable_group_offload(offload_type='leaf_level'): leaf modules, prefetched on a stream",
}


def enable(pipe: Any, mode: str, device: str | torch.device, *, blocks_per_group: int = 1,
           use_stream: bool = True) -> None:
    """Turn on one offload mode: weights rest on the CPU and are onloaded to device when they run."""
    device = torch.device(device)
    if mode == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif mode == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    elif mode in ("group_block", "group_leaf"):
        block = mode == "group_block"
        pipe.enable_group_offload(onload_device=device, offload_device=torch.device("cpu"),
                                  offload_type="block_level" if block else "leaf_level",
                                  num_blocks_per_group=blocks_per_group if block else None,
                                  use_stream=use_stream)
    else:
        raise ValueError(f"mode={mode!r} is not allowed; choose one of: {', '.join(map(repr, MODES))}")


def hook_summary(pipe: Any) -> dict[str, dict[str, Any]]:
    """Per model component: accelerate hooks (count, types), diffusers group-offload hooks, parameter devices."""
    out: dict[str, dict[str, Any]] = {}
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        accel = [type(m._hf_hook).__name__ for m in component.modules() if hasattr(m, "_hf_hook")]
        group = [m for m in component.modules()
                 if getattr(m, "_diffusers_hook", None) is not None
                 and m._diffusers_hook.get_hook("group_offloading") is not None]
        out[name] = {
            "accelerate_hooks": len(accel),
            "accelerate_hook_types": sorted(set(accel)),
            "group_offload_hooks": len(group),
            "parameter_devices": sorted({p.device.type for p in component.parameters()}),
        }
    return out


def describe_error(err: BaseException) -> str:
    """'ExceptionType: first line of the message', short enough for a result row."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300] if text else ''}"


def error_of(fn: Callable[[], Any]) -> str:
    """Call fn; return '' when it succeeds, else describe_error of what it raised."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 the error itself is the fact being recorded
        return describe_error(err)
    return ""


def no_accelerator_reason(mode: str) -> str:
    """Why an offload mode cannot be measured on a machine without a CUDA GPU."""
    return (f"{mode} offload moves weights between CPU memory and an accelerator; this machine has no CUDA GPU, "
            "so there is no accelerator memory to save and no transfer to time (measured on the full profile)")
