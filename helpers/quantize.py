"""Load models with bitsandbytes NF4 linear layers through diffusers' and transformers' quantizers, size them, and
record the dynamo settings their compiles ran with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diffusers
import torch
import torch._dynamo
import transformers


def nf4_config(cls: type[torch.nn.Module], compute_dtype: torch.dtype = torch.bfloat16) -> object:
    """The NF4 BitsAndBytesConfig of the library that owns cls (transformers for text encoders, else diffusers)."""
    library = transformers if issubclass(cls, transformers.PreTrainedModel) else diffusers
    return library.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=compute_dtype)


def _diffusers_quantizer_steps(cls: type[torch.nn.Module], folder: Path, device: torch.device,
                               dtype: torch.dtype) -> torch.nn.Module:
    """What diffusers' from_pretrained does with a BitsAndBytesConfig, step by step, without its GPU check."""
    import accelerate
    import safetensors.torch
    from accelerate.utils import set_module_tensor_to_device
    from diffusers.quantizers.bitsandbytes import BnB4BitDiffusersQuantizer

    quantizer = BnB4BitDiffusersQuantizer(nf4_config(cls, dtype), pre_quantized=False)
    with accelerate.init_empty_weights():
        model = cls.from_config(cls.load_config(folder))
    quantizer.preprocess_model(model, device_map={"": str(device)}, keep_in_fp32_modules=[])
    state: dict[str, torch.Tensor] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        state.update(safetensors.torch.load_file(file))
    for name, value in state.items():
        if quantizer.check_if_quantized_param(model, value, name, state):
            quantizer.create_quantized_param(model, value, name, device, state)
        else:
            set_module_tensor_to_device(model, name, device, value=value,
                                        dtype=dtype if value.is_floating_point() else None)
    model = quantizer.postprocess_model(model)
    model.hf_quantizer = quantizer
    return model.eval()


def generic_cpu_path_for_narrow_layers(model: torch.nn.Module) -> int:
    """Route NF4 layers whose input width is not a multiple of the block size to bitsandbytes' generic CPU kernel.

    bitsandbytes 0.50.2's AVX512-BF16 CPU path repacks the scales as [out, in // blocksize] on the first
    inference call and fails for such layers (the tiny smoke models are 32 wide; real Flux layers are not)."""
    import bitsandbytes as bnb

    narrow = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)
              and m.in_features % m.weight.quant_state.blocksize]
    for layer in narrow:
        layer.support_avx512bf16_for_cpu = False
    return len(narrow)


def _cpu_note(model: torch.nn.Module) -> str:
    """Apply the narrow-layer CPU fallback and say what it did, for the path description."""
    n = generic_cpu_path_for_narrow_layers(model)
    total = len(linear4bit_names(model))
    return (f"; {n} of {total} NF4 layers (input width not a multiple of 64) run on bitsandbytes' generic CPU "
            "kernel because its AVX512-BF16 packing fails for them") if n else ""


def load_nf4(cls: type[torch.nn.Module], folder: str | Path, device: str | torch.device,
             dtype: torch.dtype = torch.bfloat16) -> tuple[torch.nn.Module, str]:
    """Load a model saved in folder with NF4 linear layers on device; return it and the path that ran."""
    device, folder = torch.device(device), Path(folder)
    config = nf4_config(cls, dtype)
    if issubclass(cls, transformers.PreTrainedModel):
        model = cls.from_pretrained(folder, quantization_config=config, dtype=dtype, device_map={"": str(device)})
        note = _cpu_note(model) if device.type == "cpu" else ""
        return model.eval(), (f"transformers {cls.__name__}.from_pretrained(quantization_config=BitsAndBytesConfig"
                              f"(nf4)) on {device.type}{note}")
    if device.type == "cuda":
        model = cls.from_pretrained(folder, quantization_config=config, torch_dtype=dtype)
        return model.eval(), f"diffusers {cls.__name__}.from_pretrained(quantization_config=BitsAndBytesConfig(nf4))"
    try:
        model = cls.from_pretrained(folder, quantization_config=config, torch_dtype=dtype)
        return model.eval(), (f"diffusers {cls.__name__}.from_pretrained(quantization_config=...) on {device.type}"
                              f"{_cpu_note(model) if device.type == 'cpu' else ''}")
    except RuntimeError as err:
        refused = f"{type(err).__name__}: {err}"
    model = _diffusers_quantizer_steps(cls, folder, device, dtype)
    note = _cpu_note(model) if device.type == "cpu" else ""
    return model, (f"diffusers BnB4BitDiffusersQuantizer steps (preprocess_model -> create_quantized_param -> "
                   f"postprocess_model) on {device.type}; from_pretrained refused with {refused!r}{note}")


def linear4bit_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the NF4 linear weights (packed codes plus scale factors) and of the same weights in bf16."""
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    packed = scales = elements = 0
    for layer in layers:
        w = layer.weight
        qs = w.quant_state
        packed += w.numel() * w.element_size()
        scales += qs.absmax.numel() * qs.absmax.element_size()
        if qs.nested:  # double quantization: the scales are themselves 8-bit with fp32 second-level scales
            scales += qs.state2.absmax.numel() * qs.state2.absmax.element_size() + qs.offset.numel() * 4
        elements += qs.shape.numel()
    return {"layers": len(layers), "weight_elements": elements, "packed_bytes": packed, "scale_bytes": scales,
            "nf4_bytes": packed + scales, "bf16_bytes": 2 * elements}


def linear4bit_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the NF4 linear layers of a model."""
    import bitsandbytes as bnb

    return [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]


def unquantized_linear_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the plain nn.Linear layers a quantizer left in higher precision."""
    import bitsandbytes as bnb

    return [n for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not isinstance(m, bnb.nn.Linear4bit)]


def linear_weight_bytes(model: torch.nn.Module, names: list[str]) -> int:
    """Bytes of the weights of the named nn.Linear layers of an unquantized model, as stored."""
    modules = dict(model.named_modules())
    return sum(modules[n].weight.numel() * modules[n].weight.element_size() for n in names)


def _quant_state_tensors(quant_state: object) -> list[torch.Tensor]:
    """The tensors a bitsandbytes QuantState holds: scales (absmax), code book, and the nested level's, if any."""
    tensors = [getattr(quant_state, n, None) for n in ("absmax", "code", "offset")]
    nested = getattr(quant_state, "state2", None)
    if nested is not None:
        tensors += _quant_state_tensors(nested)
    return [t for t in tensors if isinstance(t, torch.Tensor)]


def footprint_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes a model holds: parameters, buffers, and the quant-state tensors of its bitsandbytes 4-bit weights.

    get_memory_footprint() counts parameters and buffers only; a Params4bit weight keeps its scales (absmax),
    its 16-entry code book and any nested-quantization state in weight.quant_state, which it leaves out. Each
    tensor is counted once, however many modules share it."""
    seen: set[tuple[str, int, int]] = set()

    def size(tensors: list[torch.Tensor]) -> int:
        total = 0
        for t in tensors:
            key = (str(t.device), t.data_ptr(), t.numel())
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
        return total

    params = list(model.parameters())
    out = {"parameter_bytes": size(params), "buffer_bytes": size(list(model.buffers()))}
    out["quant_state_bytes"] = size([t for p in params if getattr(p, "quant_state", None) is not None
                                     for t in _quant_state_tensors(p.quant_state)])
    out["total_bytes"] = out["parameter_bytes"] + out["buffer_bytes"] + out["quant_state_bytes"]
    return out


def relative_l2(reference: torch.Tensor, other: torch.Tensor) -> float:
    """||other - reference|| / ||reference||, computed in fp32."""
    ref, oth = reference.detach().float(), other.detach().float().to(reference.device)
    return float((oth - ref).norm() / ref.norm())


@contextlib.contextmanager
def dynamo_config_at_compile(*names: str) -> Iterator[list[dict[str, Any]]]:
    """Inside the block, record the named torch._dynamo.config values each time dynamo starts compiling a frame.

    torch.compile is lazy: the settings that count are those in force when a call traces, not when .compile() ran.
    Yields the list the records are appended to (one dict per compile)."""
    seen: list[dict[str, Any]] = []

    def record(*_args: Any) -> None:  # torch >= 2.8 passes CallbackArgs, older versions nothing
        seen.append({name: getattr(torch._dynamo.config, name) for name in names})

    handler = torch._dynamo.callback_handler
    handler.register_start_callback(record)
    try:
        yield seen
    finally:
        handler.remove_start_callback(record)


def config_held(seen: list[dict[str, Any]], name: str, value: Any) -> bool | None:
    """Whether every compile recorded by dynamo_config_at_compile saw name == value; None when nothing compiled."""
    return all(s[name] == value for s in seen) if seen else None
