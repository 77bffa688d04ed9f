"""Count host-device syncs (reads of device values, blocking copies) per loop: recorder, profiler, CUDA sync warnings.

A sync is anything that makes the host wait for an accelerator: reading a device tensor's value (`.item()`,
`bool(t)`, `nonzero`, ...) and a blocking copy between host and device memory (`t.to(device)` from a CPU
tensor, `t.cpu()`, `torch.tensor(data, device=...)`). On CUDA the recorder sees real devices, and PyTorch's
sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`) confirms each sync independently. On a CPU nothing
waits, so the recorder *models* a device: tensors the loop keeps on its device are marked (stand-ins), values
computed from them are marked too, `.device` of a marked tensor is the stand-in device `cpu:0`, and a copy is a
`.to()` / `copy_` that moves a value between marked and unmarked. A CPU count is therefore a prediction of what
a GPU run counts (notebook 07 checks the two agree on CUDA), not a measurement of syncs. counted_loop runs a
schedule and a denoising loop written in the notebook with that bookkeeping around them.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity
from torch.utils._pytree import tree_leaves

from helpers import measure

# aten ops whose result the host must wait for: a scalar read, and nonzero (its output size is data-dependent).
SCALAR_READ = "aten::_local_scalar_dense"
NONZERO = "aten::nonzero"
ITEM = "aten::item"
# The device a modeled (CPU) count gives device-placed tensors: equal to no tensor's own CPU device, so a copy
# to it can be told from a copy to the host even after torch.device(...) normalises it.
STAND_IN_DEVICE = torch.device("cpu", 0)
SYNC_WARNING = "synchronizing CUDA operation"  # the text of the sync debug mode's warning
# How a reader's line names the part of a loop a read or copy happened in (counted_loop's 'setup' and 'steps').
PHASE_WORDS: dict[str, str] = {"setup": "while setting the schedule", "steps": "in the steps", "call": "in the call"}
_DEVICE_DESCRIPTOR = torch.Tensor.device  # Tensor.device's getset descriptor; its __get__ reaches the mode
_RECORDER_FRAMES = ("__torch_function__", "_caller", "_copy", "_record_copy")
_SKIP_FILES = ("/torch/", "/contextlib.py")


@dataclass(frozen=True)
class HostRead:
    """One op that hands a tensor's value to the host: op, device ('modeled' in a modeled count), calling
    line, device-placed or not, phase."""

    op: str
    device: str
    source: str
    device_placed: bool = False
    phase: str = "call"


@dataclass(frozen=True)
class Copy:
    """One copy between host and device memory: direction, whether the host waits for it, calling line, phase."""

    direction: str  # "host to device" or "device to host"
    blocking: bool
    source: str
    phase: str = "call"


@dataclass
class SyncCounts:
    """What one call did: profiler op counts, every host read and copy with its source, CUDA sync evidence.

    modeled is True for a CPU count (device placement tracked by stand-ins: what a GPU would do), False on CUDA
    (real devices). cuda_sync_warnings, htod_memcpy and dtoh_memcpy exist only on CUDA."""

    profiler_ops: dict[str, int]
    reads: list[HostRead] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    modeled: bool = True
    dtoh_memcpy: int | None = None
    htod_memcpy: int | None = None
    cuda_sync_warnings: int | None = None

    @property
    def scalar_reads(self) -> int:
        """aten::_local_scalar_dense calls counted by the profiler (every .item(), bool(tensor), float(tensor))."""
        return self.profiler_ops.get(SCALAR_READ, 0)

    @property
    def nonzero_calls(self) -> int:
        """aten::nonzero calls counted by the profiler."""
        return self.profiler_ops.get(NONZERO, 0)

    @property
    def host_reads(self) -> int:
        """Scalar reads plus nonzero calls, of any tensor: each is a sync when its tensor lives on a GPU."""
        return self.scalar_reads + self.nonzero_calls

    @property
    def device_reads(self) -> int:
        """Host reads of device-placed tensors (on a CPU: of stand-ins): each one a sync on a GPU."""
        return sum(r.device_placed for r in self.reads)

    @property
    def blocking_copies(self) -> int:
        """Copies between host and device memory that the host waits for (not non_blocking)."""
        return sum(c.blocking for c in self.copies)

    @property
    def gpu_syncs(self) -> int:
        """Syncs a GPU makes in this call: device reads plus blocking copies (on CUDA counted, on a CPU modeled)."""
        return self.device_reads + self.blocking_copies

    @property
    def device_syncs(self) -> int:
        """Syncs that really happened in this process: gpu_syncs on CUDA, 0 on a CPU (nothing to wait for)."""
        return 0 if self.modeled else self.gpu_syncs

    def syncs_in(self, phase: str) -> int:
        """Syncs (device reads plus blocking copies) recorded while the loop was in the given phase."""
        return (sum(r.device_placed and r.phase == phase for r in self.reads)
                + sum(c.blocking and c.phase == phase for c in self.copies))

    def syncs_from(self, fragment: str) -> int:
        """Syncs whose calling line ('file:line (function)') contains fragment."""
        return (sum(r.device_placed and fragment in r.source for r in self.reads)
                + sum(c.blocking and fragment in c.source for c in self.copies))

    def reads_from(self, fragment: str, *, device_only: bool = False) -> int:
        """Host reads whose calling line contains fragment (optionally: only reads of device-placed tensors)."""
        return sum(fragment in r.source and (r.device_placed or not device_only) for r in self.reads)

    def fields(self, steps: int) -> dict[str, Any]:
        """What a result row records of a count over a loop of steps steps (whole-loop counts unless 'per_step')."""
        return {
            "syncs_counted": "modeled on a CPU" if self.modeled else "counted on CUDA",
            "syncs_per_loop": self.gpu_syncs, "setup_syncs": self.syncs_in("setup"),
            "step_syncs": self.syncs_in("steps"), "syncs_per_step": self.gpu_syncs / steps,
            "device_reads": self.device_reads, "blocking_copies": self.blocking_copies,
            "real_syncs": self.device_syncs, "sync_warnings": self.cuda_sync_warnings,
            "htod_memcpy": self.htod_memcpy, "dtoh_memcpy": self.dtoh_memcpy,
            "item_calls_per_step": self.scalar_reads / steps, "nonzero_per_step": self.nonzero_calls / steps,
            "host_reads_per_step": self.host_reads / steps, "syncs_by_source": self.by_source(),
        }

    def table_row(self) -> dict[str, Any]:
        """One row of a reader's table: the whole loop's counts, columns named 'name (unit)'."""
        return {
            "syncs in the loop (count)": self.gpu_syncs, "while setting the schedule (count)": self.syncs_in("setup"),
            "in the steps (count)": self.syncs_in("steps"),
            "reads of device values (count)": self.device_reads, "blocking copies (count)": self.blocking_copies,
            "host reads, any tensor (count)": self.host_reads,
            "sync-debug warnings (count)": self.cuda_sync_warnings,
        }

    def by_source(self) -> dict[str, int]:
        """Reads and copies grouped by what they are, placement, part of the loop (PHASE_WORDS) and calling line."""
        reads = (f"{r.op} of a {'device-placed' if r.device_placed else 'host'} tensor ({r.device}) "
                 f"{PHASE_WORDS.get(r.phase, r.phase)}, at {r.source}" for r in self.reads)
        copies = (f"{'blocking' if c.blocking else 'non-blocking'} copy {c.direction} "
                  f"{PHASE_WORDS.get(c.phase, c.phase)}, at {c.source}" for c in self.copies)
        return dict(Counter([*reads, *copies]))


def _caller() -> str:
    """file:line (function) of the innermost stack frame outside torch and this recorder's own frames."""
    for frame in reversed(traceback.extract_stack()):
        ours = frame.filename.endswith("helpers/syncs.py") and frame.name in _RECORDER_FRAMES
        if not ours and not any(s in frame.filename for s in _SKIP_FILES):
            if "/ipykernel_" in frame.filename:  # a notebook cell: its file name is a hash that changes every run
                return f"notebook cell, line {frame.lineno} ({frame.name})"
            parts = frame.filename.split("/")
            return f"{'/'.join(parts[-2:])}:{frame.lineno} ({frame.name})"
    return "unknown"


_READ_FUNCS: dict[Any, str] = {
    torch.Tensor.item: "item", torch.Tensor.__bool__: "bool", torch.Tensor.__float__: "float",
    torch.Tensor.__int__: "int", torch.Tensor.__index__: "index", torch.Tensor.tolist: "tolist",
    torch.Tensor.nonzero: "nonzero", torch.nonzero: "nonzero", torch.Tensor.numpy: "numpy",
    torch.equal: "equal", torch.Tensor.equal: "equal", torch.allclose: "allclose", torch.Tensor.allclose: "allclose",
}
# Calls that may move a value between host and device memory.
_COPY_FUNCS: tuple[Any, ...] = (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda, torch.Tensor.copy_,
                                torch.tensor, torch.as_tensor, torch.Tensor.new_tensor)
_PHASE: list[str] = ["call"]


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Label the reads and copies recorded inside the block with a phase name (e.g. 'setup', 'steps')."""
    _PHASE.append(name)
    try:
        yield
    finally:
        _PHASE.pop()


def _is_stand_in(device: Any) -> bool:
    """Whether a device argument names the stand-in device of a modeled count."""
    if device is None or isinstance(device, (bool, int)):
        return False
    try:
        return torch.device(device) == STAND_IN_DEVICE
    except (RuntimeError, TypeError):
        return False


def _non_blocking(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The non_blocking flag of a .to() / .cpu() / .cuda() / copy_() call (first positional bool, or keyword)."""
    flags = [a for a in args[1:] if isinstance(a, bool)]
    return bool(kwargs.get("non_blocking", flags[0] if flags else False))


class _Recorder(TorchFunctionMode):
    """Record every Python-level read of a tensor's value and every host/device copy, with placement and line.

    On CUDA a tensor is device-placed when it lives on the GPU. In a modeled count (CPU) it is device-placed
    when it was handed to stand_in_for_device, made by a factory given the stand-in device, copied to the
    stand-in device, or computed from such a tensor; a copy to the host ('cpu', .cpu()) gives an unplaced one."""

    def __init__(self, modeled: bool) -> None:
        super().__init__()
        self.modeled = modeled
        self.reads: list[HostRead] = []
        self.copies: list[Copy] = []
        self.stand_ins: dict[int, weakref.ref[torch.Tensor]] = {}  # by id: tensors compare by value, not identity

    def is_stand_in(self, t: torch.Tensor) -> bool:
        """Whether t was marked (or computed from a marked tensor) and is still alive."""
        ref = self.stand_ins.get(id(t))
        return ref is not None and ref() is t

    def mark(self, t: torch.Tensor) -> None:
        """Mark a CPU tensor as standing in for a device-placed one (modeled counts only)."""
        if self.modeled and t.device.type == "cpu":
            self.stand_ins[id(t)] = weakref.ref(t)

    def placed(self, t: Any) -> bool:
        """Whether a value lives in device memory (non-tensors live on the host)."""
        if not isinstance(t, torch.Tensor):
            return False
        return self.is_stand_in(t) if self.modeled else t.device.type != "cpu"

    def _destination(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
        """Whether a copy call's result is device-placed (modeled counts), or None when it keeps the source's."""
        if func is torch.Tensor.cpu:
            return False
        if func is torch.Tensor.cuda:
            return True
        if func is torch.Tensor.copy_:
            return self.placed(args[0])
        device = kwargs.get("device")
        if func is torch.Tensor.to and device is None:
            target = next((a for a in args[1:] if isinstance(a, (torch.Tensor, torch.device, str, int))
                           and not isinstance(a, bool)), None)
            if isinstance(target, torch.Tensor):
                return self.placed(target)
            device = target
        if device is not None:
            return _is_stand_in(device)
        if func is torch.Tensor.new_tensor:
            return self.placed(args[0])
        return False if func is torch.tensor else None

    def _copy(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a copy call; record it when it moves a value between host and device memory."""
        data = args[1] if func in (torch.Tensor.copy_, torch.Tensor.new_tensor) else (args[0] if args else None)
        src = self.placed(data)
        out = func(*args, **kwargs)
        if self.modeled:
            dst = self._destination(func, args, kwargs)
            dst = src if dst is None else dst
            if func is not torch.Tensor.copy_ and isinstance(out, torch.Tensor):
                if dst != src and out is data:  # a no-op .to() on a CPU: the modeled copy is a new tensor
                    out = out.clone()
                if dst:
                    self.mark(out)
        else:
            target = args[0] if func is torch.Tensor.copy_ else out
            dst = isinstance(target, torch.Tensor) and target.device.type != "cpu"
        if dst != src:
            self.copies.append(Copy("host to device" if dst else "device to host",
                                    not _non_blocking(args, kwargs), _caller(), _PHASE[-1]))
        return out

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.modeled and getattr(func, "__self__", None) is _DEVICE_DESCRIPTOR:  # Tensor.device
            return STAND_IN_DEVICE if self.placed(args[0]) else func(*args, **kwargs)
        if func in _READ_FUNCS and args and isinstance(args[0], torch.Tensor):
            placed = self.placed(args[0])
            device = "modeled" if self.modeled and placed else args[0].device.type
            self.reads.append(HostRead(_READ_FUNCS[func], device, _caller(), placed, _PHASE[-1]))
        if func in _COPY_FUNCS:
            return self._copy(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.modeled and (_is_stand_in(kwargs.get("device")) or (self.stand_ins and any(
                isinstance(a, torch.Tensor) and self.is_stand_in(a) for a in tree_leaves((args, kwargs))))):
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor):
                    self.mark(o)
        return out


_ACTIVE: list[_Recorder] = []


def modeling() -> bool:
    """Whether a modeled (CPU) count is recording right now, so stand-ins matter."""
    return any(r.modeled for r in _ACTIVE)


def stand_in_for_device(*tensors: torch.Tensor) -> None:
    """Inside a modeled count (CPU): treat these tensors (and values computed from them) as device-placed."""
    for recorder in _ACTIVE:
        for t in tensors:
            recorder.mark(t)


def count_syncs(fn: Callable[[], Any], device: torch.device, *, warmup: bool = True) -> tuple[SyncCounts, Any]:
    """Run fn once (after one uncounted warm-up call) under the profiler and the recorder; on CUDA also with the
    sync debug mode on 'warn', counting its warnings. A CPU count is modeled (see the module docstring)."""
    is_cuda = device.type == "cuda"
    if warmup:  # lazy initialisation (kernels, handles, caches) happens here, outside the count
        fn()
        measure.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    recorder = _Recorder(modeled=not is_cuda)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with measure.quiet_profile(activities=activities) as prof:
            measure.synchronize(device)  # nothing queued before the count; the debug mode is still off here
            previous = torch.cuda.get_sync_debug_mode() if is_cuda else 0
            _ACTIVE.append(recorder)
            try:
                if is_cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                with recorder:
                    out = fn()
            finally:
                if is_cuda:
                    torch.cuda.set_sync_debug_mode(previous)
                _ACTIVE.remove(recorder)
            measure.synchronize(device)
    names = Counter(e.name for e in prof.events() if not (e.cpu_parent and e.cpu_parent.name == e.name))
    ops = {k: names.get(k, 0) for k in (SCALAR_READ, NONZERO, ITEM)}
    counts = SyncCounts(profiler_ops=ops, reads=recorder.reads, copies=recorder.copies, modeled=not is_cuda)
    if is_cuda:
        counts.dtoh_memcpy = sum(n for k, n in names.items() if "Memcpy DtoH" in k)
        counts.htod_memcpy = sum(n for k, n in names.items() if "Memcpy HtoD" in k)
        counts.cuda_sync_warnings = sum(SYNC_WARNING in str(w.message) for w in caught)
    return counts, out


PLACEMENTS: tuple[str, ...] = ("device", "cpu")  # where notebook 07's scheduler keeps its sigmas


def counted_loop(schedule: Callable[[torch.device], None], loop: Callable[[], Any],
                 on_device: Iterable[torch.Tensor]) -> Callable[[], Any]:
    """A callable running schedule(device) in the 'setup' phase, then loop() in the 'steps' phase, under
    torch.inference_mode(), for count_syncs and the timings; device is where the first tensor of on_device lives.

    on_device lists what the pipeline keeps on its device (latents, text inputs, weights): in a modeled count (CPU)
    these are marked first, so device is the stand-in device and a copy to it counts as a host-to-device copy.
    Outside a count the marks and phases do nothing."""
    on_device = list(on_device)
    if not on_device:
        raise ValueError("on_device must name at least one tensor: the device the schedule is set for")

    @torch.inference_mode()
    def call() -> Any:
        if modeling():
            stand_in_for_device(*on_device)
        with phase("setup"):
            schedule(on_device[0].device)  # the stand-in device in a modeled count
        with phase("steps"):
            return loop()
    return call


def debug_mode_disagreements(counts: dict[str, SyncCounts]) -> dict[str, dict[str, int | None]]:
    """The counts whose CUDA sync-debug warnings differ from the syncs the recorder counted (empty: all agree).
    A count without warnings (None: not taken on CUDA) disagrees too, so a check built on it cannot pass vacuously."""
    return {name: {"sync-debug warnings": c.cuda_sync_warnings, "syncs counted": c.gpu_syncs}
            for name, c in counts.items() if c.cuda_sync_warnings != c.gpu_syncs}


def sync_debug_mode_unavailable_reason(device: torch.device) -> str:
    """Why torch.cuda.set_sync_debug_mode cannot check this run's counts ('' on a CUDA device)."""
    if device.type == "cuda":
        return ""
    why = (f"this run's device is {device.type}: torch.cuda.set_sync_debug_mode warns only at CUDA calls that "
           "make the host wait for the GPU, and reading a CPU tensor waits for nothing, so it has nothing to warn "
           "about (and no Memcpy HtoD/DtoH events exist)")
    try:
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(previous)
    except (AssertionError, RuntimeError) as err:  # a CPU-only build of torch cannot even switch it on
        why += f"; on this build of torch it cannot even be switched on ({type(err).__name__}: {err})"
    return why
