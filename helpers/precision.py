"""Precision plumbing: dtype names, the TF32 switch, one set of weights cast to each dtype, and output drift."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

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
