"""Attention implementations for notebook 02: a naive processor, forced SDPA backends, and the attention calls alone.

Notebook 02 writes its own naive attention and processor out in cells (a processor class whose `__call__` computes
attention itself, installed with `set_attn_processor`) and passes them to the functions here (`naive=`, `attend=`);
the versions below are the defaults, used by the unit tests. Calls of torch's SDPA are seen with a
`TorchFunctionMode` (`record_calls`), which replaces nothing."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from helpers import measure, params, precision

# diffusers logs "Attention backends are an experimental feature ..." at every set_attention_backend and
# reset_attention_backend; once per process says it.
logging.getLogger("diffusers.models.modeling_utils").addFilter(
    precision.FirstOnly("Attention backends are an experimental feature"))

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
def sdpa_replaced(fn: Callable[..., torch.Tensor]) -> Iterator[None]:
    """Inside the block, torch.nn.functional.scaled_dot_product_attention is fn (process-wide: for unit tests only;
    a notebook installs a processor that computes attention itself)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = fn
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _SdpaRedirect(TorchFunctionMode):
    """Inside the block (this thread only), each call of torch's SDPA runs fn instead; nothing is replaced."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        """fn takes SDPA's arguments."""
        super().__init__()
        self.fn = fn

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """fn for SDPA, the function itself for anything else."""
        return (self.fn if func is F.scaled_dot_product_attention else func)(*args, **(kwargs or {}))


class NaiveAttnProcessor:
    """Wraps a denoiser's own attention processor (projections, norms, rotary) and sends only its SDPA call to
    naive_attention (a model-agnostic default for the unit tests; notebook 02 writes a processor out)."""

    def __init__(self, inner: Any) -> None:
        """Keep the processor being wrapped, and show diffusers its signature."""
        self.inner = inner
        # diffusers reads `processor.__call__`'s parameters to decide which keyword arguments to pass on (and
        # warns about the rest); this instance attribute shows it the wrapped processor's, so e.g. SDXL's
        # `temb` reaches it as before. Calling the processor still goes through the class's __call__ below.
        self.__call__ = functools.wraps(inner.__call__)(functools.partial(type(self).__call__, self))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped processor with naive_attention in place of torch SDPA."""
        with _SdpaRedirect(naive_attention):
            return self.inner(*args, **kwargs)


@contextlib.contextmanager
def implementation(module: torch.nn.Module, name: str,
                   naive: Callable[[Any], Any] = NaiveAttnProcessor) -> Iterator[None]:
    """Inside the block module's attention runs with the named implementation: for "naive" each attention processor
    replaced by naive(that processor) (a class or a function making the naive one), for an SDPA backend that backend
    forced; "sdpa" leaves SDPA to choose."""
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
    module.set_attn_processor({k: naive(p) for k, p in original.items()})
    try:
        yield
    finally:
        module.set_attn_processor(original)


def with_implementation(fn: Callable[[], Any], module: torch.nn.Module, name: str,
                        naive: Callable[[Any], Any] = NaiveAttnProcessor) -> Callable[[], Any]:
    """A callable running fn with module's attention set to the named implementation (naive: makes the naive
    processor from the model's own)."""
    def call() -> Any:
        with implementation(module, name, naive):
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
        first = first.split(" This is likely due to")[0]  # PyTorch's guess: true when a user turned kernels off, not here
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
    """Run fn once and return the shapes of every torch SDPA call it made, and fn's result (seen through a
    TorchFunctionMode: each call still runs torch's SDPA)."""
    calls: list[AttentionCall] = []

    def recording(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(AttentionCall(tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        return F.scaled_dot_product_attention(query, key, value, *args, **kwargs)

    with _SdpaRedirect(recording):
        out = fn()
    return calls, out


def attention_only_call(calls: list[AttentionCall], name: str, device: torch.device, dtype: torch.dtype,
                        seed: int = 0, attend: Callable[..., torch.Tensor] = naive_attention) -> Callable[[], torch.Tensor]:
    """A callable making just these attention calls (random inputs made once) with the named implementation
    (attend: the naive attention function)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shapes = Counter(calls)
    inputs = {c: tuple(torch.randn(s, generator=gen).to(device, dtype) for s in (c.query, c.key, c.value))
              for c in shapes}
    attend = attend if name == "naive" else F.scaled_dot_product_attention

    @torch.inference_mode()
    def call() -> torch.Tensor:
        ctx = contextlib.nullcontext() if name == "naive" else sdpa_kernel(SDPA_BACKENDS[name])
        with ctx:
            for c, n in shapes.items():
                for _ in range(n):
                    out = attend(*inputs[c])  # each output is dropped before the next call, as in the model
        return out
    return call


@dataclass(frozen=True)
class Knobs:
    """Notebook 02's sweep settings, resolved from its parameters and the profile."""

    implementations: list[str]
    resolutions: list[int]
    batches: list[int]
    sdpa_dtypes: list[str]


DEFAULT_RESOLUTIONS = {"smoke": [128, 256, 512], "full": [512, 768, 1024, 1280]}
DEFAULT_BATCHES = {"smoke": [1, 2, 4, 8], "full": [1, 4, 16, 32]}


def resolve_knobs(profile: str, implementations: list[str] | None, resolutions: list[int] | None,
                  batches: list[int] | None, sdpa_dtypes: list[str] | None) -> Knobs:
    """Check notebook 02's knobs (None: the profile's default) and return them resolved; a bad value raises
    params.ParameterError naming the allowed ones. The reference, sdpa-math, must be among the implementations and
    comes first."""
    sweep = [i for i in IMPLEMENTATIONS if i != "sdpa"]
    impls = params.check_subset("IMPLEMENTATIONS", sweep if implementations is None else implementations, sweep)
    if REFERENCE not in impls:
        raise params.ParameterError(f"IMPLEMENTATIONS={impls!r} must include {REFERENCE!r}, the reference")
    res = params.check_positive_ints("RESOLUTIONS", DEFAULT_RESOLUTIONS[profile] if resolutions is None else resolutions,
                                     16)
    if len(set(res)) < 2:  # section 4 compares the memory of its smallest and largest size
        raise params.ParameterError(f"RESOLUTIONS={res!r} needs two different sizes or more: the sweep compares how "
                                    f"attention's memory grows with them")
    sizes = params.check_positive_ints("BATCHES", DEFAULT_BATCHES[profile] if batches is None else batches)
    formats = params.check_subset("SDPA_DTYPES", ["fp32", "fp16"] if sdpa_dtypes is None else sdpa_dtypes,
                                  list(params.DTYPES))
    return Knobs([REFERENCE] + [i for i in impls if i != REFERENCE], sorted(set(res)), sorted(sizes), formats)


@dataclass(frozen=True)
class StepMeasurement:
    """One denoiser step with one attention implementation, and the same attention calls on their own."""

    timing: measure.Timing
    memory: measure.Memory
    out: torch.Tensor
    replaced_calls: int
    only_timing: measure.Timing
    only_memory: measure.Memory


def measure_step(step: Callable[[], Any], module: torch.nn.Module, name: str, calls: list[AttentionCall], run: Any,
                 naive: Callable[[Any], Any] = NaiveAttnProcessor,
                 attend: Callable[..., torch.Tensor] = naive_attention) -> StepMeasurement:
    """Time step with module's attention set to name and take its peak memory and output, counting the attention
    calls that did not reach torch's SDPA (all of them for naive, none otherwise); then time and measure the same
    attention calls (calls, recorded from the step) alone, on random inputs."""
    fn = with_implementation(step, module, name, naive)
    s = run.settings
    timing = measure.time_callable(fn, run.device, repeats=s.repeats, warmup=s.warmup)
    memory, (reached, out) = measure.peak_memory(lambda: record_calls(fn), run.device)
    only = attention_only_call(calls, name, run.device, run.dtype, seed=run.seed, attend=attend)
    only_timing = measure.time_callable(only, run.device, repeats=s.repeats, warmup=s.warmup)
    only_memory, _ = measure.peak_memory(only, run.device)
    first = out[0] if isinstance(out, (tuple, list)) else out
    return StepMeasurement(timing, memory, first, len(calls) - len(reached), only_timing, only_memory)


def largest_self_attention(calls: list[AttentionCall]) -> AttentionCall:
    """The self-attention call (as many keys as queries) with the largest score matrix: Flux's joint attention over
    text and image tokens, SDXL's first attention level (its cross-attention attends to 77 text tokens instead)."""
    return max((c for c in calls if c.key[-2] == c.query[-2]), key=lambda c: c.score_elements())
