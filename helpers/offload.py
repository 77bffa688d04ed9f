"""Report the hooks diffusers' CPU offload modes installed on a pipeline, check them, measure them, free pipelines.

The offload calls themselves (`pipe.enable_model_cpu_offload()` and the others) are the lesson: notebook 08 makes
them in a cell of its own and hands them to ModeChecks, which writes one row per step and lists the claims."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from helpers import checks, compile_tools, measure, params, pipelines, quantize, text, workloads
from helpers.params import Run
from helpers.results import ResultWriter

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
    message = str(err).strip()
    line = message.splitlines()[0] if message else ""
    cut = line[:300] + (" …" if len(line) > 300 or line.endswith(":") else "")  # a line that goes on says so
    return f"{type(err).__name__}: {cut}"


def error_of(fn: Callable[[], Any]) -> str:
    """Call fn; return '' when it succeeds, else describe_error of what it raised."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 the error itself is the fact being recorded
        return describe_error(err)
    return ""


def check_blocks_per_group(value: Any, use_stream: bool) -> int:
    """BLOCKS_PER_GROUP, a positive int; above 1 only without USE_STREAM (diffusers prefetches one block at a time on
    a stream and quietly resets the group to 1 block, so the run would not be the one asked for)."""
    blocks = params.check_positive_int("BLOCKS_PER_GROUP", value)
    if blocks > 1 and use_stream:
        raise params.ParameterError(f"BLOCKS_PER_GROUP={blocks} with USE_STREAM=True: diffusers offloads one block per "
                                    "group when it prefetches on a stream; set BLOCKS_PER_GROUP=1, or USE_STREAM=False "
                                    f"for groups of {blocks}")
    return blocks


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


def recompile_limits(limit: int) -> Any:
    """dynamo's recompile_limit raised to limit, and its per-code-object total beside it: every offload hook wraps one
    shared code object, so past accumulated_recompile_limit (256) dynamo would run the rest eagerly, silently."""
    return torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=max(256, 2 * limit))


def compile_trace(pipe: Any, inputs: dict[str, Any], recompile_limit: int) -> dict[str, Any]:
    """Compile the whole denoiser with torch.compile (graph breaks allowed) on dynamo's eager backend, under whatever
    hooks the pipeline carries and with recompile_limit raised, and run one forward twice (no kernels are built,
    nothing is timed); return what happened, for a row.

    Keys: traced (no error), trace_error, graphs_traced and graph_breaks (first forward), recompiles (graphs the
    second forward added), recompile_limit_at_compile (the values dynamo saw when it compiled), matches_eager
    (both outputs equal the uncompiled forward's). The model is uncompiled and dynamo reset afterwards.
    recompile_limit is torch >= 2.7's name for what diffusers' docs still call cache_size_limit (an alias)."""
    net = pipelines.denoiser(pipe)
    call = workloads.denoiser_call(pipe, inputs)
    outs: dict[str, Any] = {}
    error = error_of(lambda: outs.setdefault("eager", workloads.first_output(call())))
    compile_tools.reset()
    net.compile(backend="eager")
    try:
        with (recompile_limits(recompile_limit),
              quantize.dynamo_config_at_compile("recompile_limit") as seen):
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
            "recompile_limit_at_compile": sorted({s["recompile_limit"] for s in seen}),
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
    """Free pipelines or modules for good: drop compiled graphs, empty every tensor they hold (group offload's pinned
    copies too), collect garbage and empty the CUDA caches; return the CUDA bytes still allocated afterwards (0
    without CUDA).

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
            for layer in module.modules():  # bitsandbytes' Linear4bit keeps its weight's scales on itself too
                if getattr(layer, "quant_state", None) is not None:
                    layer.quant_state = None
            for group in _group_offload_groups(module):  # with a stream: the pinned CPU copies it onloads from
                group.cpu_param_dict.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        empty_host = getattr(torch.accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:  # the pinned blocks PyTorch keeps cached for reuse
            empty_host()
        return torch.cuda.memory_allocated()
    return 0


def parity_latents(pipe: Any, run: Run, reference: torch.Tensor | None) -> tuple[str, float | None,
                                                                                  torch.Tensor | None]:
    """Run the pipeline once; return the error ('' if it ran), its latents' relative L2 to reference (None without
    a reference), the latents."""
    out: dict[str, Any] = {}
    error = error_of(lambda: out.setdefault("latents", workloads.pipeline_call(pipe, run, output_type="latent")().images))
    latents = out.get("latents")
    compared = latents is not None and reference is not None
    return error, (quantize.relative_l2(reference, latents) if compared else None), latents


def parity(pipe: Any, run: Run, reference: torch.Tensor) -> tuple[str, float | None]:
    """Run the pipeline once; return the error ('' if it ran) and its latents' relative L2 to reference."""
    error, drift, _ = parity_latents(pipe, run, reference)
    return error, drift


CPU_COPY_BOUND = 1e-5  # relative L2: on a CPU, a copied weight can change the last bits of a float matmul's sum


def copy_weights(pipe: Any) -> None:
    """Copy every weight and buffer of a pipeline's models to fresh memory, as model offload's Module.to('cpu:0')
    does on a CPU (the new memory is 64-byte aligned; weights read from a safetensors file need not be)."""
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.data = tensor.data.clone()


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b when both were measured, else None."""
    return a / b if a and b else None


def component_sizes(pipe: Any) -> dict[str, int]:
    """Bytes of each model component of a pipeline (get_memory_footprint: parameters and buffers)."""
    return {name: m.get_memory_footprint() for name, m in pipe.components.items()
            if hasattr(m, "get_memory_footprint")}


SCENARIO = {"eager": "eager", "regional": "regional compile", "compile": "compile"}  # variant -> row name suffix
STAND_IN = "accelerate.cpu_offload(component, execution_device, offload_buffers=...) per component"


@dataclass
class ModeChecks:
    """Notebook 08's work per offload mode, one call per step, each writing its row: install (the hooks), parity
    with the no-offload latents, latency and peak memory eager and compiled (GPU; `skipped` rows elsewhere), the
    fullgraph trace of the repeated blocks and, for group offload, diffusers' whole-model compile trace; then
    claims() lists what must hold, as (claim, measured, expected, holds).

    Without a reference (the no-offload pipeline does not fit this GPU: no_reference says why), each claim that
    compares against it is a `skipped` row 'not checkable: <claim>' with that reason, and each mode's output is
    checked for what holds without one (it runs, its latents are finite)."""

    run: Run
    rows: ResultWriter
    reference: torch.Tensor | None  # the no-offload pipeline's latents; None where it was skipped
    inputs: dict[str, Any] | None  # the denoiser's inputs, for the traces; None: taken from the first offloaded one
    variants: list[str]
    repeats: int
    recompile_limit: int
    no_reference: str = ""  # why there is no reference ('' when there is one)
    default_call_error: str = ""
    info: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """A missing reference needs its reason, and a reason no missing reference."""
        if (self.reference is None) != bool(self.no_reference):
            raise ValueError("ModeChecks: pass no_reference (why) exactly when reference is None; got "
                             f"reference {'None' if self.reference is None else 'given'}, "
                             f"no_reference={self.no_reference!r}")

    def first_to_run(self, mode: str) -> bool:
        """Without a reference: True when mode is the first offload mode whose pipeline ran here, sequential offload
        aside (the slowest: one more call would cost minutes), so it draws the notebook's first image; always False
        with a reference (its image comes first)."""
        ran = [m for m in self.info if m != "sequential" and self.get(f"{m} offload: parity") == "skipped"]
        return self.reference is None and ran[:1] == [mode]

    def not_checkable(self, claim: str) -> None:
        """A claim that compares against the missing reference: a skipped row saying why, never a passing claim."""
        self.rows.record(f"not checkable: {claim}", status="skipped", reason=f"no reference: {self.no_reference}")

    def last(self, scenario: str) -> Any:
        """This run's last row named scenario, or None."""
        hit = [r for r in self.rows.rows if r.scenario == scenario]
        return hit[-1] if hit else None

    def get(self, scenario: str, name: str = "status") -> Any:
        """A field (or extra field) of the last row named scenario; None without one."""
        row = self.last(scenario)
        if row is None:
            return None
        return getattr(row, name) if hasattr(row, name) else row.extra.get(name)

    def ok(self, scenario: str, name: str) -> Any:
        """The field of the last row named scenario when that row is ok, else None."""
        return self.get(scenario, name) if self.get(scenario) == "ok" else None

    def mode_variants(self, mode: str) -> list[str]:
        """The variants measured for a mode: 'compile' (diffusers' recipe) only for group offload."""
        return [v for v in self.variants if v != "compile" or mode.startswith("group")]

    def check_fresh(self, pipe: Any) -> list[tuple[str, Any, Any, bool]]:
        """On a freshly loaded pipeline: that it carries no offload hooks and, without a CUDA GPU, that diffusers
        refuses the plain enable_model_cpu_offload() (kept as default_call_error for the hooks rows); the claims."""
        hooks = hook_summary(pipe)
        count = sum(h["accelerate_hooks"] + h["group_offload_hooks"] for h in hooks.values())
        out = [("a freshly loaded pipeline carries no offload hooks", count, 0, count == 0)]
        if not self.run.is_cuda:
            self.default_call_error = error_of(pipe.enable_model_cpu_offload)
            out.append(("without an accelerator diffusers refuses the plain call", self.default_call_error,
                        "an error naming the accelerator", "accelerator" in self.default_call_error))
        return out

    def no_offload_compiled(self, pipe: Any) -> list[tuple[str, Any, Any, bool]]:
        """Regional compile without offload, the speedup to compare against: measured on a CUDA GPU (the claim
        that it ran without a recompile is returned), else a skipped row (on a CPU it is notebook 04's subject)."""
        scenario = "no offload regional compile"
        if "regional" not in self.variants:
            return []
        if not self.run.is_cuda:
            self.rows.record(scenario, status="skipped", offload_mode="none", variant="regional",
                             reason="compile is measured here only beside offloading, which needs a CUDA GPU; "
                                    "regional compile without offload on this CPU is notebook 04's subject")
            return []
        if self.reference is None:
            self.rows.record(scenario, status="skipped", offload_mode="none", variant="regional",
                             reason=self.no_reference)
            return []
        self.measure_compiled(pipe, scenario, "regional",
                              lambda p, _: pipelines.denoiser(p).compile_repeated_blocks(fullgraph=True),
                              offload_mode="none")
        got = self.get(scenario), self.get(scenario, "recompiles")
        return [(f"{scenario}: measured, no recompile after warm-up", got, ("ok", 0), got == ("ok", 0))]

    def against_no_offload(self, mode: str) -> dict[str, float | None]:
        """A mode's eager peak and latency over no offload's, and its compile speedups (None where not measured)."""
        eager_s = self.ok(f"{mode} offload eager", "latency_median_s")
        return {"peak memory / no offload (x)": ratio(self.ok(f"{mode} offload eager", "peak_memory_bytes"),
                                                      self.ok("no offload eager", "peak_memory_bytes")),
                "latency / no offload (x)": ratio(eager_s, self.ok("no offload eager", "latency_median_s")),
                "compile speedup under offload (x)": ratio(eager_s, self.ok(f"{mode} offload regional compile",
                                                                            "latency_median_s")),
                "whole-model compile speedup under offload (x)": ratio(eager_s, self.ok(f"{mode} offload compile",
                                                                                        "latency_median_s"))}

    def full_profile_claims(self, ratios: Any, left_after_free: dict[str, int],
                            weights_bytes: int) -> list[tuple[str, Any, Any, bool]]:
        """Full profile on a GPU (tiny models are too small: activations outweigh their weights): a freed pipeline
        leaves < 1% of its weights allocated; sequential peaks below model offload; the compile speedup under model
        offload is smaller than without offload."""
        out = [("freeing a pipeline leaves less than 1% of its weights allocated", max(left_after_free.values()),
                f"< {0.01 * weights_bytes:.3g}", all(b < 0.01 * weights_bytes for b in left_after_free.values()))]
        if {"model", "sequential"} <= set(ratios.index):  # the peaks themselves: no reference needed
            peaks = {m: self.ok(f"{m} offload eager", "peak_memory_bytes") for m in ("model", "sequential")}
            out.append(("sequential offload peaks below model offload", peaks["sequential"], f"< {peaks['model']}",
                        peaks["sequential"] < peaks["model"]))
        base = ratio(self.ok("no offload eager", "latency_median_s"),
                     self.ok("no offload regional compile", "latency_median_s"))
        speedup = ratios["compile speedup under offload (x)"].get("model") if len(ratios) else None
        if self.reference is None and speedup is not None and not math.isnan(speedup):
            self.not_checkable("the compile speedup under model offload is smaller than without offload")
        if base and speedup is not None and not math.isnan(speedup):
            out.append(("the compile speedup under model offload is smaller than without offload", speedup,
                        f"< {base:.3g}", speedup < base))
        return out

    def install(self, pipe: Any, mode: str, enable: Callable[[bool], None] | None = None,
                use_stream: bool = False) -> dict[str, Any]:
        """Call enable(stream) (the notebook's recipe); a stream refused (no accelerator backend) is retried without;
        enable None: the notebook made the call itself. Records '<mode> offload: hooks' and returns what was
        installed."""
        stream_error = install_error = ""
        if enable is None:
            pass
        elif mode.startswith("group") and use_stream:
            stream_error = error_of(lambda: enable(True))
            install_error = error_of(lambda: enable(False)) if stream_error else ""
        else:
            install_error = error_of(lambda: enable(False))
        info = {"hooks": hook_summary(pipe), "install_error": install_error, "stream_error": stream_error,
                "stream_requested": mode.startswith("group") and use_stream,
                "stream": mode.startswith("group") and use_stream and not stream_error,
                "execution_device": "" if install_error else str(pipe._execution_device),
                "weights_at_once": None if install_error else installed_weights_at_once(pipe, mode)}
        self.rows.record(f"{mode} offload: hooks", status="failed" if install_error else "ok",
                         reason=f"enabling {mode} offload raised {install_error}" if install_error else "",
                         offload_mode=mode, onload_device=str(self.run.device),
                         execution_device=info["execution_device"], hooks=info["hooks"], use_stream=info["stream"],
                         stream_error=stream_error, default_call_error=self.default_call_error,
                         weights_at_once_bytes=info["weights_at_once"])
        self.info[mode] = info
        return info

    def parity(self, pipe: Any, mode: str, scenario: str = "", **extra: Any) -> tuple[str, float | None]:
        """Run the offloaded pipeline once against the no-offload latents; record '<mode> offload: parity'."""
        install_error = self.info.get(mode, {}).get("install_error", "")
        run_error, drift, latents = ((install_error, None, None) if install_error
                                     else parity_latents(pipe, self.run, self.reference))
        self.info.setdefault(mode, {})["latents"] = latents
        finite = latents is not None and bool(latents.isfinite().all())
        known = mode == "sequential" and not scenario and not self.run.is_cuda  # diffusers' cpu:0 (Going deeper)
        status = ("skipped" if known else "failed") if run_error else "skipped" if self.reference is None else "ok"
        cause = "as expected on a CPU, where diffusers turns the device into cpu:0 (Going deeper: why, and a stand-in)"
        self.rows.record(scenario or f"{mode} offload: parity", status=status,
                         reason=f"the offloaded pipeline did not run{', ' + cause if known else ''}: {run_error}"
                         if run_error else
                         f"ran; not compared: no reference: {self.no_reference}" if self.reference is None else "",
                         offload_mode=mode, execution_device=str(pipe._execution_device), run_error=run_error,
                         drift_vs_no_offload=drift, latents_finite=finite, **extra)
        hooks = hook_summary(pipe)
        count = sum(h["accelerate_hooks"] + h["group_offload_hooks"] for h in hooks.values())
        print(f"{scenario or mode + ' offload'}: {count} hooks; " + (
            f"did not run here{', ' + cause if known else ''}: {text.cut(run_error.split(' - ')[0], 90)}" if run_error else "ran; no reference to compare its latents with"
            if self.reference is None else f"latents against no offload's: relative L2 {drift:.3g}"))
        return run_error, drift

    def _failure(self, scenario: str, err: BaseException, **extra: Any) -> None:
        """A setting that raised: a failed (or oom) row with the error, so the remaining settings still run."""
        why = describe_error(err)
        self.rows.record(scenario, status="oom" if "out of memory" in why.lower() else "failed", reason=why, **extra)
        print(f"{scenario}: {why}")

    def measure_compiled(self, pipe: Any, scenario: str, variant: str, compile_denoiser: Callable[[Any, str], None],
                         **extra: Any) -> None:
        """Compile the denoiser with the notebook's compile_denoiser(pipe, variant) from the eager model, time the
        first call, then the warm calls and peak memory; record the row (a failure becomes a row too). The raised
        recompile_limit is in force around the calls ('compile'), where dynamo compiles lazily."""
        try:
            compile_tools.reset()
            for module in pipelines.denoiser(pipe).modules():  # start from the eager model
                compile_tools.uncompile(module)
            compile_denoiser(pipe, variant)
            fn = workloads.pipeline_call(pipe, self.run)
            limit = recompile_limits(self.recompile_limit) if variant == "compile" else contextlib.nullcontext()
            with limit, quantize.dynamo_config_at_compile("recompile_limit") as seen:
                with compile_tools.counting() as first:
                    compile_s, _ = measure.first_call_seconds(fn, self.run.device)
                with compile_tools.counting() as steady:
                    t = measure.time_callable(fn, self.run.device, repeats=self.repeats, warmup=0)
                    m, _ = measure.peak_memory(fn, self.run.device)
        except Exception as err:  # noqa: BLE001 - one failing combination must not hide the rest
            self._failure(scenario, err, variant=variant, **extra)
            return
        self.rows.record(scenario, timing=t, memory=m, compile_s=compile_s, recompiles=steady.recompiles,
                         graph_breaks=first.graph_breaks + steady.graph_breaks, variant=variant,
                         graphs_compiled=first.graphs,
                         recompile_limit_at_compile=sorted({c["recompile_limit"] for c in seen}),
                         resident_before_call_bytes=m.baseline_bytes, **extra)
        print(f"{scenario}: first call {compile_s:.1f} s; median {t.median_s:.3f} s; peak {m.peak_gib:.3f} GiB; "
              f"recompiles after warm-up {steady.recompiles}; graph breaks {first.graph_breaks + steady.graph_breaks}")

    def measure(self, pipe: Any, mode: str, compile_denoiser: Callable[[Any, str], None], not_ready: str = "") -> None:
        """Latency and peak memory of one offloaded pipeline, eager then compiled: GPU only, else skipped rows."""
        hooks = self.info.get(mode, {}).get("hooks")
        for variant in self.mode_variants(mode):
            scenario = f"{mode} offload {SCENARIO[variant]}"
            if not self.run.is_cuda:
                self.rows.record(scenario, status="skipped", reason=no_accelerator_reason(mode), offload_mode=mode,
                                 variant=variant)
            elif not_ready:
                self.rows.record(scenario, status="failed", reason=f"not measured: {not_ready}", offload_mode=mode,
                                 variant=variant)
            elif variant != "eager":
                self.measure_compiled(pipe, scenario, variant, compile_denoiser, offload_mode=mode, hooks=hooks)
            else:
                try:
                    fn = workloads.pipeline_call(pipe, self.run)
                    t = measure.time_callable(fn, self.run.device, repeats=self.repeats, warmup=1)
                    m, _ = measure.peak_memory(fn, self.run.device)
                except Exception as err:  # noqa: BLE001 - recorded; the claims say what must hold
                    self._failure(scenario, err, offload_mode=mode, variant=variant)
                    continue
                self.rows.record(scenario, timing=t, memory=m, offload_mode=mode, variant=variant, hooks=hooks,
                                 resident_before_call_bytes=m.baseline_bytes)
                print(f"{scenario}: median {t.median_s:.3f} s; peak {m.peak_gib:.3f} GiB")

    def traces(self, pipe: Any, mode: str, label: str) -> None:
        """Can compile_repeated_blocks(fullgraph=True) trace the blocks under this mode's hooks (one row, any
        device), and, for group offload, diffusers' whole-model compile (one more row)? Both on dynamo's eager
        backend: no kernels are built and nothing is timed, so they say nothing about speed."""
        if self.inputs is None:  # no reference pipeline: the same inputs, built by this offloaded one
            self.inputs = workloads.run_inputs(pipe, self.run)
        if "compile" in self.mode_variants(mode):
            self.rows.record(f"{mode} offload: compile trace", offload_mode=mode, backend="eager",
                             **compile_trace(pipe, self.inputs, self.recompile_limit))
        if "regional" in self.variants:
            inside = hooks_in_repeated_blocks(pipelines.denoiser(pipe))  # hooks on or inside the compiled blocks
            error, counts = regional_trace(pipe, self.inputs)
            self.rows.record(f"{mode} offload: fullgraph trace", offload_mode=mode, traced_pipeline=label,
                             traced=not error, trace_error=error, graphs_traced=counts.graphs,
                             graph_breaks=counts.graph_breaks, backend="eager", hooks_in_repeated_blocks=inside)

    def sequential_stand_in(self, load: Callable[[], Any]) -> Any:
        """CPU only, where diffusers' sequential offload does not run: check the cause (the device 'cpu:0'), then
        install accelerate's hooks with the device 'cpu' on a fresh pipeline and check its parity; return it."""
        check = {str(d): execution_device_check(d) for d in ("cpu", "cpu:0")}
        self.rows.record("sequential offload: cpu:0 check", checks=check,
                         diffusers_error=self.get("sequential offload: parity", "run_error"))
        pipe = load()
        accelerate_sequential_offload(pipe, self.run.device)
        self.parity(pipe, "sequential", "sequential offload: stand-in parity", stand_in=STAND_IN,
                    hooks=hook_summary(pipe))
        return pipe

    def summary(self, mode: str) -> dict[str, Any]:
        """One line of the per-mode table: hooks, parity, the fullgraph trace, then the GPU latencies (none off a
        GPU, where nothing is timed; one column saying so where a GPU timed nothing). A check not made yet reads as
        where it is made."""
        hooks = self.get(f"{mode} offload: hooks", "hooks") or {}
        parity_row = f"{mode} offload: parity"
        if self.get("sequential offload: stand-in parity") and mode == "sequential":
            parity_row = "sequential offload: stand-in parity"
        later = "not traced: VARIANTS has no 'regional'" if self.run.is_cuda else "on a CPU: its stand-in, Going deeper"
        trace = f"{mode} offload: fullgraph trace"
        out = {"offload hooks (count)": sum(h["accelerate_hooks"] + h["group_offload_hooks"] for h in hooks.values()),
               "latents vs no offload (relative L2)": self.ok(parity_row, "drift_vs_no_offload")
               if self.get(parity_row) == "ok" else later if mode == "sequential" and not self.run.is_cuda
               else "not checkable: no reference" if self.get(parity_row) == "skipped" else self.get(parity_row),
               "hooks in repeated blocks (count)": self.get(trace, "hooks_in_repeated_blocks")
               if self.get(trace) else later,
               "blocks trace as one graph": text.words(self.get(trace, "traced")) if self.get(trace) else later}
        if not self.run.is_cuda:
            return out
        timed = {f"{SCENARIO[v]} latency (s)": self.ok(f"{mode} offload {SCENARIO[v]}", "latency_median_s")
                 for v in SCENARIO}
        if not any(timed.values()):
            return out | {"latency (s)": "not timed: see its rows"}
        return out | {k: "—" if v is None else v for k, v in timed.items()}

    def claims(self, mode: str) -> list[tuple[str, Any, Any, bool]]:
        """What must hold for one mode, from its rows: (claim, measured, expected, holds), for checks.Checks.add."""
        out: list[tuple[str, Any, Any, bool]] = []
        hooks_row, parity_row = f"{mode} offload: hooks", f"{mode} offload: parity"
        hooks = self.get(hooks_row, "hooks") or {}
        out.append((f"{mode} offload: enabling it works", self.get(hooks_row, "reason") or "ok", "ok",
                    self.get(hooks_row) == "ok"))
        if mode == "model":
            out.append(("model offload: one CpuOffload hook on each whole component",
                        {c: h["accelerate_hooks"] for c, h in hooks.items()}, "1 each",
                        bool(hooks) and all(h["accelerate_hook_types"] == ["CpuOffload"] and h["accelerate_hooks"] == 1
                                            for h in hooks.values())))
        if mode == "sequential":
            out.append(("sequential offload: an AlignDevicesHook on every leaf, weights on meta between calls",
                        sorted({d for h in hooks.values() for d in h["parameter_devices"]}), ["meta"],
                        bool(hooks) and all(h["accelerate_hooks"] > 1 and "AlignDevicesHook" in h["accelerate_hook_types"]
                                            and h["parameter_devices"] == ["meta"] for h in hooks.values())))
        if mode.startswith("group"):
            out.append((f"{mode} offload: group hooks on every component",
                        {c: h["group_offload_hooks"] for c, h in hooks.items()}, "> 0 each",
                        bool(hooks) and all(h["group_offload_hooks"] > 0 for h in hooks.values())))
            if self.run.is_cuda and self.info.get(mode, {}).get("stream_requested"):
                refused = self.get(hooks_row, "stream_error")
                out.append((f"{mode} offload: the CUDA stream is accepted", refused or "accepted", "accepted",
                            not refused))
        if not self.run.is_cuda and mode in ("model", "sequential"):  # diffusers rewrites the device as cpu:0
            out.append((f"{mode} offload on a CPU: diffusers' execution device is cpu:0",
                        self.get(hooks_row, "execution_device"), "cpu:0",
                        self.get(hooks_row, "execution_device") == "cpu:0"))
        if mode == "sequential" and not self.run.is_cuda:  # the cpu:0 cause (Going deeper), and the stand-in
            error = self.get(parity_row, "run_error") or ""
            cause = self.get("sequential offload: cpu:0 check", "checks") or {}
            out.append(("on a CPU, diffusers' sequential offload fails with the TypeError of the device cpu:0", error,
                        "a TypeError", self.get(parity_row) == "skipped" and error.startswith("TypeError")))
            linear = {d: cause.get(d, {}).get("nn.Linear under accelerate.cpu_offload", "") for d in ("cpu", "cpu:0")}
            out.append(("accelerate's cpu_offload fails with the device 'cpu:0' and runs with 'cpu'", linear,
                        {"cpu": "runs", "cpu:0": "a TypeError"},
                        linear["cpu:0"].startswith("TypeError") and linear["cpu"] == "runs"))
            parity_row = "sequential offload: stand-in parity"
        drift = self.get(parity_row, "drift_vs_no_offload")
        suffix = " (accelerate stand-in)" if "stand-in" in parity_row else ""
        claim = f"{mode} offload leaves the latents unchanged{suffix}"
        if self.reference is None:  # what holds without a reference; the comparison is a skipped row
            self.not_checkable(claim)
            out.append((f"{mode} offload runs and draws finite latents{suffix}",
                        self.get(parity_row, "run_error") or ("finite" if self.get(parity_row, "latents_finite")
                                                              else "not finite"),
                        "finite", self.get(parity_row) == "skipped"
                        and self.get(parity_row, "latents_finite") is True))
        # a GPU: transfers and kernels may differ in rounding; a CPU: bit for bit, except that model offload's
        # Module.to('cpu:0') copies the weights, which can move a float sum's last bits (Going deeper of notebook 08)
        bound = 1e-2 if self.run.is_cuda else CPU_COPY_BOUND if mode == "model" else 0.0
        if self.reference is not None:
            out.append((claim, drift if drift is not None else self.get(parity_row, "reason"),
                        checks.at_most(bound, "relative L2"), self.get(parity_row) == "ok" and drift is not None
                        and drift <= bound))
        if "regional" in self.variants:
            trace = f"{mode} offload: fullgraph trace"
            inside = self.get(trace, "hooks_in_repeated_blocks")
            if inside == 0:
                out.append((f"{mode} offload: no hook in the blocks, so they trace as one graph",
                            self.get(trace, "trace_error") or f"{self.get(trace, 'graph_breaks')} breaks", "0 breaks",
                            self.get(trace, "traced") is True and self.get(trace, "graph_breaks") == 0))
            else:
                out.append((f"{mode} offload: hooks in the blocks stop a fullgraph trace at torch.compiler.disable",
                            (self.get(trace, "trace_error") or "traced")[:80], "an error naming torch.compiler.disable",
                            self.get(trace, "traced") is False
                            and "torch.compiler.disable" in (self.get(trace, "trace_error") or "")))
        if "compile" in self.mode_variants(mode):
            trace = f"{mode} offload: compile trace"
            out.append((f"{mode} offload: diffusers' whole-model compile runs, breaks at the hooks, matches eager",
                        f"{self.get(trace, 'graph_breaks')} breaks, {self.get(trace, 'recompiles')} recompiles, "
                        + ("matches eager" if self.get(trace, "matches_eager") is True else "differs from eager"),
                        "at least 1 break, 0 recompiles, matches eager",
                        self.get(trace, "traced") is True and (self.get(trace, "graph_breaks") or 0) > 0
                        and self.get(trace, "recompiles") == 0 and self.get(trace, "matches_eager") is True))
            out.append((f"{mode} offload: dynamo compiled with the raised recompile_limit",
                        self.get(trace, "recompile_limit_at_compile"), [self.recompile_limit],
                        self.get(trace, "recompile_limit_at_compile") == [self.recompile_limit]))
        if self.run.is_cuda:
            out += self._gpu_claims(mode)
        return out

    def _gpu_claims(self, mode: str) -> list[tuple[str, Any, Any, bool]]:
        """On a GPU: each setting measured; a regional compile succeeds exactly when its trace did, without
        recompiles or graph breaks; the whole-model compile runs with the raised limit; on the full profile the
        offloaded peak is below no offload's."""
        out: list[tuple[str, Any, Any, bool]] = []
        eager, base = f"{mode} offload eager", self.ok("no offload eager", "peak_memory_bytes")
        if "eager" in self.variants:
            out.append((f"{eager}: measured", self.get(eager, "reason") or "ok", "ok", self.get(eager) == "ok"))
            if self.get(eager) == "ok" and base and self.run.profile == "full":
                out.append((f"{eager}: peaks below no offload", self.get(eager, "peak_memory_bytes"), f"< {base}",
                            self.get(eager, "peak_memory_bytes") < base))
            elif self.get(eager) == "ok" and self.reference is None and self.run.profile == "full":
                self.not_checkable(f"{eager}: peaks below no offload")
        if "regional" in self.variants:
            compiled, traced = f"{mode} offload regional compile", self.get(f"{mode} offload: fullgraph trace", "traced")
            out.append((f"{compiled}: runs exactly when its fullgraph trace did", self.get(compiled),
                        "ok" if traced else "failed", (self.get(compiled) == "ok") == (traced is True)))
            if self.get(compiled) == "ok":
                out.append((f"{compiled}: no recompile after warm-up, no graph break",
                            f"{self.get(compiled, 'recompiles')}, {self.get(compiled, 'graph_breaks')}", "0, 0",
                            self.get(compiled, "recompiles") == 0 and self.get(compiled, "graph_breaks") == 0))
        if "compile" in self.mode_variants(mode):
            whole = f"{mode} offload compile"
            out.append((f"{whole}: runs with the raised recompile_limit",
                        self.get(whole, "recompile_limit_at_compile") or self.get(whole, "reason"),
                        [self.recompile_limit], self.get(whole) == "ok"
                        and self.get(whole, "recompile_limit_at_compile") == [self.recompile_limit]))
        return out


def _bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of tensors as stored (numel x element size), each tensor counted once; meta tensors count too."""
    unique = {id(t): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values())


def _group_offload_groups(module: torch.nn.Module) -> list[Any]:
    """The distinct groups (diffusers' ModuleGroup) whose group-offloading hooks sit on module or its submodules."""
    groups: dict[int, Any] = {}
    for m in module.modules():
        registry = getattr(m, "_diffusers_hook", None)
        hook = registry.get_hook("group_offloading") if registry is not None else None
        if hook is not None:
            groups[id(hook.group)] = hook.group
    return list(groups.values())


def _group_bytes(group: Any) -> int:
    """Bytes of the weights one group-offloading group moves to the accelerator together."""
    return _bytes([t for m in group.modules for t in (*m.parameters(), *m.buffers())]
                  + list(group.parameters) + list(group.buffers))


def _own_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's own parameters and buffers (not its children's)."""
    return _bytes([*module.parameters(recurse=False), *module.buffers(recurse=False)])


WEIGHTS_AT_ONCE_MODES: tuple[str, ...] = ("none", *MODES)  # "none": no offload


def weights_at_once(components: dict[str, torch.nn.Module], mode: str, blocks_per_group: int = 1) -> int:
    """The most weight bytes an offload mode holds on the accelerator at once (a floor: activations, and with a
    stream the prefetched next group, come on top). components are modified (hooks): pass meta-device copies.

    none: every component; model: the largest component (it moves whole); sequential: the largest module's own
    parameters and buffers (accelerate hooks every module that holds some); group_block / group_leaf: the largest
    group diffusers' own group-offloading hooks form, installed here with the meta device as the offload device,
    so nothing is copied."""
    if mode not in WEIGHTS_AT_ONCE_MODES:
        raise ValueError(f"mode={mode!r}: one of {WEIGHTS_AT_ONCE_MODES}")
    sizes = {name: _bytes([*m.parameters(), *m.buffers()]) for name, m in components.items()}
    if mode == "none":
        return sum(sizes.values())
    if mode == "model":
        return max(sizes.values())
    if mode == "sequential":
        return max(_own_bytes(m) for c in components.values() for m in c.modules())
    from diffusers.hooks import apply_group_offloading

    largest = 0
    for module in components.values():
        apply_group_offloading(module, onload_device=torch.device("cpu"), offload_device=torch.device("meta"),
                               offload_type="block_level" if mode == "group_block" else "leaf_level",
                               num_blocks_per_group=blocks_per_group if mode == "group_block" else None)
        largest = max([largest, *(_group_bytes(g) for g in _group_offload_groups(module))])
    return largest


def installed_weights_at_once(pipe: Any, mode: str) -> int:
    """The same floor read off the hooks an offload mode installed on a pipeline: the largest component under model
    offload's CpuOffload hooks, the largest group-offloading group, or the largest module accelerate's sequential
    hooks move (its own parameters and buffers, wherever they sit now, meta included)."""
    modules = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    if mode == "model":
        return max(_bytes([*m.parameters(), *m.buffers()]) for m in modules.values() if hasattr(m, "_hf_hook"))
    if mode == "sequential":
        return max(_own_bytes(m) for c in modules.values() for m in c.modules() if hasattr(m, "_hf_hook"))
    if mode in ("group_block", "group_leaf"):
        return max(_group_bytes(g) for c in modules.values() for g in _group_offload_groups(c))
    raise ValueError(f"mode={mode!r}: one of {MODES}")
