"""Attention implementations for notebook 02: a naive processor, forced SDPA backends, and the attention calls alone."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# "naive" is our explicit softmax(Q K^T / sqrt(d)) V; "sdpa" is torch SDPA choosing its backend (what diffusers
# does by default); the others are torch SDPA with one backend forced.
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "sdpa-math": SDPBackend.MATH,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
}
IMPLEMENTATIONS: tuple[str, ...] = ("naive", "sdpa", *SDPA_BACKENDS)
REFERENCE = "sdpa-math"
_NAIVE_CALLS: list[int] = [0]  # calls of naive_attention so far, to prove the naive processor was in effect


def naive_calls() -> int:
    """How many times naive_attention has run in this process (take a difference around a call)."""
    return _NAIVE_CALLS[0]


def naive_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """softmax(Q K^T * scale) V written out: materialises the full (batch, heads, Nq, Nk) score matrix."""
    if dropout_p or is_causal or enable_gqa:
        raise NotImplementedError("naive_attention covers inference without dropout, causal masks or GQA")
    _NAIVE_CALLS[0] += 1
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = (query * scale) @ key.transpose(-2, -1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return scores.softmax(dim=-1) @ value


@contextlib.contextmanager
def _sdpa_replaced(fn: Callable[..., torch.Tensor]) -> Iterator[None]:
    """Inside the block, torch.nn.functional.scaled_dot_product_attention is fn (what diffusers' processors call)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = fn
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class NaiveAttnProcessor:
    """Wraps a denoiser's own attention processor (projections, norms, rotary) and swaps only its SDPA call for naive."""

    def __init__(self, inner: Any) -> None:
        """Keep the processor being wrapped, and show diffusers its signature."""
        self.inner = inner
        # diffusers reads `processor.__call__`'s parameters to decide which keyword arguments to pass on (and
        # warns about the rest); this instance attribute shows it the wrapped processor's, so e.g. SDXL's
        # `temb` reaches it as before. Calling the processor still goes through the class's __call__ below.
        self.__call__ = functools.wraps(inner.__call__)(functools.partial(type(self).__call__, self))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped processor with naive_attention in place of torch SDPA."""
        with _sdpa_replaced(naive_attention):
            return self.inner(*args, **kwargs)


@contextlib.contextmanager
def implementation(module: torch.nn.Module, name: str) -> Iterator[None]:
    """Inside the block module's attention runs with the named implementation (naive processor or one SDPA backend)."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {name!r}; allowed: {IMPLEMENTATIONS}")
    if name == "sdpa":
        yield
        return
    if name != "naive":
        with sdpa_kernel(SDPA_BACKENDS[name]):
            yield
        return
    original = module.attn_processors
    module.set_attn_processor({k: NaiveAttnProcessor(p) for k, p in original.items()})
    try:
        yield
    finally:
        module.set_attn_processor(original)


def with_implementation(fn: Callable[[], Any], module: torch.nn.Module, name: str) -> Callable[[], Any]:
    """A callable running fn with module's attention set to the named implementation."""
    def call() -> Any:
        with implementation(module, name):
            return fn()
    return call


def unavailable_reason(name: str, device: torch.device, dtype: torch.dtype, head_dim: int = 64) -> str:
    """Why the named implementation cannot run on device in dtype (tried on a small input), or '' when it can."""
    if name in ("naive", "sdpa"):
        return ""
    q = torch.zeros(1, 2, 128, head_dim, device=device, dtype=dtype)
    try:
        with sdpa_kernel(SDPA_BACKENDS[name]):
            F.scaled_dot_product_attention(q, q, q)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        return f"torch {torch.__version__} has no {name} kernel for {device.type} {str(dtype)[6:]}: {first}"
    return ""


@dataclass(frozen=True)
class AttentionCall:
    """Shapes of one SDPA call, in (batch, heads, tokens, head_dim) layout, as the denoiser made it."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]

    def score_elements(self) -> int:
        """Elements of the score matrix this call implies: batch * heads * Nq * Nk."""
        b, h, nq, _ = self.query
        return b * h * nq * self.key[-2]


def record_calls(fn: Callable[[], Any]) -> tuple[list[AttentionCall], Any]:
    """Run fn once and return the shapes of every torch SDPA call it made, and fn's result."""
    calls: list[AttentionCall] = []
    original = F.scaled_dot_product_attention

    def recording(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(AttentionCall(tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        return original(query, key, value, *args, **kwargs)

    with _sdpa_replaced(recording):
        out = fn()
    return calls, out


def attention_only_call(calls: list[AttentionCall], name: str, device: torch.device, dtype: torch.dtype,
                        seed: int = 0) -> Callable[[], torch.Tensor]:
    """A callable making just these attention calls (random inputs made once) with the named implementation."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shapes = Counter(calls)
    inputs = {c: tuple(torch.randn(s, generator=gen).to(device, dtype) for s in (c.query, c.key, c.value))
              for c in shapes}
    attend = naive_attention if name == "naive" else F.scaled_dot_product_attention

    @torch.inference_mode()
    def call() -> torch.Tensor:
        ctx = contextlib.nullcontext() if name == "naive" else sdpa_kernel(SDPA_BACKENDS[name])
        with ctx:
            for c, n in shapes.items():
                for _ in range(n):
                    out = attend(*inputs[c])  # each output is dropped before the next call, as in the model
        return out
    return call
