"""Find graph breaks (explain, dynamo's counters, the graph_breaks log) and count them by planted kind (notebook
06); compute an fp32 reference blockwise; and notebook 05's resolution knob, shape-recompile words and published
figures."""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from helpers import text

# The four kinds of break notebook 06 plants in the Flux denoiser, each with what the planted code does.
PLANTED: dict[str, str] = {
    "print in attention processor": "a debug processor prints each attention output's shape",
    ".item() in attention processor": "a stats processor reads the output's std to a Python float",
    "data-dependent branch": "forward clamps the latents only `if hidden_states.abs().amax() > limit`",
    "logger call in forward": "forward logs the latent shape with logging.Logger.info",
}


@dataclass
class BreakReport:
    """What torch._dynamo.explain, dynamo's counters and its logs saw for one call of a module.

    explain_breaks is explain's own figure, graphs - 1; explain_reasons lists only the graphs that ended at a
    break. counter_entries holds every entry of the two counter keys (`graph_break`: a break dynamo split the
    frame at; `unimplemented`: the rest) and frames_given_up the frames dynamo could not split and ran eagerly."""

    explain_graphs: int
    explain_breaks: int
    explain_reasons: list[str]
    counter_graph_breaks: int
    counter_unimplemented: int
    counter_reasons: dict[str, int] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)
    graphs: list[dict[str, Any]] = field(default_factory=list)
    counter_entries: list[dict[str, Any]] = field(default_factory=list)
    frames_given_up: list[str] = field(default_factory=list)

    @property
    def breaks(self) -> int:
        """Graph breaks: explain's count, or the counters' count where that is larger."""
        return max(self.explain_breaks, self.counter_graph_breaks)


def _first_line(text: str) -> str:
    """First non-empty line of a message."""
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


def _where(frame: Any) -> str:
    """A traceback frame summary as 'function (file:line)'."""
    return f"{frame.name} ({Path(frame.filename).name}:{frame.lineno})"


WONT_CONVERT = re.compile(r"WON'T CONVERT (?P<name>\S+) (?P<file>.+?) line \d+")


@contextlib.contextmanager
def graph_break_logs() -> Iterator[tuple[list[str], list[str]]]:
    """Capture what TORCH_LOGS="graph_breaks" prints (lines), and the frames dynamo gave up on, while the block runs.

    A frame is given up when tracing it raised and dynamo fell back to running it eagerly; dynamo's
    convert_frame logger says so at info level ("WON'T CONVERT <name> <file> line <n>", torch 2.11 and 2.13) and,
    since torch 2.13, at debug level too ("skipping: <name> (reason: an error was suppressed ...)")."""
    lines: list[str] = []
    given_up: list[str] = []

    def give_up(name: str, filename: str) -> None:
        frame = f"{name} ({Path(filename).name})"
        if frame not in given_up:
            given_up.append(frame)

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "graph_breaks" in record.name:
                lines.extend(record.getMessage().splitlines())
            elif not record.name.endswith("convert_frame"):
                return
            elif won_t := WONT_CONVERT.match(str(record.msg)):
                give_up(won_t["name"], won_t["file"])
            elif (isinstance(record.args, tuple) and len(record.args) == 3
                  and "error was suppressed" in str(record.args[1])):
                give_up(str(record.args[0]), str(record.args[2]))

    torch._logging.set_logs(graph_breaks=True)
    target = logging.getLogger("torch._dynamo")
    frames_log = logging.getLogger("torch._dynamo.convert_frame")
    old_level = frames_log.level
    frames_log.setLevel(logging.DEBUG)
    quiet = [(h, h.setStream(io.StringIO())) for h in target.handlers if isinstance(h, logging.StreamHandler)]
    handler = _Collect()
    target.addHandler(handler)
    try:
        yield lines, given_up
    finally:
        target.removeHandler(handler)
        frames_log.setLevel(old_level)
        for h, old in quiet:
            h.setStream(old)
        torch._logging.set_logs()


def kind(reason: str) -> str:
    """The planted kind (a key of REASON_MARKERS) a break reason belongs to, or 'other'."""
    return next((k for k, marks in REASON_MARKERS.items() if any(m in reason for m in marks)), "other")


def find_breaks(module: torch.nn.Module, inputs: dict[str, Any]) -> BreakReport:
    """Trace one call of module with torch._dynamo.explain; report its breaks, dynamo's counters and the logs."""
    torch._dynamo.reset()
    counters.clear()
    with graph_break_logs() as (lines, given_up), torch.inference_mode():
        explained = torch._dynamo.explain(module)(**inputs)
    reasons: dict[str, int] = {}
    entries: list[dict[str, Any]] = []
    for group in ("graph_break", "unimplemented"):
        for key, n in counters[group].items():
            reasons[_first_line(key)] = reasons.get(_first_line(key), 0) + n
            entries.append({"planted kind": kind(key), "counter key": group, "count": n,
                            "reason (first line)": _first_line(key),
                            "graph break in a loop": "graph break in loop" in key})
    graphs = []
    for gm in explained.graphs:
        why = gm.compile_subgraph_reason
        stack = list(why.user_stack) if why is not None else []
        graphs.append({
            "ops": sum(n.op == "call_function" for n in gm.graph.nodes),
            "frame": _where(stack[0]) if stack else "?",
            "ends with": f"break: {_first_line(why.reason)}" if why is not None and why.graph_break else "return",
            "break site": _where(stack[-1]) if why is not None and why.graph_break and stack else "",
        })
    report = BreakReport(
        explain_graphs=explained.graph_count, explain_breaks=explained.graph_break_count,
        explain_reasons=[_first_line(r.reason) for r in explained.break_reasons],
        counter_graph_breaks=sum(counters["graph_break"].values()),
        counter_unimplemented=sum(counters["unimplemented"].values()),
        counter_reasons=reasons, log_lines=list(lines), graphs=graphs, counter_entries=entries,
        frames_given_up=list(given_up),
    )
    torch._dynamo.reset()
    return report


def _blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a model: the entries of its ModuleList children."""
    return [b for child in module.children() if isinstance(child, torch.nn.ModuleList) for b in child]


def _numel(module: torch.nn.Module) -> int:
    """Floating-point parameter and buffer elements of a module."""
    return sum(t.numel() for t in [*module.parameters(), *module.buffers()] if t.is_floating_point())


def fp32_upcast_bytes(module: torch.nn.Module) -> int:
    """Bytes the fp32 copies of fp32_reference need at once: the weights outside the blocks plus the largest block."""
    blocks = _blocks(module)
    in_blocks = sum(_numel(b) for b in blocks)
    return 4 * (_numel(module) - in_blocks + max((_numel(b) for b in blocks), default=0))


# Room left for fp32 activations of one block beside the upcast weights (a few hundred MB for Flux at 1024 px).
FP32_ACTIVATION_HEADROOM_BYTES = 2 * 2**30


def fp32_reference_unavailable_reason(module: torch.nn.Module) -> str:
    """Why fp32_reference cannot run now ('' when it can): on CUDA, too little free memory for the upcast copies."""
    device = next(module.parameters()).device
    if device.type != "cuda":
        return ""
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    need = fp32_upcast_bytes(module) + FP32_ACTIVATION_HEADROOM_BYTES
    if free < need:
        return (f"the fp32 reference needs {need / 2**30:.1f} GiB free on {torch.cuda.get_device_name(device)} "
                f"(fp32 copies of one block and the non-block weights, plus activations); {free / 2**30:.1f} GiB is")
    return ""


def _float_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The floating-point parameters and buffers of a module."""
    return [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]


def _upcast(tensors: list[torch.Tensor]) -> None:
    """Put each tensor's data in fp32, in place (the Parameter objects stay the same)."""
    for t in tensors:
        t.data = t.data.float()


@torch.no_grad()
def fp32_reference(module: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """The module's first output computed in fp32, upcasting one block at a time (weights cast back losslessly).

    The weights outside the repeated blocks are fp32 for the whole call; each block is cast to fp32 just before
    it runs and back right after, so the extra memory is fp32_upcast_bytes(module), not a full fp32 copy (48 GB
    for Flux-1-Dev's 12B transformer). Every op still runs in fp32: the output equals that of module.float()."""
    original = {id(t): (t, t.dtype) for t in _float_tensors(module)}

    def restore(tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            t.data = t.data.to(original[id(t)][1])

    up = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    blocks = _blocks(module)
    in_blocks = {id(t) for b in blocks for t in _float_tensors(b)}
    hooks = []
    try:
        _upcast([t for i, (t, _) in original.items() if i not in in_blocks])
        for block in blocks:
            hooks.append(block.register_forward_pre_hook(lambda m, _args: _upcast(_float_tensors(m))))
            hooks.append(block.register_forward_hook(lambda m, _args, _out: restore(_float_tensors(m))))
        out = module(**up)
    finally:
        for h in hooks:
            h.remove()
        restore([t for t, _ in original.values()])
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


def hints(log_lines: list[str]) -> list[str]:
    """The distinct 'Hint:' lines of a graph_breaks log, in the order they first appear; a line may carry the
    logger's prefix (level, time, process, source line, then '[__graph_breaks]'), as TORCH_LOGS writes it."""
    seen: dict[str, None] = {}
    for line in log_lines:
        text = line.split("[__graph_breaks]")[-1].strip()
        if text.startswith("Hint:"):
            seen.setdefault(text, None)
    return list(seen)


def fix_problems(before: dict[str, int], after: dict[str, int], fixed: tuple[str, ...]) -> list[str]:
    """What is wrong with a fix, by planted kind ([] when nothing): each kind must be found before, each kind in
    fixed gone after, and every other kind still found after (a fix removes its own break, not the others)."""
    problems = []
    for kind, n in before.items():
        if n == 0:
            problems.append(f"{kind}: not found before the fix, so the fix cannot be shown")
        elif kind in fixed and after.get(kind, 0) != 0:
            problems.append(f"{kind}: still found after its fix ({after.get(kind)} reasons)")
        elif kind not in fixed and after.get(kind, 0) == 0:
            problems.append(f"{kind}: gone although nothing fixed it; check the reason markers")
    return problems


def tool_count_claims(found: BreakReport) -> list[tuple[str, Any, str, bool]]:
    """How explain and the counters count on the planted model, as notebook 06's Going deeper says, as claims
    (claim, measured, expected, holds): explain's breaks are its graphs - 1 with a reason only for graphs ending at a
    break; the counters count more than the planted lines; the branch is filed under `unimplemented` only; a frame
    with a break in a loop is given up."""
    ended = sum(g["ends with"] != "return" for g in found.graphs)
    total = found.counter_graph_breaks + found.counter_unimplemented
    branch_keys = sorted({e["counter key"] for e in found.counter_entries
                          if e["planted kind"] == "data-dependent branch"})
    return [
        ("explain's 'graph breaks' are its graphs less one",
         f"{found.explain_breaks} breaks, {text.count(found.explain_graphs, 'graph')}",
         f"{found.explain_graphs - 1} breaks", found.explain_breaks == found.explain_graphs - 1),
        ("explain lists a reason only for the graphs that ended at a break", len(found.explain_reasons),
         f"{ended} of {found.explain_graphs} graphs", len(found.explain_reasons) == ended < found.explain_graphs),
        ("dynamo's counters count more than the planted lines", total, f"more than {len(PLANTED)}",
         total > len(PLANTED)),
        ("the data-dependent branch is filed under `unimplemented` only", branch_keys, ["unimplemented"],
         branch_keys == ["unimplemented"]),
        ("frames with a break in a loop or a try block are given up and run eagerly", found.frames_given_up,
         "at least one, a break in a loop among them",
         bool(found.frames_given_up) and any(e["graph break in a loop"] for e in found.counter_entries)),
    ]


# Recompiles across input shapes (notebook 05): the resolutions knob, what the counts say, and published figures.

ALLOWED_RESOLUTIONS = ("None, or a list of at least three different square sizes in px, each a multiple of 16 and "
                       ">= 32 (one latent token or fewer would be specialised by dynamo), e.g. [128, 96, 64]")


def check_resolutions(value: Any, profile: str) -> list[int]:
    """Notebook 05's RESOLUTIONS: None (smoke [128, 96, 64], full [1024, 768, 512]) or at least three different
    square sizes in px, multiples of 16 and >= 32; raise params.ParameterError naming the allowed values."""
    from helpers import params

    if value is None:
        return [128, 96, 64] if profile == "smoke" else [1024, 768, 512]
    try:
        if not isinstance(value, (list, tuple)):
            raise params.ParameterError("not a list")
        sizes = params.check_positive_ints("RESOLUTIONS", value, multiple_of=16)
        if len(set(sizes)) < 3 or len(set(sizes)) != len(sizes) or min(sizes) < 32:
            raise params.ParameterError("too few, repeated or too small sizes")
    except params.ParameterError:
        raise params.ParameterError(f"RESOLUTIONS={value!r} is not allowed; use {ALLOWED_RESOLUTIONS}") from None
    return list(sizes)


def describe_shape_recompiles(default: dict[int, int], static_only: dict[int, int]) -> str:
    """What the graphs compiled per resolution say, in words: where the default compile recompiled and why the
    resolutions after that compiled nothing (the recompiled graph is dynamic in the dimensions that changed)."""
    sizes = list(default)
    again = [r for r in sizes[2:] if default[r] > 0]
    reused = [r for r in sizes[2:] if default[r] == 0]
    text = (f"dynamo's defaults compiled {default[sizes[0]]} graph at {sizes[0]} px and {default[sizes[1]]} at "
            f"{sizes[1]} px (a recompile: the token dimension changed and the guards of the first graph failed)")
    if reused:
        text += (f"; {', '.join(f'{r} px' for r in reused)} compiled nothing: automatic dynamic shapes made the "
                 f"recompiled graph dynamic in the dimensions that changed, and its guards accept "
                 f"{'this size' if len(reused) == 1 else 'these sizes'}")
    if again:
        text += f"; {', '.join(f'{r} px ({default[r]})' for r in again)} compiled again"
    total = sum(static_only.values())
    return (text + f". With automatic dynamic shapes off, every resolution compiled its own graph: {total} graphs "
            f"for {len(static_only)} resolutions, against {sum(default.values())} with the defaults.")


def compiled_once(graphs: dict[Any, int], first_max: int = 1) -> bool:
    """Whether the first entry of graphs compiled between 1 and first_max graphs and every later entry none (a
    dynamic compile serving every shape without recompiling)."""
    counts = list(graphs.values())
    return bool(counts) and 1 <= counts[0] <= first_max and all(n == 0 for n in counts[1:])
