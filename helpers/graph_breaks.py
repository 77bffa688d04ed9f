"""Plant realistic graph breaks in the Flux denoiser, find them (explain, counters, TORCH_LOGS) and fix them."""

from __future__ import annotations

import contextlib
import io
import logging
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
import torch._dynamo.exc
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, FluxTransformer2DModel
from torch._dynamo.utils import counters

from helpers.precision import cast_module

# Where the planted attention processors go: the first double-stream and the first single-stream block.
DEBUG_PRINT_BLOCK = "transformer_blocks.0.attn.processor"
DEBUG_ITEM_BLOCK = "single_transformer_blocks.0.attn.processor"
# Latents beyond this magnitude are clamped by the planted input guard (never reached by sane inputs).
CLAMP_LIMIT = 1e4
PLANTED: dict[str, str] = {
    "print in attention processor": "a debug processor prints each attention output's shape",
    ".item() in attention processor": "a stats processor reads the output's std to a Python float",
    "data-dependent branch": "forward clamps the latents only `if hidden_states.abs().amax() > limit`",
    "logger call in forward": "forward logs the latent shape with logging.Logger.info",
}
FIXES: dict[str, str] = {
    "print in attention processor": "the print runs only when not torch.compiler.is_compiling()",
    ".item() in attention processor": "the .item() runs only when not torch.compiler.is_compiling()",
    "data-dependent branch": "branchless: torch.where(|x| > limit, x.clamp(-limit, limit), x)",
    "logger call in forward": "the log call runs only when not torch.compiler.is_compiling()",
}
logger = logging.getLogger("helpers.graph_breaks.denoiser")


def _eager_only() -> bool:
    """True outside torch.compile tracing: the guard that keeps debug code out of compiled graphs."""
    return not torch.compiler.is_compiling()


class DebugAttnProcessor(FluxAttnProcessor):
    """Flux attention plus a debugging side effect: print the output shape, or read its std with .item()."""

    def __init__(self, kind: str, stream: io.StringIO, compile_safe: bool = False) -> None:
        """kind is 'print' or 'item'; compile_safe runs the side effect only in eager mode."""
        super().__init__()
        if kind not in ("print", "item"):
            raise ValueError(f"kind={kind!r}; allowed: 'print', 'item'")
        self.kind, self.stream, self.compile_safe = kind, stream, compile_safe
        self.last_std: float | None = None

    def __call__(self, attn: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Run the stock Flux attention, then the debugging side effect."""
        out = super().__call__(attn, hidden_states, *args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        if not self.compile_safe or _eager_only():
            if self.kind == "print":
                print("attention output", tuple(first.shape), file=self.stream)
            else:
                self.last_std = first.float().std().item()
        return out


def _broken_forward(self: FluxTransformer2DModel, hidden_states: torch.Tensor, **kwargs: Any) -> Any:
    """Flux forward behind an input guard written with a Python branch on a tensor, and a log call."""
    if hidden_states.abs().amax() > CLAMP_LIMIT:
        hidden_states = hidden_states.clamp(-CLAMP_LIMIT, CLAMP_LIMIT)
    logger.info("denoiser step on latents of shape %s", tuple(hidden_states.shape))
    return FluxTransformer2DModel.forward(self, hidden_states, **kwargs)


def _fixed_forward(self: FluxTransformer2DModel, hidden_states: torch.Tensor, **kwargs: Any) -> Any:
    """The same guard and log, written so dynamo can trace them: torch.where, and logging in eager only."""
    limit = CLAMP_LIMIT
    hidden_states = torch.where(hidden_states.abs() > limit, hidden_states.clamp(-limit, limit), hidden_states)
    if _eager_only():
        logger.info("denoiser step on latents of shape %s", tuple(hidden_states.shape))
    return FluxTransformer2DModel.forward(self, hidden_states, **kwargs)


def _install(transformer: FluxTransformer2DModel, stream: io.StringIO, fixed: bool) -> None:
    """Put the debug processors on two blocks and the guarded forward on the transformer."""
    processors = dict(transformer.attn_processors)
    for name in processors:
        processors[name] = FluxAttnProcessor()
    processors[DEBUG_PRINT_BLOCK] = DebugAttnProcessor("print", stream, compile_safe=fixed)
    processors[DEBUG_ITEM_BLOCK] = DebugAttnProcessor("item", stream, compile_safe=fixed)
    transformer.set_attn_processor(processors)
    transformer.forward = types.MethodType(_fixed_forward if fixed else _broken_forward, transformer)


def plant_breaks(transformer: FluxTransformer2DModel, stream: io.StringIO) -> None:
    """Install the four planted graph breaks of PLANTED on the real Flux transformer."""
    _install(transformer, stream, fixed=False)


def apply_fixes(transformer: FluxTransformer2DModel, stream: io.StringIO) -> None:
    """Replace each planted break by its traceable version (FIXES): same eager behaviour, no break."""
    _install(transformer, stream, fixed=True)


def restore(transformer: FluxTransformer2DModel) -> None:
    """Back to the stock processors and the class's own forward."""
    transformer.set_attn_processor(FluxAttnProcessor())
    transformer.__dict__.pop("forward", None)


@dataclass
class BreakReport:
    """What torch._dynamo.explain and dynamo's counters saw for one call of a module."""

    explain_graphs: int
    explain_breaks: int
    explain_reasons: list[str]
    counter_graph_breaks: int
    counter_unimplemented: int
    counter_reasons: dict[str, int] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)

    @property
    def breaks(self) -> int:
        """Graph breaks: explain's count, or the counters' count where that is larger."""
        return max(self.explain_breaks, self.counter_graph_breaks)


def _first_line(text: str) -> str:
    """First non-empty line of a message."""
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


@contextlib.contextmanager
def graph_break_logs() -> Iterator[list[str]]:
    """Capture what TORCH_LOGS="graph_breaks" prints, as a list of lines (filled while the block runs)."""
    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "graph_breaks" in record.name:
                lines.extend(record.getMessage().splitlines())

    torch._logging.set_logs(graph_breaks=True)
    target = logging.getLogger("torch._dynamo")
    quiet = [(h, h.setStream(io.StringIO())) for h in target.handlers if isinstance(h, logging.StreamHandler)]
    handler = _Collect()
    target.addHandler(handler)
    try:
        yield lines
    finally:
        target.removeHandler(handler)
        for h, old in quiet:
            h.setStream(old)
        torch._logging.set_logs()


def find_breaks(module: torch.nn.Module, inputs: dict[str, Any]) -> BreakReport:
    """Trace one call of module with torch._dynamo.explain; report its breaks, dynamo's counters and the logs."""
    torch._dynamo.reset()
    counters.clear()
    with graph_break_logs() as lines, torch.inference_mode():
        explained = torch._dynamo.explain(module)(**inputs)
    reasons: dict[str, int] = {}
    for group in ("graph_break", "unimplemented"):
        for key, n in counters[group].items():
            reasons[_first_line(key)] = reasons.get(_first_line(key), 0) + n
    report = BreakReport(
        explain_graphs=explained.graph_count, explain_breaks=explained.graph_break_count,
        explain_reasons=[_first_line(r.reason) for r in explained.break_reasons],
        counter_graph_breaks=sum(counters["graph_break"].values()),
        counter_unimplemented=sum(counters["unimplemented"].values()),
        counter_reasons=reasons, log_lines=list(lines),
    )
    torch._dynamo.reset()
    return report


def fullgraph_attempt(module: torch.nn.Module, inputs: dict[str, Any], backend: str = "inductor",
                      head_lines: int = 4) -> tuple[bool, str, torch.nn.Module, Any]:
    """Compile module with fullgraph=True and call it once: (succeeded, error's first lines, compiled, output)."""
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    try:
        with torch.inference_mode():
            out = compiled(**inputs)
    except torch._dynamo.exc.TorchDynamoException as err:  # a break raises torch._dynamo.exc.Unsupported
        lines = [ln for ln in f"{type(err).__name__}: {err}".splitlines() if ln.strip()]
        return False, "\n".join(lines[:head_lines]), compiled, None
    return True, "", compiled, out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in fp32: a parity measure independent of the output's scale."""
    out, ref = out.float(), ref.float()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


@torch.no_grad()
def fp32_reference(module: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """The module's first output computed in fp32 (weights upcast in place, then cast back losslessly)."""
    dtype = next(module.parameters()).dtype
    up = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    module.float()
    try:
        out = module(**up)
    finally:
        cast_module(module, dtype)
    return (out[0] if isinstance(out, (tuple, list)) else out).float()


# Text that identifies each planted break in dynamo's break reasons (explain's or the counters').
REASON_MARKERS: dict[str, tuple[str, ...]] = {
    "print in attention processor": ("builtin operator",),
    ".item() in attention processor": ("Tensor.item()",),
    "data-dependent branch": ("Data-dependent branching", "generic_jump"),
    "logger call in forward": ("logging.Logger",),
}


def kinds_found(reasons: list[str]) -> dict[str, int]:
    """How many of the given break reasons match each planted kind of REASON_MARKERS."""
    return {kind: sum(any(m in r for m in marks) for r in reasons) for kind, marks in REASON_MARKERS.items()}
