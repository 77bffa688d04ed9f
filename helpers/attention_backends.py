"""Which attention kernel ran under diffusers' attention dispatcher (`set_attention_backend`, `attention_backend`).

For each backend diffusers names: why it cannot run here (package missing, a Hub download, diffusers' own checks
on device, dtype and head size, or PyTorch having no such kernel), or, when it runs, two pieces of evidence that
it is what ran: the calls that reached the backend's own function in diffusers' registry, and the attention kernels
the profiler saw. Parity with the default backend cannot show a silent fallback (a fallback to another exact
kernel gives the same numbers); the kernel names can.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from diffusers.models import attention_dispatch as dispatch
from torch.profiler import ProfilerActivity

from helpers import _DropNotice, measure

# set_attention_backend and reset_attention_backend log this notice on every call; a sweep calls them per backend.
logging.getLogger("diffusers.models.modeling_utils").addFilter(
    _DropNotice("Attention backends are an experimental feature"))

BACKENDS: tuple[str, ...] = tuple(b.value for b in dispatch.AttentionBackendName)
# PyTorch's SDPA kernels as the profiler names them (aten level, on every device).
SDPA_KERNELS: tuple[str, ...] = ("aten::_scaled_dot_product_flash_attention",
                                 "aten::_scaled_dot_product_flash_attention_for_cpu",
                                 "aten::_scaled_dot_product_efficient_attention",
                                 "aten::_scaled_dot_product_cudnn_attention",
                                 "aten::_scaled_dot_product_attention_math")
# The kernel each backend that runs through PyTorch must run (a regex on the profiler's names); 'native' lets SDPA
# choose among SDPA_KERNELS, and the packages' backends (flash-attn, sage, xformers, Hub kernels) must run none.
EXPECTED_KERNEL: dict[str, str] = {"_native_flash": r"_scaled_dot_product_flash_attention",
                                   "_native_efficient": r"_scaled_dot_product_efficient_attention",
                                   "_native_cudnn": r"_scaled_dot_product_cudnn_attention",
                                   "_native_math": r"_scaled_dot_product_attention_math",
                                   "flex": r"(?i)flex_?attention",
                                   "native": "|".join(re.escape(k) for k in SDPA_KERNELS)}
# PyTorch SDPA kernels that exist only on CUDA devices (their backend fails elsewhere with torch's generic message).
CUDA_ONLY: dict[str, str] = {"_native_cudnn": "cuDNN attention", "_native_efficient": "memory-efficient attention"}
_ATTENTION_EVENT = re.compile(r"(?i)(scaled_dot_product|flex_?attention|flash_attn|sage|xformers|fmha)")


def hub_repo(backend: str) -> str:
    """The Hugging Face Hub repository a '*_hub' backend downloads its kernel from ('' for other backends)."""
    config = dispatch._HUB_KERNELS_REGISTRY.get(dispatch.AttentionBackendName(backend))
    return config.repo_id if config else ""


def _first_line(err: BaseException) -> str:
    """'ExceptionType: first line of its message'."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def skip_reason(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """Why backend cannot run attention here ('' when it can): a package that is missing, a kernel it would download,
    or a trial call that fails (with what diffusers' own checks refuse here), joined by '; '."""
    name = dispatch.AttentionBackendName(backend)
    try:
        dispatch._check_attention_backend_requirements(name)
        missing = ""
    except RuntimeError as err:
        missing = str(err).strip().splitlines()[0].rstrip(".")
    if hub_repo(backend):
        return (f"downloads its kernel ({hub_repo(backend)}) from the Hugging Face Hub at run time: needs network, "
                f"which the notebooks never use at run time (the project's GPU machines have none), and the `kernels` package"
                f"{' (not installed)' if missing else ''}")
    if missing:
        return missing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex without compile warns; the trial is only whether it runs
            probe = _probe(device, dtype, head_dim)
            dispatch.dispatch_attention_fn(probe, probe, probe, backend=name)
    except Exception as err:  # noqa: BLE001 any failure of the trial call is the reason recorded
        trial = (f"torch {torch.__version__} on {device.type} {str(dtype).removeprefix('torch.')}: "
                 f"{_first_line(err)}")
        if backend in CUDA_ONLY and device.type != "cuda":
            trial = f"needs CUDA: PyTorch's {CUDA_ONLY[backend]} kernel exists only on CUDA GPUs ({trial})"
        return "; ".join([*contract_breaches(backend, device, dtype, head_dim), trial])
    return ""


def _probe(device: torch.device, dtype: torch.dtype, head_dim: int) -> torch.Tensor:
    """A small query/key/value in diffusers' layout (batch, tokens, heads, head_dim)."""
    return torch.zeros(1, 128, 2, head_dim, device=device, dtype=dtype)


def contract_breaches(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> list[str]:
    """What diffusers' own checks of a backend refuse here (device, dtype, head size); they run only when the
    environment sets DIFFUSERS_ATTN_CHECKS, so a backend can run outside what it declares."""
    name = dispatch.AttentionBackendName(backend)
    probe = _probe(device, dtype, head_dim)
    breaches = []
    for check in dispatch._AttentionBackendRegistry._constraints[name]:
        try:
            check(query=probe, key=probe, value=probe, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, _parallel_config=None)
        except (ValueError, RuntimeError) as err:
            breaches.append(f"diffusers' {check.__name__}: {str(err).strip()}")
    return breaches


@contextlib.contextmanager
def dispatch_counter(backend: str) -> Iterator[Counter]:
    """Inside the block, count the calls that reach backend's function in diffusers' registry (counter['calls'])."""
    name = dispatch.AttentionBackendName(backend)
    registry = dispatch._AttentionBackendRegistry._backends
    original = registry[name]
    counter: Counter = Counter()

    @functools.wraps(original)
    def counting(*args: Any, **kwargs: Any) -> Any:
        counter["calls"] += 1
        return original(*args, **kwargs)

    registry[name] = counting
    try:
        yield counter
    finally:
        registry[name] = original


def kernels_seen(fn: Callable[[], Any]) -> tuple[dict[str, int], Any]:
    """Run fn once under the profiler; attention kernels it ran (profiler name -> calls), and fn's result."""
    with measure.quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    seen = Counter(e.name for e in prof.events() if _ATTENTION_EVENT.search(e.name)
                   and e.name != "aten::scaled_dot_product_attention")  # the dispatcher entry, not a kernel
    return dict(sorted(seen.items())), out


def fallback_problem(backend: str, kernels: dict[str, int], dispatched: int) -> str:
    """'' when backend's own function was called and ran the kernel it names; else the silent fallback found."""
    if dispatched == 0:
        return f"{backend}: no call reached the backend's function (the attention processors did not use it)"
    sdpa = sorted(k for k in kernels if k in SDPA_KERNELS)
    expected = EXPECTED_KERNEL.get(backend)
    if expected is None:
        return f"{backend}: PyTorch's SDPA ran ({', '.join(sdpa)}) instead of the backend's kernel" if sdpa else ""
    if not any(re.search(expected, k) for k in kernels):
        return f"{backend}: expected a kernel matching {expected!r}, ran {', '.join(kernels) or 'no attention kernel'}"
    other = [k for k in sdpa if not re.search(expected, k)]
    return f"{backend}: also ran {', '.join(other)}" if other else ""
