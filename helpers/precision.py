"""Precision plumbing: dtype names, the TF32 switch, one set of weights cast to each dtype, and output drift."""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from helpers import measure

# The four ways of running the same weights; tf32 keeps fp32 storage and lets matmuls/convs use TF32 tensor cores.
DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")
STORAGE: dict[str, torch.dtype] = {
    "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
}
# Significand bits including the implicit one: unit roundoff is 2**-bits (tf32 matmul inputs keep 11 bits).
SIGNIFICAND_BITS: dict[str, int] = {"fp32": 24, "tf32": 11, "fp16": 11, "bf16": 8}


def unit_roundoff(name: str) -> float:
    """Relative rounding error of one value stored in the named format (2**-significand bits)."""
    return 2.0 ** -SIGNIFICAND_BITS[name]


def rounded(value: float, name: str) -> float:
    """value after storing it in the named format."""
    return torch.tensor(value, dtype=torch.float64).to(STORAGE[name]).item()


def tf32_unavailable_reason(device: torch.device) -> str:
    """Why TF32 cannot run on device, or '' when it can (a CUDA GPU of compute capability 8.0 or newer)."""
    if device.type != "cuda":
        return ("TF32 is a tensor-core math mode of NVIDIA GPUs (Ampere, sm_80, and newer); CPU matmuls have no "
                "TF32 path, so PyTorch's TF32 switches change nothing here and a 'tf32' row would just repeat fp32")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}: TF32 tensor cores need sm_80 or newer"
    return ""


def native_half_reason(device: torch.device, name: str) -> str:
    """'' when device computes in the named 16-bit format natively, else why not (CPUs without bf16/fp16 instructions)."""
    if device.type == "cuda" or name not in ("bf16", "fp16"):
        return ""
    supported = (torch.ops.mkldnn._is_mkldnn_bf16_supported if name == "bf16"
                 else torch.ops.mkldnn._is_mkldnn_fp16_supported)()
    if supported:
        return ""
    needs = "AVX512-BF16 or AMX" if name == "bf16" else "AVX512-FP16 or AMX-FP16"
    return (f"this CPU has no {name} instructions for oneDNN to use ({needs}), so PyTorch runs {name} convolutions "
            f"and matmuls through fallback kernels; the convolution fallback (aten::_slow_conv2d_forward) unfolds "
            f"each input into an im2col buffer")


# torch >= 2.9 also has per-backend, per-op switches, torch.backends.<backend>.<op>.fp32_precision: "ieee", "tf32",
# "bf16" (oneDNN only) or "none", which inherits the backend's and then the global torch.backends.fp32_precision.
# The legacy switches set some of these leaves: set_float32_matmul_precision sets both matmul leaves, but
# cudnn.allow_tf32 = False sets the cuDNN leaves to "none", so after torch.backends.fp32_precision = "tf32" a
# convolution would still use TF32. Leaves torch lacks (older versions) are left out.
_FP32_LEAVES: tuple[tuple[str, str], ...] = (("cuda", "matmul"), ("cudnn", "conv"), ("cudnn", "rnn"),
                                             ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))
# Values of a setting that let fp32 math round its inputs to fewer bits.
_REDUCED = {"high", "medium", "tf32", "bf16", True}


def _fp32_leaves() -> dict[str, Any]:
    """The per-op fp32_precision switches this torch has, by name ('cudnn.conv'); empty before torch 2.9."""
    leaves = {}
    for backend, op in _FP32_LEAVES:
        node = getattr(getattr(torch.backends, backend, None), op, None)
        try:
            node.fp32_precision  # noqa: B018 - probing: older torch has no such attribute
        except (AttributeError, RuntimeError):
            continue
        leaves[f"{backend}.{op}"] = node
    return leaves


def _read(getter: Any) -> Any:
    """A legacy switch's value, or why it cannot be read (torch refuses once legacy and new switches disagree)."""
    try:
        return getter()
    except RuntimeError as err:
        return f"unreadable: {str(err).splitlines()[0][:120]}"


def tf32_settings() -> dict[str, Any]:
    """The current global switches that decide whether fp32 matmuls and convolutions may use TF32 (or bf16)."""
    settings = {"float32_matmul_precision": _read(torch.get_float32_matmul_precision),
                "cuda.matmul.allow_tf32": _read(lambda: torch.backends.cuda.matmul.allow_tf32),
                "cudnn.allow_tf32": _read(lambda: torch.backends.cudnn.allow_tf32)}
    settings.update({f"{name}.fp32_precision": leaf.fp32_precision for name, leaf in _fp32_leaves().items()})
    return settings


def reduced_precision_switches(settings: dict[str, Any]) -> list[str]:
    """Names of the switches in settings (from tf32_settings) that let fp32 math use TF32 or bf16, or are unreadable."""
    return [k for k, v in settings.items() if v in _REDUCED or (isinstance(v, str) and v.startswith("unreadable"))]


@contextlib.contextmanager
def tf32(enabled: bool = True) -> Iterator[None]:
    """Inside the block fp32 matmuls and convolutions may (or may not) use TF32; the previous settings return after.

    Sets the legacy switches (set_float32_matmul_precision, cudnn.allow_tf32) and, where torch has them, the
    per-op fp32_precision switches of CUDA and cuDNN; tf32(False) also sets oneDNN's to "ieee" (no bf16 either)."""
    matmul_before = _read(torch.get_float32_matmul_precision)
    cudnn_before = _read(lambda: torch.backends.cudnn.allow_tf32)
    leaves = _fp32_leaves()
    leaves_before = {name: leaf.fp32_precision for name, leaf in leaves.items()}
    try:
        torch.set_float32_matmul_precision("high" if enabled else "highest")
        torch.backends.cudnn.allow_tf32 = enabled
        for name, leaf in leaves.items():
            if not name.startswith("mkldnn"):
                leaf.fp32_precision = "tf32" if enabled else "ieee"
            elif not enabled:
                leaf.fp32_precision = "ieee"
        yield
    finally:
        if matmul_before in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(matmul_before)
        if isinstance(cudnn_before, bool):
            torch.backends.cudnn.allow_tf32 = cudnn_before
        for name, leaf in leaves.items():  # last: the legacy setters above overwrite some leaves
            leaf.fp32_precision = leaves_before[name]


@contextlib.contextmanager
def fp32_reference() -> Iterator[dict[str, Any]]:
    """Compute an fp32 reference inside this block: TF32 (and oneDNN bf16) off for matmuls, convolutions and RNNs.

    PyTorch's defaults allow TF32 in cuDNN convolutions (cudnn.allow_tf32=True), so an "fp32" reference computed
    outside it uses TF32 convolutions on Ampere and newer GPUs. Yields the switches as set inside; restores after."""
    with tf32(False):
        settings = tf32_settings()
        reduced = reduced_precision_switches(settings)
        if reduced:
            raise RuntimeError(f"fp32 reference: {reduced} still allow reduced precision: {settings}")
        yield settings


def _modules(pipe: Any) -> dict[str, torch.nn.Module]:
    """The pipeline's model components (denoiser, text encoders, VAE) by name."""
    return {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}


def master_weights(pipe: Any) -> dict[str, dict[str, torch.Tensor]]:
    """fp32 copies, on the CPU, of every model component's state: the one set of weights all dtypes are cast from."""
    return {name: {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype, copy=True)
                   for k, v in module.state_dict().items()}
            for name, module in _modules(pipe).items()}


_CASTS = {torch.float32: torch.nn.Module.float, torch.bfloat16: torch.nn.Module.bfloat16,
          torch.float16: torch.nn.Module.half}


def cast_module(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast the floating-point parameters and buffers of module to dtype (fp32, bf16 or fp16).

    Same effect as module.to(dtype), without diffusers' ModelMixin.to warning that it may leave modules meant
    to stay in fp32 (it warns even when the list of such modules is empty, as for every model used here)."""
    return _CASTS[dtype](module)


@torch.no_grad()
def cast_pipeline(pipe: Any, dtype: torch.dtype, master: dict[str, dict[str, torch.Tensor]]) -> None:
    """Put every model component of pipe in dtype, its values rounded once from the fp32 master (never twice)."""
    for name, module in _modules(pipe).items():
        cast_module(module, dtype)
        module.load_state_dict(master[name])


def cast_components(pipe: Any, dtype: torch.dtype) -> None:
    """Put every model component of pipe in dtype in place (pipe.to(dtype) without diffusers' keep-in-fp32 warning)."""
    for module in _modules(pipe).values():
        cast_module(module, dtype)


def parameter_bytes(module: torch.nn.Module | Any) -> int:
    """Bytes held by the parameters of a module, or of all model components of a pipeline."""
    modules = [module] if isinstance(module, torch.nn.Module) else list(_modules(module).values())
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


def same_inputs(reference: Any, like: Any) -> Any:
    """like's structure with reference's tensor values, each cast to the dtype like uses at that place."""
    if isinstance(like, dict):
        return {k: same_inputs(reference[k], v) for k, v in like.items()}
    if isinstance(like, (list, tuple)):
        return type(like)(same_inputs(r, v) for r, v in zip(reference, like))
    if isinstance(like, torch.Tensor):
        return reference.to(like.device, like.dtype)
    return like


@dataclass(frozen=True)
class Drift:
    """How far an output is from the fp32 reference: relative L2 error, max abs error, and whether all finite."""

    rel_l2: float
    max_abs: float
    finite: bool


def drift(out: torch.Tensor, ref: torch.Tensor) -> Drift:
    """Relative L2 error ||out - ref|| / ||ref||, max |out - ref| (computed in float64) and a finite check."""
    a = torch.as_tensor(out).detach().to("cpu", torch.float64)
    b = torch.as_tensor(ref).detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs reference {tuple(b.shape)}")
    finite = bool(torch.isfinite(a).all())
    if not finite:
        return Drift(math.inf, math.inf, False)
    diff = a - b
    return Drift(float(diff.norm() / b.norm()), float(diff.abs().max()), True)


def kept_in_fp32(pipe: Any) -> dict[str, int]:
    """Floating-point parameters of a 16-bit pipeline still stored in fp32 ('component.name' -> elements).

    from_pretrained(..., dtype=torch.float16) leaves a model's _keep_in_fp32_modules in fp32: transformers' T5
    lists its feed-forward output layers ('wo'), whose activations overflow fp16. Built from a config in a dtype,
    or converted with .to(dtype), nothing is kept."""
    return {f"{name}.{k}": p.numel() for name, module in _modules(pipe).items()
            for k, p in module.named_parameters() if p.dtype == torch.float32}


@dataclass(frozen=True)
class DenoiserProbe:
    """One denoiser step: its inputs and output at the run's guidance, and at a guidance every format stores exactly."""

    inputs: dict[str, Any]
    exact_inputs: dict[str, Any]
    out: torch.Tensor
    exact_out: torch.Tensor


@torch.inference_mode()
def probe_denoiser(pipe: Any, run: Any, exact_guidance: float, like: DenoiserProbe | None = None) -> DenoiserProbe:
    """One denoiser step of pipe on the run's inputs, and on the same inputs at exact_guidance (Flux embeds guidance;
    SDXL's denoiser takes none, so its two calls are the same). With like (the fp32 probe), the inputs are like's
    values cast to the dtypes pipe uses, so a format's drift measures its arithmetic, not new random draws."""
    from helpers import pipelines, workloads  # here: workloads imports params, which imports this module

    inputs = workloads.run_inputs(pipe, run)
    exact = inputs
    if run.model == "flux-dev":
        s = run.settings
        exact = pipelines.denoiser_inputs(pipe, height=s.height, width=s.width, guidance=exact_guidance,
                                          max_sequence_length=s.max_sequence_length, seed=run.seed)
    if like is not None:
        inputs, exact = same_inputs(like.inputs, inputs), same_inputs(like.exact_inputs, exact)
    out = workloads.first_output(workloads.denoiser_call(pipe, inputs)())
    exact_out = workloads.first_output(workloads.denoiser_call(pipe, exact)())
    return DenoiserProbe(inputs, exact, out, exact_out)


def initial_noise(pipe: Any, height: int, width: int, seed: int, batch: int = 1) -> torch.Tensor:
    """The pipeline's starting latents for seed, drawn in fp32 on the CPU as its fp32 call draws them, then rounded
    to its denoiser's dtype: the same noise in every format (pass it as `latents=`). Asked for fp16 or bf16 values, a
    CPU generator need not draw the fp32 values rounded (torch 2.11 does not; 2.13 does for some sizes, not for all),
    so a generator alone can give each format its own noise. Flux takes packed latents; SDXL the unscaled noise,
    which it multiplies by init_noise_sigma."""
    from diffusers.utils.torch_utils import randn_tensor

    from helpers import pipelines  # here: pipelines imports params, which imports this module

    generator, net = torch.Generator("cpu").manual_seed(seed), pipelines.denoiser(pipe)
    if hasattr(pipe, "transformer"):  # Flux
        noise, _ = pipe.prepare_latents(batch, net.config.in_channels // 4, height, width, torch.float32,
                                        torch.device("cpu"), generator)
    else:
        f = pipe.vae_scale_factor
        noise = randn_tensor((batch, net.config.in_channels, height // f, width // f), generator=generator,
                             device=torch.device("cpu"), dtype=torch.float32)
    return noise.to(device=net.device, dtype=net.dtype)


@dataclass(frozen=True)
class FormatMeasurement:
    """What one format costs on this run: one denoiser step's and the whole pipeline's timings, the pipeline's peak
    memory and images, the switches that allowed reduced precision, and (on a CPU) the working memory and CPU
    time by op."""

    step: measure.Timing
    pipeline: measure.Timing
    memory: measure.Memory
    images: Any
    switches: list[str]
    allocations: dict[str, int]
    cpu_seconds: dict[str, float]


def cpu_seconds_by_op(fn: Callable[[], Any], top: int = 6) -> dict[str, float]:
    """Run fn once under the profiler; the top ops by self CPU time in seconds, largest first."""
    with measure.quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    totals = sorted(((e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()), key=lambda kv: -kv[1])
    return dict(totals[:top])


def measure_format(pipe: Any, run: Any, generate: Callable[[Any], Any], probe: DenoiserProbe) -> FormatMeasurement:
    """Time one denoiser step (probe's inputs) and the whole pipeline (generate(pipe)), take the pipeline's peak memory
    and images, and on a CPU profile two more calls: bytes allocated and self CPU time, by op. Under the current
    TF32 switches, which are recorded; the pipeline's progress bar is switched off for these calls."""
    from helpers import workloads

    pipe.set_progress_bar_config(disable=True)
    s = run.settings
    switches = reduced_precision_switches(tf32_settings())
    step = measure.time_callable(workloads.denoiser_call(pipe, probe.inputs), run.device, repeats=s.repeats,
                                 warmup=s.warmup)
    whole = measure.time_callable(lambda: generate(pipe), run.device, repeats=s.repeats, warmup=s.warmup)
    memory, images = measure.peak_memory(lambda: generate(pipe), run.device)
    allocations: dict[str, int] = {}
    seconds: dict[str, float] = {}
    if not run.is_cuda:
        allocations, _ = measure.cpu_allocations_by_op(lambda: generate(pipe))
        seconds = cpu_seconds_by_op(lambda: generate(pipe))
    return FormatMeasurement(step, whole, memory, images, switches, allocations, seconds)


class FirstOnly(logging.Filter):
    """Pass the first record that contains text, drop the later ones and any whose list after text is empty
    ('kept in float32: []' names no module); records without text pass."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.text not in message:
            return True
        if f"{self.text}: []" in message:
            return False
        passed, self.seen = not self.seen, True
        return passed


KEEP_FP32_NOTICE = "should be kept in float32"
UPCAST_VAE_WARNING = "`upcast_vae` is deprecated"
UPCAST_VAE_NOTE = ("diffusers warns (a FutureWarning) that `upcast_vae` is deprecated and suggests "
                   "pipe.vae.to(torch.float32); in this version that breaks SDXL's fp16 decode (Going deeper, "
                   "'Odds and ends'), so the pipeline's own upcast is kept")


@contextlib.contextmanager
def each_notice_once() -> Iterator[None]:
    """Inside the block, diffusers' notice that a model 'should be kept in float32' (dropped when it names no
    module) shows once, and its FutureWarning about upcast_vae as one line saying why its advice is not taken. SDXL's pipeline in fp16 casts its VAE to fp32
    and back at every call (the VAE's force_upcast), and each cast repeats both."""
    logger = logging.getLogger("diffusers.models.modeling_utils")
    once = FirstOnly(KEEP_FP32_NOTICE)
    logger.addFilter(once)
    shown: list[bool] = []

    # warnings' own "once" forgets what it showed whenever a warnings.catch_warnings block (the profiler's, in
    # helpers.measure) changes the filters, so the repeats are dropped here, where the warning is shown.
    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if UPCAST_VAE_WARNING in str(message):  # once, as what it is: its advice fails in this diffusers
            if not shown:
                print(UPCAST_VAE_NOTE)
            shown.append(True)
            return
        previous(message, category, *args, **kwargs)

    try:
        with warnings.catch_warnings():
            previous = warnings.showwarning
            warnings.showwarning = show
            warnings.filterwarnings("always", message=f".*{UPCAST_VAE_WARNING}", category=FutureWarning)
            yield
    finally:
        logger.removeFilter(once)


def weights_fingerprint(pipe: Any) -> dict[str, tuple[str, float, float]]:
    """Per parameter of every model component ('component.name'): its dtype, and the sum and the sum of squares of its
    values (float64, on its device): equal fingerprints for the same values, so a cast pipeline and a pipeline loaded
    in that dtype can be compared without holding both."""
    with torch.no_grad():
        return {f"{name}.{k}": (str(p.dtype).removeprefix("torch."), float(p.double().sum()),
                                float(p.double().square().sum()))
                for name, module in _modules(pipe).items() for k, p in module.named_parameters()}


def record_format(writer: Any, name: str, pipe: Any, m: FormatMeasurement, probe: DenoiserProbe,
                  ref: DenoiserProbe, reference_images: Any, reference_switches: dict[str, Any],
                  exact_guidance: float) -> dict[str, Any]:
    """Record a format's rows 'denoiser step <name>' and 'pipeline <name>' (timings, memory, weight bytes, what the
    load kept in fp32, the drift of the denoiser's output and of the image from the fp32 reference) through writer;
    return its line of the notebook's table (seconds, MiB, drifts, all finite)."""
    from helpers import pipelines  # here: pipelines imports params, which imports this module

    run = writer.run
    out, exact = drift(probe.out, ref.out), drift(probe.exact_out, ref.exact_out)
    image = drift(m.images, reference_images)
    weights = parameter_bytes(pipe)
    writer.record(f"denoiser step {name}", timing=m.step, dtype=name, rel_l2=out.rel_l2, max_abs=out.max_abs,
                  finite=out.finite and exact.finite, rel_l2_exact_guidance=exact.rel_l2,
                  exact_guidance=exact_guidance if run.model == "flux-dev" else None,
                  denoiser_weight_bytes=parameter_bytes(pipelines.denoiser(pipe)),
                  reduced_precision_switches=m.switches, reference_switches=reference_switches)
    writer.record(f"pipeline {name}", timing=m.pipeline, memory=m.memory, dtype=name, image_rel_l2=image.rel_l2,
                  image_max_abs=image.max_abs, image_finite=image.finite, weight_bytes=weights,
                  kept_in_fp32=kept_in_fp32(pipe) if name in ("fp16", "bf16") else {},
                  not_native_reason=native_half_reason(run.device, name),
                  top_allocators=dict(list(m.allocations.items())[:4]), top_cpu_seconds=m.cpu_seconds)
    return {"step_s": m.step.median_s, "pipeline_s": m.pipeline.median_s, "peak_mib": m.memory.peak_bytes / 2**20,
            "weights_mib": weights / 2**20, "rel_l2": out.rel_l2, "rel_l2_exact": exact.rel_l2,
            "image_rel_l2": image.rel_l2, "finite": out.finite and exact.finite and image.finite}
