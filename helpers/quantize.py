"""NF4 models: diffusers' quantizer steps where its from_pretrained refuses (no GPU), their sizes, the weights'
quantization error and the output drift it allows, and the dynamo settings their compiles ran with.

The loading calls themselves (BitsAndBytesConfig passed to from_pretrained) are the lesson: notebook 09 makes them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch._dynamo


def quantizer_steps(cls: type[torch.nn.Module], folder: str | Path, config: object, device: str | torch.device,
                    dtype: torch.dtype) -> torch.nn.Module:
    """What diffusers' from_pretrained(folder, quantization_config=config) does with a BitsAndBytesConfig, step by
    step, without its GPU check: for a CPU, where diffusers refuses to quantize ("No GPU found")."""
    import accelerate
    import safetensors.torch
    from accelerate.utils import set_module_tensor_to_device
    from diffusers.quantizers.bitsandbytes import BnB4BitDiffusersQuantizer

    device = torch.device(device)
    quantizer = BnB4BitDiffusersQuantizer(config, pre_quantized=False)
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
    """Route NF4 layers whose input width is not a multiple of the block size to bitsandbytes' generic CPU kernel;
    return how many.

    bitsandbytes 0.50.2's AVX512-BF16 CPU path repacks the scales as [out, in // blocksize] on the first
    inference call and fails for such layers (the tiny smoke models are 32 wide; real Flux layers are not)."""
    import bitsandbytes as bnb

    narrow = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)
              and m.in_features % m.weight.quant_state.blocksize]
    for layer in narrow:
        layer.support_avx512bf16_for_cpu = False
    return len(narrow)


def nf4_dequantize(weight: torch.Tensor) -> torch.Tensor:
    """A bitsandbytes 4-bit weight decoded as the format defines it, in fp32, on any machine.

    Each byte holds two 4-bit codes, high nibble first; a code picks one of the 16 levels in quant_state.code;
    each run of quant_state.blocksize values of the flattened weight is scaled by its block's absmax (itself
    8-bit with fp32 scales under double quantization). This is what bitsandbytes' generic kernel computes; its
    native CPU kernel in 0.50.2 gets it wrong on AVX512 CPUs when a row is not a whole number of blocks
    (misdecoded_layers)."""
    qs = weight.quant_state
    if getattr(qs, "packing_format_for_cpu", False):
        raise ValueError("this 4-bit weight was repacked by bitsandbytes' AVX512-BF16 CPU path at its first forward; "
                         "decode it before the first forward")
    packed = weight.data.view(torch.uint8).reshape(-1)
    codes = torch.stack((packed >> 4, packed & 0xF), dim=1).reshape(-1).long()
    n = qs.shape.numel()
    absmax = qs.absmax.float()
    if qs.nested:  # double quantization: the absmax are 8-bit codes with an fp32 scale per block of theirs
        inner = qs.state2
        scale2 = inner.absmax.float().repeat_interleave(inner.blocksize)[: absmax.numel()]
        absmax = inner.code.float()[qs.absmax.long()] * scale2 + qs.offset
    scale = absmax.repeat_interleave(qs.blocksize)[:n]
    return (qs.code.float()[codes][:n] * scale).reshape(qs.shape)


@torch.no_grad()
def weight_error(quantized: torch.nn.Module, reference: torch.nn.Module) -> float:
    """The quantization error of the weights: ||NF4 weights decoded (nf4_dequantize) - reference weights|| /
    ||reference weights|| over every 4-bit linear layer of quantized (the same layer of reference by name), in fp32.

    Call it before the first forward: bitsandbytes' AVX512-BF16 CPU path repacks the weights on the first call."""
    import bitsandbytes as bnb

    ref_modules = dict(reference.named_modules())
    err = norm = 0.0
    for name, layer in quantized.named_modules():
        if not isinstance(layer, bnb.nn.Linear4bit):
            continue
        deq = nf4_dequantize(layer.weight)
        ref = ref_modules[name].weight.detach().to(deq.device).float()  # moved first: widened on the GPU
        err += float((deq - ref).pow(2).sum())
        norm += float(ref.pow(2).sum())
    if norm == 0:
        raise ValueError("no 4-bit linear layer with a nonzero reference weight to compare")
    return (err / norm) ** 0.5


@torch.no_grad()
def nf4_format_error(weights: list[torch.Tensor], blocksize: int = 64,
                     device: torch.device | str | None = None) -> float:
    """The relative L2 error the NF4 format gives these weights, derived from the format alone: every block of
    blocksize consecutive values (flattened) divided by its absmax, rounded to the nearest of the 16 NF4 levels,
    multiplied back. The expected value of weight_error for the same weights, on any machine; computed on device
    (each weight's own when None), one weight at a time."""
    import bitsandbytes.functional as bnbf

    levels = bnbf.get_4bit_type("nf4", device="cpu").float()  # ascending, -1 to 1
    err = norm = 0.0
    for w in weights:  # a GPU's seconds: Flux-1-Dev's 12B weights are minutes of work on a CPU
        flat = w.detach().to(device or w.device).float().reshape(-1)
        on = levels.to(flat.device)
        padded = torch.nn.functional.pad(flat, (0, -flat.numel() % blocksize)).view(-1, blocksize)
        absmax = padded.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        nearest = torch.bucketize(padded / absmax, (on[1:] + on[:-1]) / 2)  # a tie goes to the lower level
        decoded = (on[nearest] * absmax).reshape(-1)[: flat.numel()]
        err += float((decoded - flat).pow(2).sum())
        norm += float(flat.pow(2).sum())
    if norm == 0:
        raise ValueError("no nonzero weight to quantize")
    return (err / norm) ** 0.5


def reference_linear_weights(quantized: torch.nn.Module, reference: torch.nn.Module) -> list[torch.Tensor]:
    """The reference model's weights of the layers quantized holds in 4-bit (matched by name)."""
    ref_modules = dict(reference.named_modules())
    return [ref_modules[name].weight for name in linear4bit_names(quantized)]


# bitsandbytes rounds each value to the nearest level as nf4_format_error does; they differ only where a value sits
# on a midpoint between two levels or the fp32 absmax rounds, so the measured error is within a few parts per
# thousand of the format's. 2% leaves room for that and fails a decode that misplaces blocks (the AVX512 kernel
# bug read 0.22 for a format error of 0.09).
NF4_ERROR_RTOL = 0.02


def weight_error_problem(measured: float, expected: float) -> str:
    """'' when a measured NF4 weight error is within NF4_ERROR_RTOL of the format's expected error, else what is wrong."""
    if not abs(measured - expected) <= NF4_ERROR_RTOL * expected:  # also catches NaN
        return (f"weight error {measured:.4g} is not within {NF4_ERROR_RTOL:.0%} of {expected:.4g}, the error the NF4 "
                f"format gives these weights (16 levels, absmax per block)")
    return ""


@torch.no_grad()
def misdecoded_layers(model: torch.nn.Module) -> list[str]:
    """Names of the 4-bit layers whose weights bitsandbytes' own dequantize_4bit decodes differently from the
    format (nf4_dequantize) on this machine: [] where its kernel is right (every GPU; CPUs without AVX512)."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    wrong = []
    for name, layer in model.named_modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            w = layer.weight
            got = bnbf.dequantize_4bit(w.data, w.quant_state)
            # bitsandbytes multiplies level x absmax in fp32 and rounds once to its output dtype (the scales'):
            # a right decode is within one rounding of the format's; a misplaced block scale is off by O(1)
            expected = nf4_dequantize(w).to(got.dtype)
            tol = 2 * torch.finfo(got.dtype).eps
            if not torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol * float(expected.abs().max())):
                wrong.append(name)
    return wrong


def _format_decode_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Linear4bit.forward with the weight decoded by nf4_dequantize: bitsandbytes' generic path, dequantize then
    matmul in the compute dtype."""
    dtype = self.compute_dtype or x.dtype
    bias = None if self.bias is None else self.bias.to(dtype)
    return torch.nn.functional.linear(x.to(dtype), nf4_dequantize(self.weight).to(dtype), bias).to(x.dtype)


def decode_by_format(model: torch.nn.Module) -> list[str]:
    """Give the layers misdecoded_layers finds a forward that decodes by the format (dequantize, then matmul, as
    bitsandbytes' generic kernel does) and keep them off the AVX512-BF16 repacking; return their names.

    bitsandbytes 0.50.2's native CPU dequantize_4bit, on AVX512 CPUs, misplaces the scales of rows that are not a
    whole number of 64-value blocks (the smoke models' 32-wide layers; no Flux-1-Dev layer), so those layers would
    compute with wrong weights. Nothing changes where the kernel is right."""
    import types

    wrong = misdecoded_layers(model)
    modules = dict(model.named_modules())
    for name in wrong:
        layer = modules[name]
        layer.support_avx512bf16_for_cpu = False
        layer.forward = types.MethodType(_format_decode_forward, layer)
    return wrong


DRIFT_FLOOR_FACTOR = 0.1  # drift below weight_error x this: the 4-bit weights barely entered the computation
DRIFT_CEILING_FACTOR = 10.0  # drift above weight_error x this (or above 1): the error grew far past the weights'


def drift_band(weight_err: float) -> tuple[float, float]:
    """The output drift NF4 may show, given its weights' quantization error: (weight_err / 10, min(1, 10 x weight_err)).

    An output of a layer y = W x with the rounding error dW spread over W moves by about weight_err (relative L2);
    through a network it may shrink or grow, but not by an order of magnitude either way in one forward or a few
    steps. Above 1 the output is further from the reference than a zero output is: it carries nothing of it."""
    return DRIFT_FLOOR_FACTOR * weight_err, min(1.0, DRIFT_CEILING_FACTOR * weight_err)


def drift_problems(drift: dict[str, float], weight_errors: dict[str, float]) -> list[str]:
    """What is wrong with NF4's output drift (relative L2 vs the reference, per output) given the quantization error
    of the weights behind each output: [] when every drift is finite and inside drift_band of its weight error."""
    problems = []
    for name, d in drift.items():
        low, high = drift_band(weight_errors[name])
        if not (low < d < high):  # also catches NaN
            problems.append(f"{name}: drift {d:.4g} outside ({low:.4g}, {high:.4g}), the band for a weight "
                            f"quantization error of {weight_errors[name]:.4g}")
    return problems


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


COMPILE_DRIFT_SHARE = 0.5  # compiled vs eager NF4 must differ by less than this share of NF4's own drift


def compile_drift_problem(compiled_vs_eager: float | None, nf4_drift: float) -> str:
    """'' when the compiled NF4 output is closer to the eager NF4 output than COMPILE_DRIFT_SHARE x the eager NF4
    output's drift from the reference (a new rounding order, not a different computation), else what is wrong."""
    if compiled_vs_eager is None:
        return "no compiled-vs-eager drift was measured"
    bound = COMPILE_DRIFT_SHARE * nf4_drift
    if not compiled_vs_eager < bound:  # also catches NaN
        return (f"compiled NF4 differs from eager NF4 by {compiled_vs_eager:.4g}, not below {bound:.4g} "
                f"({COMPILE_DRIFT_SHARE:g} x NF4's drift {nf4_drift:.4g} from the reference)")
    return ""


# --- Notebook 09's CPU path, per-component summary, and compiled-call measurement (one call each) ---

def _local_folder(source: str | Path, subfolder: str) -> Path:
    """A local folder holding source's subfolder: source itself when it is a folder, else a hub snapshot of it."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(source), allow_patterns=[f"{subfolder}/*", "model_index.json"]))


def nf4_pipeline_on_cpu(pipeline_class: Any, source: str | Path, quant_config: Any, device: str | torch.device,
                        dtype: torch.dtype, refused: BaseException) -> tuple[Any, dict[str, str]]:
    """What pipeline_class.from_pretrained(source, quantization_config=quant_config, dtype=dtype) loads, where
    diffusers' bitsandbytes quantizer refuses (no GPU: `refused`); return the pipeline and, per quantized
    component, how it was loaded.

    Each component in quant_config.components_to_quantize gets the config the pipeline call would resolve for it:
    a transformers model through its own from_pretrained (transformers' quantizer accepts bitsandbytes' CPU
    backend), a diffusers model through quantizer_steps. Then bitsandbytes' CPU kernels are kept off their two
    AVX512 faults (generic_cpu_path_for_narrow_layers, decode_by_format); the paths say how many layers each
    touched. Nothing here runs a forward, so weight_error can still read the weights."""
    import importlib

    device = torch.device(device)
    index = pipeline_class.load_config(str(source))
    loaded, paths = {}, {}
    for name in quant_config.components_to_quantize:
        library, class_name = index[name]
        cls = getattr(importlib.import_module(library), class_name)
        config = quant_config._resolve_quant_config(is_diffusers=library == "diffusers", module_name=name)
        if library == "transformers":
            model = cls.from_pretrained(source, subfolder=name, quantization_config=config, dtype=dtype,
                                        device_map={"": str(device)})
            path = f"transformers {class_name}.from_pretrained(quantization_config=BitsAndBytesConfig(nf4))"
        else:
            model = quantizer_steps(cls, _local_folder(source, name) / name, config, device, dtype)
            reason = f"{type(refused).__name__}: {str(refused).strip().splitlines()[0]}"
            path = (f"diffusers BnB4BitDiffusersQuantizer steps (preprocess_model -> create_quantized_param -> "
                    f"postprocess_model); from_pretrained refused with {reason!r}")
        if device.type == "cpu":
            nf4 = len(linear4bit_names(model))
            narrow = generic_cpu_path_for_narrow_layers(model)
            routed = len(decode_by_format(model))
            if narrow and narrow == routed:  # one count, said once
                path += (f"; {narrow} of {nf4} NF4 layers (input width not a multiple of the 64-weight block) on "
                         "bitsandbytes' generic CPU kernel, and decoded by the format, which its AVX512 kernel gets wrong")
            else:
                path += f"; {narrow} of {nf4} NF4 layers on bitsandbytes' generic CPU kernel" if narrow else ""
                path += f"; {routed} of {nf4} NF4 layers decoded by the format (CPU kernel misdecodes them)" if routed else ""
        loaded[name], paths[name] = model, path
    pipe = pipeline_class.from_pretrained(source, dtype=dtype, **loaded).to(device)
    return pipe, paths


def component_summary(model: torch.nn.Module, reference: torch.nn.Module) -> dict[str, Any]:
    """What NF4 made of one component, against the reference model it was loaded from: layers, bytes (linear
    weights and whole component), and the weights' quantization error beside the error the format gives them.

    Call it before the model's first forward (weight_error: bitsandbytes' AVX512-BF16 CPU path repacks)."""
    b = linear4bit_bytes(model)
    whole_ref, whole_nf4 = footprint_bytes(reference), footprint_bytes(model)
    return {"linear4bit_layers": b["layers"], "linear_layers_kept": unquantized_linear_names(model),
            "nf4_linear_bytes": b["nf4_bytes"], "nf4_packed_bytes": b["packed_bytes"],
            "nf4_scale_bytes": b["scale_bytes"], "bf16_linear_bytes": b["bf16_bytes"],
            "reference_linear_bytes": linear_weight_bytes(reference, linear4bit_names(model)),
            "reference_itemsize": reference.dtype.itemsize,
            "linear_bytes_ratio": b["nf4_bytes"] / b["bf16_bytes"],
            "weight_error": weight_error(model, reference),
            "weight_error_format": nf4_format_error(reference_linear_weights(model, reference),
                                                    device=next(model.parameters()).device),  # the NF4 model's GPU
            "footprint_reference_bytes": whole_ref["total_bytes"], "footprint_nf4_bytes": whole_nf4["total_bytes"],
            "footprint_nf4_parts": whole_nf4, "get_memory_footprint_nf4_bytes": model.get_memory_footprint()}


@torch.no_grad()
def format_mismatch(model: torch.nn.Module, seed: int = 0) -> float:
    """The largest relative L2 distance, over the model's 4-bit layers, between what a layer computes on a random
    input and the same matmul with the weights the format decodes (nf4_dequantize) in fp32: a bf16 rounding where
    the kernel is right, the size of the weights themselves where it misdecodes (or a routing is missing).

    Each layer is decoded before its own forward (its first forward may repack the weights on an AVX512 CPU)."""
    import bitsandbytes as bnb

    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for layer in model.modules():
        if not isinstance(layer, bnb.nn.Linear4bit):
            continue
        w = layer.weight
        x = torch.randn(2, layer.in_features, generator=gen).to(w.device)
        bias = None if layer.bias is None else layer.bias.float()
        expected = torch.nn.functional.linear(x, nf4_dequantize(w).to(w.device), bias)
        got = layer(x.to(layer.compute_dtype or torch.float32))
        worst = max(worst, relative_l2(expected, got))
    return worst


def time_compiled(call: Any, latents_call: Any, device: torch.device, *, repeats: int, warmup: int) -> dict[str, Any]:
    """Measure a pipeline call whose denoiser was just compiled (lazily: the first call compiles): the first call's
    seconds and graphs, the warm calls' timing and peak memory, graph breaks, recompiles after warm-up, the final
    latents, and the capture_dynamic_output_shape_ops value each compile saw. An exception becomes
    {"status": "failed", "reason": ...}: compiling bitsandbytes layers may be unsupported somewhere."""
    from helpers import compile_tools, measure

    compile_tools.reset()
    try:
        with dynamo_config_at_compile("capture_dynamic_output_shape_ops") as seen:
            with compile_tools.counting() as first:
                compile_s, _ = measure.first_call_seconds(call, device)
            with compile_tools.counting() as steady:
                timing = measure.time_callable(call, device, repeats=repeats, warmup=warmup)
                memory, _ = measure.peak_memory(call, device)
                latents = latents_call()
    except Exception as err:  # noqa: BLE001 - recorded as a failed row, the Checks cell says what must hold
        text = str(err).strip()
        return {"status": "failed", "reason": f"{type(err).__name__}: {text.splitlines()[0][:300] if text else ''}"}
    return {"status": "ok", "timing": timing, "memory": memory, "compile_s": compile_s, "graphs": first.graphs,
            "graph_breaks": first.graph_breaks + steady.graph_breaks, "recompiles": steady.recompiles,
            "latents": latents, "compiles_traced": len(seen),
            "dynamic_shapes_at_compile": config_held(seen, "capture_dynamic_output_shape_ops", True)}


def record_compiled(rows: Any, scenario: str, c: dict[str, Any], eager_latents: torch.Tensor,
                    eager_drift: float | None, compile_kind: str, no_reference: str = "",
                    **extra: Any) -> list[tuple[str, Any, Any, bool]]:
    """Record what time_compiled measured as the row `scenario` (a failed row with the reason otherwise), print one
    line, and return its claims (claim, measured, expected, holds): no graph breaks and no recompiles after warm-up,
    capture_dynamic_output_shape_ops on in every compile, and finite latents closer to eager NF4 than
    COMPILE_DRIFT_SHARE of NF4's own drift. Without a reference (eager_drift None, no_reference saying why) NF4's
    drift is unknown: the compiled latents are checked for being finite, and the bound is a `skipped` row
    'not checkable: ...' with the reason."""
    if (eager_drift is None) != bool(no_reference):
        raise ValueError("record_compiled: pass no_reference (why) exactly when eager_drift is None")
    ok = c["status"] == "ok"
    if not ok:
        rows.record(scenario, status="failed", reason=c["reason"], compile_kind=compile_kind, **extra)
        print(f"{scenario}: {c['reason']}")
    else:
        c["vs_eager"], c["finite"] = relative_l2(eager_latents, c["latents"]), bool(c["latents"].isfinite().all())
        rows.record(scenario, timing=c["timing"], memory=c["memory"], compile_s=c["compile_s"],
                    recompiles=c["recompiles"], graph_breaks=c["graph_breaks"], compile_kind=compile_kind,
                    graphs_compiled=c["graphs"], drift_vs_eager_nf4=c["vs_eager"], outputs_finite=c["finite"],
                    compiles_traced=c["compiles_traced"],
                    capture_dynamic_output_shape_ops_at_compile=c["dynamic_shapes_at_compile"], **extra)
        print(f"{scenario}: first call {c['compile_s']:.1f} s ({c['graphs']} graphs), then median "
              f"{c['timing'].median_s:.3f} s; latents vs eager NF4: relative L2 {c['vs_eager']:.2e}")
    bounded = (f"{scenario}: finite, and closer to eager NF4 than half of NF4's drift", c.get("vs_eager"),
               f"< {COMPILE_DRIFT_SHARE * eager_drift:.3g}" if eager_drift is not None else "",
               ok and c["finite"] and eager_drift is not None and not compile_drift_problem(c["vs_eager"], eager_drift))
    if eager_drift is None:
        rows.record(f"not checkable: {bounded[0]}", status="skipped", reason=f"no reference: {no_reference}")
        bounded = (f"{scenario}: finite latents", c.get("finite"), True, ok and c["finite"] is True)
    return [(f"{scenario}: ran without graph breaks, and without recompiles after warm-up",
             f"{c['graph_breaks']} breaks, {c['recompiles']} recompiles" if ok else c["reason"], "0 and 0",
             ok and c["graph_breaks"] == 0 and c["recompiles"] == 0),
            (f"{scenario}: capture_dynamic_output_shape_ops was on in every compile",
             c.get("dynamic_shapes_at_compile"), True, ok and c["dynamic_shapes_at_compile"] is True),
            bounded]


def offload_peak_claims(rows: Any, offloaded: Any, alone: Any) -> list[tuple[str, Any, Any, bool]]:
    """The claim that model offload lowers NF4's peak: offloaded and alone are measure.Memory results; alone a
    string (why NF4 alone did not run) records the claim as a `skipped` row 'not checkable: ...' instead."""
    claim = "model offload lowers NF4's peak GPU memory"
    if isinstance(alone, str):
        if not alone:
            raise ValueError("offload_peak_claims: give NF4 alone's memory, or why it did not run")
        rows.record(f"not checkable: {claim}", status="skipped", reason=f"NF4 alone did not run: {alone}")
        return []
    return [(claim, offloaded.peak_bytes, f"< {alone.peak_bytes}", offloaded.peak_bytes < alone.peak_bytes)]


def time_eager(call: Any, latents_call: Any, device: torch.device, *, repeats: int, warmup: int) -> dict[str, Any]:
    """Measure an uncompiled pipeline call: its timing (warm-up, then the median), its peak memory and its final
    latents (latents_call)."""
    from helpers import measure

    timing = measure.time_callable(call, device, repeats=repeats, warmup=warmup)
    memory, _ = measure.peak_memory(call, device)
    return {"timing": timing, "memory": memory, "latents": latents_call()}


def speedup(eager_timing: Any, compiled: dict[str, Any]) -> float | None:
    """Eager median over the compiled median of time_compiled's result, None where compiling failed."""
    return eager_timing.median_s / compiled["timing"].median_s if compiled["status"] == "ok" else None
