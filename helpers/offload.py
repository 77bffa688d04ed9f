"""Report the hooks diffusers' CPU offload modes installed on a pipeline, check them, free pipelines.

The offload calls themselves (`pipe.enable_model_cpu_offload()` and the others) are the lesson: notebook 08 makes
them in a cell of its own."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from helpers import compile_tools, pipelines, quantize, workloads

MODES: tuple[str, ...] = ("model", "sequential", "group_block", "group_leaf")  # the OFFLOAD_MODES notebook 08 offers


def hook_summary(pipe: Any) -> dict[str, dict[str, Any]]:
    """Per model component: accelerate hooks (count, types), diffusers group-offload hooks, parameter devices."""
    out: dict[str, dict[str, Any]] = {}
    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        accel = [type(m._hf_hook).__name__ for m in component.modules() if hasattr(m, "_hf_hook")]
        group = [m for m in component.modules()
                 if getattr(m, "_diffusers_hook", None) is not None
                 and m._diffusers_hook.get_hook("group_offloading") is not None]
        out[name] = {
            "accelerate_hooks": len(accel),
            "accelerate_hook_types": sorted(set(accel)),
            "group_offload_hooks": len(group),
            "parameter_devices": sorted({p.device.type for p in component.parameters()}),
        }
    return out


def _has_offload_hook(module: torch.nn.Module) -> bool:
    """True when module carries an accelerate hook or a diffusers group-offloading hook."""
    group = getattr(module, "_diffusers_hook", None)
    return hasattr(module, "_hf_hook") or (group is not None and group.get_hook("group_offloading") is not None)


def hooks_in_repeated_blocks(model: torch.nn.Module) -> int:
    """Offload hooks on or inside model's repeated blocks (what compile_repeated_blocks compiles): 0 lets them trace."""
    blocks = [m for m in model.modules() if type(m).__name__ in (getattr(model, "_repeated_blocks", None) or [])]
    return sum(_has_offload_hook(m) for block in blocks for m in block.modules())


def describe_error(err: BaseException) -> str:
    """'ExceptionType: first line of the message', short enough for a result row."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300] if text else ''}"


def error_of(fn: Callable[[], Any]) -> str:
    """Call fn; return '' when it succeeds, else describe_error of what it raised."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 the error itself is the fact being recorded
        return describe_error(err)
    return ""


def no_accelerator_reason(mode: str) -> str:
    """Why an offload mode cannot be measured on a machine without a CUDA GPU."""
    return (f"{mode} offload moves weights between CPU memory and an accelerator; this machine has no CUDA GPU, "
            "so there is no accelerator memory to save and no transfer to time (measured on the full profile)")


def accelerate_sequential_offload(pipe: Any, execution_device: str | torch.device) -> None:
    """What pipe.enable_sequential_cpu_offload() installs (accelerate.cpu_offload on each component), device as given.

    diffusers rewrites the device as '<type>:<index>' ('cpu' becomes 'cpu:0') before calling accelerate; this
    passes execution_device through unchanged, so the CPU can stand in for the accelerator."""
    from accelerate import cpu_offload

    for name, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        if name in pipe._exclude_from_cpu_offload:
            component.to(execution_device)
        else:
            cpu_offload(component, execution_device, offload_buffers=len(component._parameters) > 0)


def execution_device_check(device: str | torch.device) -> dict[str, str]:
    """What accelerate's offload does with one execution device: what Parameter.to(device) returns, and whether
    an nn.Linear under accelerate.cpu_offload(execution_device=device) runs on a CPU input."""
    from accelerate import cpu_offload

    param = torch.nn.Parameter(torch.zeros(1))
    moved = param.to(device)
    layer = torch.nn.Linear(4, 4)
    cpu_offload(layer, execution_device=device)
    error = error_of(lambda: layer(torch.ones(2, 4)))
    return {"nn.Parameter(cpu tensor).to(device) returns": "the same Parameter" if moved is param
            else f"a new {type(moved).__name__}",
            "nn.Linear under accelerate.cpu_offload": error or "runs"}


def regional_trace(pipe: Any, inputs: dict[str, Any]) -> tuple[str, compile_tools.CompileCounts]:
    """Trace the denoiser's repeated blocks with fullgraph=True on dynamo's eager backend (no kernels are built),
    under whatever hooks the pipeline carries, for one forward; return the error ('' if it traced) and the counts.

    The blocks are uncompiled and dynamo is reset afterwards, so the pipeline is eager again."""
    net = pipelines.denoiser(pipe)
    compile_tools.reset()
    net.compile_repeated_blocks(fullgraph=True, backend="eager")
    try:
        with compile_tools.counting() as counts:
            error = error_of(lambda: workloads.denoiser_call(pipe, inputs)())
    finally:
        for module in net.modules():
            if getattr(module, "_compiled_call_impl", None) is not None:
                compile_tools.uncompile(module)
        compile_tools.reset()
    return error, counts


def compile_trace(pipe: Any, inputs: dict[str, Any], cache_size_limit: int) -> dict[str, Any]:
    """Compile the whole denoiser with torch.compile (graph breaks allowed) on dynamo's eager backend, under whatever
    hooks the pipeline carries and with cache_size_limit raised, and run one forward twice (no kernels are built,
    nothing is timed); return what happened, for a row.

    Keys: traced (no error), trace_error, graphs_traced and graph_breaks (first forward), recompiles (graphs the
    second forward added), cache_size_limit_at_compile (the values dynamo saw when it compiled), matches_eager
    (both outputs equal the uncompiled forward's). The model is uncompiled and dynamo reset afterwards."""
    net = pipelines.denoiser(pipe)
    call = workloads.denoiser_call(pipe, inputs)
    outs: dict[str, Any] = {}
    error = error_of(lambda: outs.setdefault("eager", workloads.first_output(call())))
    compile_tools.reset()
    net.compile(backend="eager")
    try:
        with (torch._dynamo.config.patch(cache_size_limit=cache_size_limit),
              quantize.dynamo_config_at_compile("cache_size_limit") as seen):
            with compile_tools.counting() as first:
                error = error or error_of(lambda: outs.setdefault("first", workloads.first_output(call())))
            with compile_tools.counting() as second:
                error = error or error_of(lambda: outs.setdefault("second", workloads.first_output(call())))
    finally:
        for module in net.modules():
            compile_tools.uncompile(module)
        compile_tools.reset()
    return {"traced": not error, "trace_error": error, "graphs_traced": first.graphs,
            "graph_breaks": first.graph_breaks, "recompiles": second.graphs,
            "cache_size_limit_at_compile": sorted({s["cache_size_limit"] for s in seen}),
            "matches_eager": not error and all(torch.equal(outs[k], outs["eager"]) for k in ("first", "second"))}


def _empty(tensor: torch.Tensor) -> None:
    """Empty a tensor in place, with the inner tensors of a wrapper subclass (torchao's int8/fp8 weights)."""
    quant_state = getattr(tensor, "quant_state", None)
    if quant_state is not None:  # bitsandbytes 4-bit weights keep their scales beside the data
        tensor.quant_state = None
    if hasattr(tensor, "__tensor_flatten__"):  # the data lives in the inner tensors (qdata, scale, ...)
        for inner in (getattr(tensor, name, None) for name in tensor.__tensor_flatten__()[0]):
            if isinstance(inner, torch.Tensor):
                _empty(inner)
    with torch.inference_mode(tensor.is_inference()):  # hooks may have made inference tensors
        tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def free_pipeline(*parts: Any) -> int:
    """Free pipelines or modules for good: drop compiled graphs, empty every tensor they hold, collect garbage and
    empty the CUDA cache; return the CUDA bytes still allocated afterwards (0 without CUDA).

    Emptying the tensors in place frees them even where a closure or a hook still refers to the module, so the
    next peak-memory measurement does not count them; the parts are unusable afterwards."""
    compile_tools.reset()  # dynamo's caches and guards refer to the compiled modules
    for part in parts:
        components = part.components.values() if hasattr(part, "components") else [part]
        for module in components:
            if not isinstance(module, torch.nn.Module):
                continue
            for tensor in [*module.parameters(), *module.buffers()]:
                _empty(tensor)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated()
    return 0
