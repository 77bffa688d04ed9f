"""Count device-to-host syncs: scalar reads and nonzero calls (profiler, torch-function mode), CUDA sync warnings."""

from __future__ import annotations

import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Callable
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
_SKIP_FRAMES = ("/torch/", "/helpers/syncs.py", "/contextlib.py")


@dataclass(frozen=True)
class HostRead:
    """One op that hands a tensor's value to the host: op, device, whether it is device-placed, calling line."""

    op: str
    device: str
    source: str
    device_placed: bool = False


@dataclass
class SyncCounts:
    """Host reads seen in one call: profiler op counts, each read's device and source, CUDA sync evidence."""

    profiler_ops: dict[str, int]
    reads: list[HostRead] = field(default_factory=list)
    dtoh_memcpy: int | None = None
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
        """Scalar reads plus nonzero calls: each is a device-to-host sync when its tensor lives on a GPU."""
        return self.scalar_reads + self.nonzero_calls

    @property
    def device_syncs(self) -> int:
        """Host reads of tensors that live on an accelerator: the reads that really stall the host."""
        return sum(r.device != "cpu" for r in self.reads)

    @property
    def device_reads(self) -> int:
        """Host reads of tensors placed on the pipeline's device: syncs on a GPU (equal to device_syncs there)."""
        return sum(r.device_placed for r in self.reads)

    def reads_from(self, fragment: str, *, device_only: bool = False) -> int:
        """Host reads whose calling line is in a file whose path contains fragment (optionally: device-placed)."""
        return sum(fragment in r.source and (r.device_placed or not device_only) for r in self.reads)

    def by_source(self) -> dict[str, int]:
        """Host reads grouped by (op, placement, device, calling line)."""
        return dict(Counter(f"{r.op} of a {'device-placed' if r.device_placed else 'host'} tensor ({r.device}) "
                            f"at {r.source}" for r in self.reads))


def _caller() -> str:
    """file:line of the innermost stack frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        if not any(s in frame.filename for s in _SKIP_FRAMES):
            parts = frame.filename.split("/")
            return f"{'/'.join(parts[-2:])}:{frame.lineno} ({frame.name})"
    return "unknown"


_READ_FUNCS: dict[Any, str] = {
    torch.Tensor.item: "item", torch.Tensor.__bool__: "bool", torch.Tensor.__float__: "float",
    torch.Tensor.__int__: "int", torch.Tensor.__index__: "index", torch.Tensor.tolist: "tolist",
    torch.Tensor.nonzero: "nonzero", torch.nonzero: "nonzero",
}


class _ReadRecorder(TorchFunctionMode):
    """Record every Python-level read of a tensor's value (.item(), bool(), nonzero, ...) with device and line.

    A tensor is device-placed when it lives on an accelerator, or when it was handed to stand_in_for_device
    (or computed from such a tensor) on a machine without one: the CPU run then knows which reads a GPU run
    would have to wait for, though it cannot make them wait."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[HostRead] = []
        self.stand_ins: dict[int, weakref.ref[torch.Tensor]] = {}  # by id: tensors compare by value, not identity

    def is_stand_in(self, t: torch.Tensor) -> bool:
        """Whether t was marked (or computed from a marked tensor) and is still alive."""
        ref = self.stand_ins.get(id(t))
        return ref is not None and ref() is t

    def mark(self, t: torch.Tensor) -> None:
        """Mark a CPU tensor as standing in for a device-placed one."""
        if t.device.type == "cpu":
            self.stand_ins[id(t)] = weakref.ref(t)

    def _placed(self, t: torch.Tensor) -> bool:
        return t.device.type != "cpu" or self.is_stand_in(t)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _READ_FUNCS and args and isinstance(args[0], torch.Tensor):
            self.reads.append(HostRead(_READ_FUNCS[func], str(args[0].device.type), _caller(),
                                       self._placed(args[0])))
        out = func(*args, **kwargs)
        if self.stand_ins and any(isinstance(a, torch.Tensor) and self.is_stand_in(a)
                                  for a in tree_leaves((args, kwargs))):
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor):
                    self.mark(o)
        return out


_ACTIVE: list[_ReadRecorder] = []


def stand_in_for_device(*tensors: torch.Tensor) -> None:
    """Inside count_syncs on a CPU: treat these tensors (and values computed from them) as device-placed."""
    for recorder in _ACTIVE:
        for t in tensors:
            recorder.mark(t)


def count_syncs(fn: Callable[[], Any], device: torch.device) -> tuple[SyncCounts, Any]:
    """Run fn once under the profiler and a read recorder (plus sync debug mode 'warn' on CUDA); count host reads."""
    is_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    recorder = _ReadRecorder()
    previous = torch.cuda.get_sync_debug_mode() if is_cuda else 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if is_cuda:
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("warn")
        try:
            _ACTIVE.append(recorder)
            with measure.quiet_profile(activities=activities) as prof, recorder:
                out = fn()
                if is_cuda:
                    torch.cuda.set_sync_debug_mode(previous)
                    torch.cuda.synchronize(device)
        finally:
            _ACTIVE.remove(recorder)
            if is_cuda:
                torch.cuda.set_sync_debug_mode(previous)
    names = Counter(e.name for e in prof.events() if not (e.cpu_parent and e.cpu_parent.name == e.name))
    ops = {k: names.get(k, 0) for k in (SCALAR_READ, NONZERO, ITEM)}
    counts = SyncCounts(profiler_ops=ops, reads=recorder.reads)
    if is_cuda:
        counts.dtoh_memcpy = sum(n for k, n in names.items() if "Memcpy DtoH" in k)
        counts.cuda_sync_warnings = sum("synchroniz" in str(w.message) for w in caught)
    return counts, out


PLACEMENTS: tuple[str, ...] = ("device", "cpu")


def set_schedule(sched: Any, steps: int, placement: str, begin_index: bool, image_seq_len: int,
                 device: torch.device) -> None:
    """Set a flow-matching scheduler's timesteps as FluxPipeline does, on the device or on the CPU.

    placement 'device' puts sigmas and timesteps on device (what FluxPipeline does), 'cpu' keeps them on the
    host; begin_index calls set_begin_index(0), which FluxPipeline does since diffusers PR 11696, so step()
    skips the nonzero().item() lookup of the first step index."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}; allowed: {PLACEMENTS}")
    cfg = sched.config
    mu = calculate_shift(image_seq_len, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                         cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
    sched.set_timesteps(steps, device=device if placement == "device" else torch.device("cpu"), mu=mu)
    if placement == "device":
        stand_in_for_device(sched.sigmas, sched.timesteps)
    if begin_index:
        sched.set_begin_index(0)


def denoising_loop(pipe: Any, inputs: dict[str, Any], steps: int, placement: str, begin_index: bool,
                   module: torch.nn.Module | None = None) -> Callable[[], torch.Tensor]:
    """A callable running FluxPipeline's denoising loop once: set_timesteps, then forward + step() per step."""
    net = module if module is not None else pipe.transformer
    sched = type(pipe.scheduler).from_config(pipe.scheduler.config)
    latents0 = inputs["hidden_states"]
    fixed = {k: v for k, v in inputs.items() if k not in ("hidden_states", "timestep")}

    @torch.inference_mode()
    def call() -> torch.Tensor:
        set_schedule(sched, steps, placement, begin_index, latents0.shape[1], latents0.device)
        latents = latents0.clone()  # an inference tensor like every later step's, so guards see one kind
        for t in sched.timesteps:
            timestep = t.expand(latents.shape[0]).to(latents.device, latents.dtype)
            noise = net(hidden_states=latents, timestep=timestep / 1000, **fixed)[0]
            latents = sched.step(noise, t, latents, return_dict=False)[0]
        return latents
    return call


def euler_step_loop(scheduler_folder: str, steps: int, placement: str, device: torch.device,
                    shape: tuple[int, ...] = (1, 4, 16, 16)) -> Callable[[], torch.Tensor]:
    """A callable running only EulerDiscreteScheduler.step() (SDXL's scheduler) for steps steps on random latents.

    diffusers keeps this scheduler's sigmas on the CPU; placement 'device' moves them to device after
    set_timesteps, as older diffusers did, so step()'s `s_tmin <= sigma <= s_tmax` reads a device tensor."""
    from diffusers import EulerDiscreteScheduler

    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}; allowed: {PLACEMENTS}")
    sched = EulerDiscreteScheduler.from_config(EulerDiscreteScheduler.load_config(scheduler_folder))
    gen = torch.Generator(device="cpu").manual_seed(0)
    sample = torch.randn(shape, generator=gen).to(device)
    model_output = torch.randn(shape, generator=gen).to(device)

    @torch.inference_mode()
    def call() -> torch.Tensor:
        sched.set_timesteps(steps, device=device)
        sched.set_begin_index(0)
        if placement == "device":
            sched.sigmas = sched.sigmas.to(device)
            stand_in_for_device(sched.sigmas)
        latents = sample
        for t in sched.timesteps:
            latents = sched.scale_model_input(latents, t)
            latents = sched.step(model_output, t, latents, return_dict=False)[0]
        return latents
    return call
