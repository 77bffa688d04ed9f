"""Does a lever transfer? Apply each lever of the collection to a pipeline's denoiser, measure what happens, and say it
in one table cell: works (with its figure), works with graph breaks or recompiles, works with a change to the user's
code (the change named), refused here, not run here, or fails with the library's message (notebook 16).

Each probe runs the lever the way a user does (diffusers' and torchao's own calls) on a `Subject` (a pipeline, one
step's denoiser inputs and its eager output), gathers what it measured, and hands that to a `verdict_*` function,
which is pure: the unit tests plant a graph break, a recompile, a cache that skips nothing, a silent attention
fallback or a drifting output and check that no cell then says "works". A probe that changes the denoiser (quantizes
it, loads adapters, installs hooks) rebuilds it from the same seed afterwards, so the next probe starts clean.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from helpers import attention_backends, caching, compile_tools, measure, pipelines, results, stack, text

MODELS: tuple[str, ...] = ("flux-dev", "qwen-image", "flux2-dev")
MODEL_NAMES: dict[str, str] = {"flux-dev": "Flux-1-Dev", "qwen-image": "Qwen-Image", "flux2-dev": "FLUX.2 [dev]"}
CACHES: tuple[str, ...] = ("first-block cache", "mag cache", "taylorseer cache", "pab cache", "faster cache")
LEVERS: tuple[str, ...] = ("compile", "regional compile", "new resolution", *CACHES, "int8", "fp8", "nf4",
                           "lora hot-swap", "model offload", "group offload", "context parallel", "attention backends")
# The levers notebook 16 runs in `make test` (tests/test_nb16_does_it_transfer.py); make test-matrix runs them all.
QUICK_LEVERS: tuple[str, ...] = ("compile", "first-block cache", "int8", "fp8", "nf4", "model offload",
                                 "attention backends")
# What a cell can say, best first; the row keeps it as `outcome`. "needs a change": the plain call fails with an error
# that names its fix, and the lever works once the user's code makes that change (the cell shows it).
OUTCOMES: tuple[str, ...] = ("works", "breaks", "recompiles", "needs a change", "refused here", "not run here", "fails")
# The outcomes whose measurements must pass works_problems: the lever did its job, as is or with the change shown.
WORKING: tuple[str, ...] = ("works", "needs a change")
LORA_RANKS: tuple[int, int] = (4, 8)  # the adapter loaded first, and the larger one swapped in
# The error diffusers raises when a cache hook runs outside `cache_context`, and the change that error names, made
# around the whole pipeline call: cache_context sets the hooks' context for every denoiser call inside it, and the
# pipeline's maybe_free_model_hooks clears it as the call ends, so it is one `with` per call.
NO_CACHE_CONTEXT = "No cache context is set"
CACHE_CONTEXT_LINE = 'with pipe.transformer.cache_context("cond"): image = pipe(...)'
# The error a context-parallel split raises when a sequence length does not divide by the degree, and the setting
# that lifts it (ContextParallelConfig, diffusers 0.42: uneven shards gathered by size).
NOT_DIVISIBLE = "divisible by mesh size"
ULYSSES_ANYTHING = "ulysses_anything=True"
# The setting each cache is tried at: aggressive enough that a cache that works skips something in a few steps.
CACHE_SETTINGS: dict[str, float] = {"first-block cache": 0.5, "mag cache": 0.5, "taylorseer cache": 2,
                                    "pab cache": 2, "faster cache": 2}
CACHE_UNITS: dict[str, str] = {"first-block cache": "block", "mag cache": "block"}  # the rest skip attention


@dataclass
class Cell:
    """One model x lever cell: the outcome, the measured figure, the library's message (or why not run here), and
    everything the probe measured (kept in the row)."""

    model: str
    lever: str
    outcome: str
    figure: str = ""
    message: str = ""
    measured: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse an outcome that is not one of OUTCOMES."""
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome={self.outcome!r}; allowed: {OUTCOMES}")

    @property
    def works(self) -> bool:
        """True only for a clean 'works' (no graph break, no recompile, no refusal)."""
        return self.outcome == "works"

    @property
    def verdict(self) -> str:
        """The outcome in the table's words ('needs a change' -> 'works with a change')."""
        return {"breaks": "works with graph breaks", "recompiles": "works with recompiles",
                "needs a change": "works with a change"}.get(self.outcome, self.outcome)

    def text(self, limit: int = 160) -> str:
        """The cell as the table prints it, e.g. 'works: 1 graph, drift 3.1e-03' or 'fails: <message>'."""
        detail = "; ".join(x for x in (self.figure, shorten(self.message, limit)) if x)
        return f"{self.verdict}: {detail}" if detail else self.verdict


def shorten(message: str, limit: int = 160) -> str:
    """One line of a library message, at most limit characters, '|' escaped for markdown."""
    line = " ".join(str(message).split())
    return text.cut(line, limit).replace("|", "/")


# --- the pipeline under test ---

@dataclass
class Subject:
    """A pipeline under test: its model, one step's denoiser inputs and eager output, how to rebuild its denoiser
    (same seed, same weights), and the settings the probes run at."""

    model: str
    pipe: Any
    inputs: dict[str, Any]
    reference: torch.Tensor
    rebuild: Callable[[], torch.nn.Module]
    device: torch.device
    dtype_name: str
    compiler: str
    height: int
    width: int
    steps: int
    text_tokens: int
    guidance: float
    seed: int = 0
    timing: tuple[int, int] | None = None  # (repeats, warmup): time eager and compiled steps (full profile)

    @property
    def net(self) -> torch.nn.Module:
        """The denoiser (pipe.transformer)."""
        return pipelines.denoiser(self.pipe)

    @property
    def tolerance(self) -> float:
        """The parity tolerance of the dtype (compile_tools.PARITY_TOLERANCE)."""
        return compile_tools.PARITY_TOLERANCE[self.dtype_name]

    def step(self, module: torch.nn.Module | None = None, inputs: dict[str, Any] | None = None) -> torch.Tensor:
        """One denoiser forward on the subject's inputs (or others), as the pipeline calls it; its output tensor."""
        net = module if module is not None else self.net
        with torch.inference_mode():
            out = net(**(inputs if inputs is not None else self.inputs))
        return out[0] if isinstance(out, (tuple, list)) else out

    def inputs_at(self, height: int, width: int) -> dict[str, Any]:
        """The first step's denoiser inputs at another resolution."""
        return pipelines.denoiser_inputs(self.pipe, height=height, width=width, guidance=self.guidance,
                                         max_sequence_length=self.text_tokens, seed=self.seed)

    def call_kwargs(self, prompt: str, steps: int | None = None, output_type: str = "latent") -> dict[str, Any]:
        """Keyword arguments of one pipeline call (call_kwargs)."""
        return call_kwargs(self.pipe, self.model, prompt, height=self.height, width=self.width,
                           steps=steps or self.steps, text_tokens=self.text_tokens, guidance=self.guidance,
                           seed=self.seed, output_type=output_type)

    def restore(self) -> None:
        """Put a freshly built denoiser (same seed, same weights) in the pipeline, the old one freed first."""
        self.pipe.transformer = None
        free()
        # register_modules, not setattr: after None, diffusers' __setattr__ would keep (None, None) in the config,
        # and save_pretrained would then leave the denoiser out
        self.pipe.register_modules(transformer=self.rebuild())


def free() -> None:
    """Collect garbage and, on CUDA, return cached blocks, so a freed denoiser's memory is really free."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def call_kwargs(pipe: Any, model: str, prompt: str, *, height: int, width: int, steps: int, text_tokens: int,
                guidance: float, seed: int = 0, output_type: str = "pil") -> dict[str, Any]:
    """Keyword arguments of one pipeline call as each model's pipeline takes them: Flux-1-Dev and FLUX.2 with their
    text length and guidance; Qwen-Image without true CFG (one transformer call per step, no negative prompt); a
    pipeline built without its text encoder (FLUX.2 on the full profile) with random prompt embeddings instead."""
    kwargs: dict[str, Any] = {"height": height, "width": width, "num_inference_steps": steps,
                              "generator": torch.Generator("cpu").manual_seed(seed), "output_type": output_type}
    if getattr(pipe, "text_encoder", None) is None:
        kwargs["prompt_embeds"] = pipelines.random_prompt_embeds(pipe, 1, text_tokens, seed)
    else:
        kwargs["prompt"] = prompt
    if model in ("flux-dev", "flux2-dev"):
        kwargs |= {"max_sequence_length": text_tokens, "guidance_scale": guidance}
    else:
        kwargs["true_cfg_scale"] = 1.0
    return kwargs


def text_tokens(model: str, profile: str, settings_tokens: int) -> int:
    """Text tokens a model reads on a profile: FLUX.2 on smoke its own (system message included), else the profile's."""
    return pipelines.SMOKE_TEXT_TOKENS.get(model, settings_tokens) if profile == "smoke" else settings_tokens


def make_subject(pipe: Any, model: str, profile: str, *, device: torch.device, dtype: torch.dtype, dtype_name: str,
                 compiler: str, height: int, width: int, steps: int, tokens: int, guidance: float, seed: int = 0,
                 weights: str = "random", timing: tuple[int, int] | None = None,
                 denoiser_config: dict[str, Any] | None = None) -> Subject:
    """A Subject for a pipeline whose denoiser can be rebuilt: seeded random weights from data/configs (with the
    denoiser_config the pipeline was built with), or loaded again from the folder or hub id it came from."""
    name = pipelines.DENOISER[model]

    def rebuild() -> torch.nn.Module:
        if weights != "random":
            cls = pipelines._MODEL_CLASSES[model][name]
            return cls.from_pretrained(weights, subfolder=name, dtype=dtype).to(device).eval()
        built = pipelines._build_models(model, profile, device, dtype, denoiser_config,
                                        leave_out=("text_encoder", "vae"))
        net = built[name]
        pipelines._randomise(net, pipelines._component_seed(seed, name))
        return net.eval()

    inputs = pipelines.denoiser_inputs(pipe, height=height, width=width, max_sequence_length=tokens,
                                       guidance=guidance, seed=seed)
    sub = Subject(model, pipe, inputs, torch.empty(0), rebuild, device, dtype_name, compiler, height, width, steps,
                  tokens, guidance, seed, timing)
    sub.reference = sub.step().clone()
    return sub


# --- verdicts: what was measured -> outcome and figure (pure; the unit tests plant failures here) ---

def cold_label(measured: dict[str, Any]) -> str:
    """What a first compiled call's seconds are: a cold compile with inductor (a GPU's full profile), else dynamo's
    tracing alone on the backend named (the smoke profile's `eager`: no inductor lowering, no kernels generated)."""
    backend = measured.get("backend", "inductor")
    return "cold compile" if backend == "inductor" else f"cold trace (dynamo, {backend} backend)"


def verdict_compile(measured: dict[str, Any], tolerance: float) -> tuple[str, str, str]:
    """Compile with fullgraph=True: fails on an error (breaks counted without fullgraph); breaks; recompiles on a
    second call; fails when its output leaves eager's by more than tolerance; else works."""
    graphs = text.count(measured.get("graphs", 0), "graph")
    if measured.get("error"):
        n = measured.get("graph_breaks", 0)
        first = measured.get("first_break", "?")
        why = f"fullgraph=True refused; without it {text.count(n, 'graph break')}, first: {first}"
        return "fails", why, measured["error"]
    if measured.get("graph_breaks", 0):
        breaks = text.count(measured["graph_breaks"], "graph break")
        return "breaks", f"{breaks}, first: {measured.get('first_break', '?')}", ""
    if measured.get("recompiles", 0):
        return "recompiles", f"{text.count(measured['recompiles'], 'recompile')} on an identical second call", ""
    drift = measured.get("drift", float("nan"))
    if not drift <= tolerance:
        return "fails", f"{graphs}, but drift {drift:.2e} from eager (tolerance {tolerance:g})", ""
    extra = f", {cold_label(measured)} {measured['compile_s']:.2f} s" if "compile_s" in measured else ""
    extra += f", step {measured['speedup']:.2f}x faster" if "speedup" in measured else ""
    return "works", f"{graphs}, 0 breaks, drift {drift:.1e}{extra}", ""


def verdict_regional(measured: dict[str, Any], tolerance: float) -> tuple[str, str, str]:
    """Regional compilation: the compile verdict, plus: the model names its repeated blocks, and compiling them costs
    less than compiling the whole model cold."""
    if not measured.get("repeated_blocks"):
        return "fails", "", "the model class declares no _repeated_blocks, so compile_repeated_blocks has nothing to do"
    outcome, figure, message = verdict_compile(measured, tolerance)
    if outcome != "works":
        return outcome, figure, message
    full, regional = measured.get("full_compile_s"), measured.get("compile_s")
    ratio = f", {full / regional:.1f}x less than the whole model's {full:.2f} s" if full and regional else ""
    classes = text.count(len(measured["repeated_blocks"]), "block class", "block classes")
    figure = (f"{text.count(measured['graphs'], 'graph')} for {classes}{extra_graphs(measured)}, "
              f"{cold_label(measured)} {regional:.2f} s{ratio}; drift {measured['drift']:.1e}")
    if full and regional and not regional < full:
        return "fails", figure, f"regional {cold_label(measured)} was not faster than the whole model's"
    return "works", figure, ""


def extra_graphs(measured: dict[str, Any]) -> str:
    """Which block class compiled more than one graph in its first call, and why in words, e.g.
    " (FluxSingleTransformerBlock 2 graphs: 'hidden_states' came with other strides)"; '' when none did. The guard's
    own text stays in measured."""
    per_class, why = measured.get("graphs_per_class") or {}, measured.get("guard_failures") or {}
    said = [f"{name} {n} graphs" + (f": {guard_words(why[name][0])}" if why.get(name) else "")
            for name, n in per_class.items() if n > 1]
    return f" ({'; '.join(said)})" if said else ""


def guard_words(guard: str) -> str:
    """A failed guard in words: "tensor 'x' stride mismatch at index 0 ..." -> "'x' came with other strides"; any
    other guard cut to 90 characters."""
    found = re.search(r"tensor '([^']+)' (stride|size|dtype|device|requires_grad) mismatch", guard)
    if not found:
        return shorten(guard, 90)
    name, kind = found.groups()
    return f"'{name}' came with " + {"stride": "other strides", "size": "another size", "dtype": "another dtype",
                                     "device": "another device", "requires_grad": "another requires_grad"}[kind]


def verdict_resolution(measured: dict[str, Any]) -> tuple[str, str, str]:
    """A new resolution: works when, with dynamic=True, new sizes compile nothing; recompiles otherwise (counted
    beside the default's)."""
    if measured.get("error"):
        return "fails", "", measured["error"]
    default, dynamic = measured["default_recompiles"], measured["dynamic_recompiles"]
    sizes = " and ".join(f"{h}x{w}" for h, w in measured["sizes"][1:])
    first = f"{measured['sizes'][0][0]}x{measured['sizes'][0][1]}"
    figure = (f"{sizes} after {first}: the default compiles {text.count(default, 'more graph')} (its block classes "
              f"again at the next size, dynamic from then on: notebook 05), dynamic=True {dynamic}")
    if measured.get("graph_breaks", 0):
        return "breaks", figure + f"; {text.count(measured['graph_breaks'], 'graph break')}", ""
    return ("works", figure, "") if dynamic == 0 else ("recompiles", figure, "")


def verdict_cache(measured: dict[str, Any]) -> tuple[str, str, str]:
    """A step cache: works when it installs, the pipeline runs, its output is finite and it skipped something. Where
    the plain call raised for want of a cache context and the probe tried again inside `cache_context` (measured
    'change'), the same checks decide between 'needs a change' (the line shown) and fails (both errors kept)."""
    change, plain = measured.get("change"), measured.get("plain_error", "")
    if measured.get("error"):
        if change:
            return "fails", "", (f"{measured['error']} (inside `{change}`, as the plain call's error asks); "
                                 f"plain call: {plain}")
        return "fails", "", measured["error"]
    unit = measured["unit"]
    knob = "threshold" if unit == "block" else "an interval of"  # block caches decide by a threshold
    figure = (f"{measured['skipped']} of {measured['calls']} {unit} computations skipped at {knob} "
              f"{measured['setting']:g} in {measured['steps']} steps")
    figure = f"`{change}`, one `with` per call: {figure}" if change else figure
    if not measured.get("finite", False):
        return "fails", figure, "the output is not finite"
    if not measured["skipped"]:
        return "fails", figure, "the cache never took effect (nothing skipped)"
    return ("needs a change", figure, f"without it: {plain}") if change else ("works", figure, "")


def _unmeasured(measured: dict[str, Any]) -> tuple[str, str, str] | None:
    """The verdict of a probe that measured nothing: refused here, not run here or fails, with the message."""
    for key, outcome in (("refused", "refused here"), ("not_run", "not run here"), ("error", "fails")):
        if measured.get(key):
            return outcome, "", measured[key]
    return None


def verdict_quantized(measured: dict[str, Any], band: float) -> tuple[str, str, str]:
    """int8 / fp8 with torchao: refused here (the library's reason) or fails on an error; then the compile verdict
    of the quantized denoiser, whose drift from bf16 must stay within band."""
    if early := _unmeasured(measured):
        return early
    outcome, figure, message = verdict_compile(measured, band)
    if outcome == "works":
        figure = f"{measured['layers']} linear layers quantized, compiles ({text.count(measured['graphs'], 'graph')}, 0 breaks), " \
                 f"drift {measured['drift']:.1e} from the unquantized model"
    return outcome, figure, message


def verdict_nf4(measured: dict[str, Any], band: float) -> tuple[str, str, str]:
    """NF4 through PipelineQuantizationConfig: refused here (diffusers without a GPU) or not run here, fails on an
    error, else works when the NF4 denoiser's drift stays within band."""
    if early := _unmeasured(measured):
        return early
    drift = measured["drift"]
    figure = f"{measured['layers']} Linear4bit layers, drift {drift:.1e} from the unquantized model"
    return ("works", figure, "") if drift <= band else ("fails", figure, f"drift above {band:g}")


def verdict_lora(measured: dict[str, Any], tolerance: float) -> tuple[str, str, str]:
    """LoRA hot-swap on a compiled denoiser: works when the swap recompiles nothing, nothing breaks, and the swapped
    output is the one the second adapter gives loaded the ordinary way."""
    if measured.get("error"):
        return "fails", "", measured["error"]
    r1, r2 = measured["ranks"]
    figure = (f"rank {r1} -> {r2} swapped on the compiled model: {text.count(measured['swap_recompiles'], 'recompile')}, "
              f"{measured['layers']} layers, swapped vs ordinary {measured['drift']:.1e}")
    if measured.get("graph_breaks", 0):
        return "breaks", figure + f"; {text.count(measured['graph_breaks'], 'graph break')}", ""
    if measured["swap_recompiles"]:
        return "recompiles", figure, ""
    if not measured["drift"] <= tolerance:
        return "fails", figure, "the swapped adapter's output is not the ordinary load's"
    return "works", figure, ""


def verdict_offload(measured: dict[str, Any], tolerance: float) -> tuple[str, str, str]:
    """Model / group offload: refused here (no accelerator) or fails on an error; else works when the output matches
    the resident model's, saying where the weights were between calls."""
    if early := _unmeasured(measured):
        return early
    where = measured["weights_off_device"]
    figure = f"parity {measured['drift']:.1e}; {where}"
    if not measured["drift"] <= tolerance:
        return "fails", figure, "output differs"
    if not measured.get("moved", True):  # a CPU: the hooks install and keep parity, but there is nowhere to move to
        return "not run here", figure, "moving weights needs an accelerator"
    return "works", figure, ""


def verdict_context_parallel(measured: dict[str, Any], tolerance: float) -> tuple[str, str, str]:
    """Context parallelism: fails without a _cp_plan; not run here without two ranks; else works on parity, or
    needs a change where the plain config refused an uneven split and `ulysses_anything=True` (measured 'change')
    then kept parity. The figure names the weights and dtype the split ran (its bf16 drift depends on them)."""
    if not measured.get("cp_plan"):
        return "fails", "", "the model class has no _cp_plan: enable_parallelism cannot split it"
    if measured.get("not_run"):
        return "not run here", f"_cp_plan present ({measured['cp_plan']} entries)", measured["not_run"]
    shape = (f" ({measured['text_tokens']} text and {measured['image_tokens']} image tokens over "
             f"{measured['degree']} ranks)" if "text_tokens" in measured else "")
    change, plain = measured.get("change"), measured.get("plain_error", "")
    if measured.get("error"):
        if change:
            return "fails", f"_cp_plan present ({measured['cp_plan']} entries); also with `{change}`", \
                f"{measured['error']}{shape}; plain config: {plain}"
        return "fails", f"_cp_plan present ({measured['cp_plan']} entries)", measured["error"] + shape
    ran = ", ".join(x for x in (f"{measured['weights']} weights" if measured.get("weights") else "",
                                measured.get("dtype", "")) if x)
    figure = (f"Ulysses over {measured['degree']} {measured['backend']} ranks{f' ({ran})' if ran else ''}: drift "
              f"{measured['drift']:.1e} from one process")
    if change:
        figure = f"`ContextParallelConfig(ulysses_degree={measured['degree']}, {change})`: {figure}"
    if not measured["drift"] <= tolerance:
        return "fails", figure, "output differs"
    return ("needs a change", figure, f"the plain config fails at {shape.strip(' ()')}: {plain}") if change else \
        ("works", figure, "")


def verdict_attention(measured: dict[str, Any], tolerance: float) -> tuple[str, str, str]:
    """Attention backends: works when at least one ran, and every one that ran reached its own function, ran its own
    kernel (no silent fallback) and matched the default backend."""
    ran, skipped = measured.get("ran", {}), measured.get("skipped", {})
    if not ran:
        return "fails", "", "no attention backend ran here"
    names = ", ".join(ran)
    figure = f"{len(ran)} of {len(ran) + len(skipped)} backends run here ({names}); the rest need CUDA or packages"
    problems = [r["fallback"] for r in ran.values() if r["fallback"]]
    problems += [f"{b}: drift {r['drift']:.1e}" for b, r in ran.items() if not r["drift"] <= tolerance]
    return ("fails", figure, "; ".join(problems)) if problems else ("works", figure, "")


# --- probes: run one lever on a Subject, measure, decide ---

def graphs_by_class(net: torch.nn.Module, names: list[str]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """For each named block class of net: the graphs dynamo holds for its forward (one per set of guards it was
    called under), and the guards that failed before each extra one (the compile id prefix cut). Read after a call,
    before torch._dynamo.reset()."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import guard_failures

    graphs, why = {}, {}
    for name in names:
        cls = next((type(m) for m in net.modules() if type(m).__name__ == name), None)
        if cls is None:
            continue
        code = cls.forward.__code__
        graphs[name] = len(_debug_get_cache_entry_list(code))
        why[name] = [reason.split(": ", 1)[-1] for reason in guard_failures.get(code, [])]
    return graphs, why


def _compile_once(sub: Subject, apply: Callable[[torch.nn.Module], Any], inputs: dict[str, Any] | None = None,
                  timed: tuple[int, int] | None = None, blocks: list[str] | None = None) -> dict[str, Any]:
    """Compile the denoiser with `apply`, run it twice; graphs, breaks (with the first reason), recompiles on the
    second call, drift from eager, the backend and the first call's seconds (and, with timed=(repeats, warmup), the
    compiled step's median; with blocks, the graphs of each block class after the first call). An error is
    recorded, not raised."""
    compile_tools.reset()
    net = sub.net
    out: dict[str, Any] = {"backend": sub.compiler}
    try:
        apply(net)
        with compile_tools.counting() as first:
            seconds, result = measure.first_call_seconds(lambda: sub.step(inputs=inputs), sub.device)
        if blocks:
            out["graphs_per_class"], out["guard_failures"] = graphs_by_class(net, blocks)
        with compile_tools.counting() as again:
            sub.step(inputs=inputs)
        out |= {"graphs": first.graphs, "graph_breaks": first.graph_breaks, "break_reasons": first.break_reasons,
                "first_break": next(iter(first.break_reasons), ""), "recompiles": again.graphs,
                "compile_s": seconds, "drift": compile_tools.relative_error(result, sub.reference)}
        if timed:
            out["compiled_step_s"] = measure.time_callable(lambda: sub.step(inputs=inputs), sub.device,
                                                           repeats=timed[0], warmup=timed[1]).median_s
    except Exception as err:  # noqa: BLE001 the library's refusal is the fact recorded
        out["error"] = text.first_line(err)
    finally:
        compile_tools.uncompile(net)
        compile_tools.reset()
    return out


def _breaks_without_fullgraph(sub: Subject, apply: Callable[[torch.nn.Module], Any]) -> dict[str, Any]:
    """Graph breaks counted when the same compile runs without fullgraph (what fullgraph=True refused)."""
    compile_tools.reset()
    try:
        apply(sub.net)
        with compile_tools.counting() as seen:
            sub.step()
        return {"graph_breaks": seen.graph_breaks, "first_break": next(iter(seen.break_reasons), ""),
                "break_reasons": seen.break_reasons}
    except Exception as err:  # noqa: BLE001
        return {"graph_breaks": 0, "first_break": text.first_line(err)}
    finally:
        compile_tools.uncompile(sub.net)
        compile_tools.reset()


def probe_compile(sub: Subject) -> Cell:
    """`transformer.compile(fullgraph=True)`: graph breaks, recompiles, drift from eager, cold compile seconds; with
    sub.timing, the eager and the compiled step timed (their ratio is the row's `speedup`)."""
    def apply(net: torch.nn.Module) -> None:
        net.compile(fullgraph=True, backend=sub.compiler)

    measured: dict[str, Any] = {}
    if sub.timing:
        eager = measure.time_callable(sub.step, sub.device, repeats=sub.timing[0], warmup=sub.timing[1])
        measured["eager_step_s"] = eager.median_s
    measured |= _compile_once(sub, apply, timed=sub.timing)
    if measured.get("error"):
        measured |= _breaks_without_fullgraph(sub, lambda net: net.compile(backend=sub.compiler))
    if "compiled_step_s" in measured and "eager_step_s" in measured:
        measured["speedup"] = measured["eager_step_s"] / measured["compiled_step_s"]
    return Cell(sub.model, "compile", *verdict_compile(measured, sub.tolerance), measured=measured)


def probe_regional(sub: Subject, full_compile_s: float | None = None) -> Cell:
    """`transformer.compile_repeated_blocks(fullgraph=True)`: the blocks it compiles and the graphs of each, cold
    compile seconds against the whole model's (full_compile_s, from probe_compile), breaks, recompiles, drift."""
    blocks = list(getattr(type(sub.net), "_repeated_blocks", []) or [])
    measured: dict[str, Any] = {"repeated_blocks": blocks, "full_compile_s": full_compile_s}
    if blocks:
        with compile_tools.fresh_cache():
            measured |= _compile_once(sub, lambda net: net.compile_repeated_blocks(fullgraph=True,
                                                                                   backend=sub.compiler),
                                      blocks=blocks)
    return Cell(sub.model, "regional compile", *verdict_regional(measured, sub.tolerance), measured=measured)


def probe_resolution(sub: Subject, sizes: list[tuple[int, int]]) -> Cell:
    """Regional compile at sizes[0], then each other size: recompiles with the default (automatic dynamic after the
    first change) and with dynamic=True."""
    measured: dict[str, Any] = {"sizes": [list(s) for s in sizes]}
    inputs = [sub.inputs_at(h, w) for h, w in sizes]
    try:
        for label, dynamic in (("default", None), ("dynamic", True)):
            compile_tools.reset()
            sub.net.compile_repeated_blocks(fullgraph=True, backend=sub.compiler, dynamic=dynamic)
            sub.step(inputs=inputs[0])
            with compile_tools.counting() as later:
                for extra in inputs[1:]:
                    sub.step(inputs=extra)
            measured[f"{label}_recompiles"] = later.graphs
            measured["graph_breaks"] = measured.get("graph_breaks", 0) + later.graph_breaks
            compile_tools.uncompile(sub.net)
    except Exception as err:  # noqa: BLE001
        measured["error"] = text.first_line(err)
    finally:
        compile_tools.uncompile(sub.net)
        compile_tools.reset()
    return Cell(sub.model, "new resolution", *verdict_resolution(measured), measured=measured)


def cache_config(name: str, setting: float, steps: int, pipe: Any) -> Any:
    """The diffusers cache configuration of a CACHES name at one setting (a threshold or an interval); MagCache
    borrows Flux-1-Dev's calibrated ratios (FLUX_MAG_RATIOS), the only ones diffusers ships."""
    from diffusers import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    now = lambda: pipe.current_timestep
    return {"first-block cache": lambda: FirstBlockCacheConfig(threshold=setting),
            "mag cache": lambda: MagCacheConfig(threshold=setting, num_inference_steps=steps,
                                                mag_ratios=FLUX_MAG_RATIOS),
            "taylorseer cache": lambda: TaylorSeerCacheConfig(cache_interval=int(setting),
                                                              taylor_factors_dtype=torch.float32),
            "pab cache": lambda: PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=int(setting),
                                                                 current_timestep_callback=now),
            "faster cache": lambda: FasterCacheConfig(spatial_attention_block_skip_range=int(setting),
                                                      current_timestep_callback=now,
                                                      attention_weight_callback=lambda _: 0.5,
                                                      is_guidance_distilled=True)}[name]()


def _cached_call(sub: Subject, name: str, prompt: str, steps: int, wrap: bool) -> dict[str, Any]:
    """`transformer.enable_cache(<config>)` and one pipeline call of `steps` steps (with wrap, inside
    `transformer.cache_context("cond")`, CACHE_CONTEXT_LINE): computations skipped, counted; an error recorded."""
    setting, unit = CACHE_SETTINGS[name], CACHE_UNITS.get(name, "attention")
    try:
        sub.net.enable_cache(cache_config(name, setting, steps, sub.pipe))
        around = sub.net.cache_context("cond") if wrap else contextlib.nullcontext()
        with around, caching.count_computations(sub.net, unit) as counts, torch.inference_mode():
            latents = sub.pipe(**sub.call_kwargs(prompt, steps)).images
        return counts.summary() | {"pattern": counts.pattern(), "finite": bool(torch.isfinite(latents).all())}
    except Exception as err:  # noqa: BLE001
        return {"error": text.first_line(err)}
    finally:
        with contextlib.suppress(Exception):
            sub.net.disable_cache()


def probe_cache(sub: Subject, name: str, prompt: str, steps: int) -> Cell:
    """`transformer.enable_cache(<config>)` and one pipeline call of `steps` steps: computations skipped, counted.
    Where the call raises for want of a cache context (a pipeline that opens none, as diffusers 0.42's
    Flux2Pipeline), the call is tried again inside the context the error asks for, around the whole pipeline call
    (CACHE_CONTEXT_LINE), and both are kept: the plain call's error as 'plain_error', the line as 'change'."""
    measured: dict[str, Any] = {"setting": CACHE_SETTINGS[name], "unit": CACHE_UNITS.get(name, "attention"),
                                "steps": steps}
    measured |= _cached_call(sub, name, prompt, steps, wrap=False)
    if NO_CACHE_CONTEXT in measured.get("error", ""):
        measured |= {"plain_error": measured.pop("error"), "change": CACHE_CONTEXT_LINE}
        measured |= _cached_call(sub, name, prompt, steps, wrap=True)
    return Cell(sub.model, name, *verdict_cache(measured), measured=measured)


def quantize_config(name: str) -> Any:
    """torchao's config for 'int8' (int8 weights, int8 dynamic activations) or 'fp8' (fp8 row-wise, dynamic)."""
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        PerRow,
    )

    return Int8DynamicActivationInt8WeightConfig() if name == "int8" else \
        Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


# Drift from bf16 a quantized denoiser may have: notebook 12's bands for int8 and fp8 (helpers.stack); NF4's 16 levels
# per block of 64 weights round each weight to ~1/16 of its block's range, coarser again than fp8, so its band is
# twice fp8's. The trained smoke Flux drifts 0.43 in one step through bitsandbytes' own NF4 round trip on the CPU
# (tests/test_stack.py); weights a fifth too large, as a wrong scale makes them, drift about 1.
QUANTIZED_DRIFT_BAND: dict[str, float] = {"int8": stack.INT8_TOLERANCE, "fp8": stack.FP8_TOLERANCE,
                                          "nf4": 2 * stack.FP8_TOLERANCE}


def probe_quantized(sub: Subject, name: str) -> Cell:
    """torchao `quantize_(transformer, <int8 or fp8 config>)`, then regional compile with fullgraph=True: the
    library's refusal, or breaks, recompiles and drift from the bf16 output."""
    from torchao.quantization import quantize_

    measured: dict[str, Any] = {}
    try:
        quantize_(sub.net, quantize_config(name))
        measured["layers"] = sum(1 for m in sub.net.modules() if isinstance(m, torch.nn.Linear)
                                 and type(m.weight).__name__ != "Parameter")
        sub.step()
    except (AssertionError, NotImplementedError, RuntimeError) as err:
        measured["refused" if _hardware_refusal(err, sub.device) else "error"] = text.first_line(err)
    if not measured.get("refused") and not measured.get("error"):
        measured |= _compile_once(sub, lambda net: net.compile_repeated_blocks(fullgraph=True, backend=sub.compiler))
    sub.restore()
    stack.restore_inductor_defaults()  # torchao's configs set inductor flags for the process: later probes go without
    return Cell(sub.model, name, *verdict_quantized(measured, QUANTIZED_DRIFT_BAND[name]), measured=measured)


def _hardware_refusal(err: BaseException, device: torch.device) -> bool:
    """Whether a library error says this hardware lacks something (a GPU, a compute capability), not the model. On a
    CUDA GPU only a compute capability counts: an error naming CUDA there (tensors on cuda:0 and cpu, cuBLAS, out of
    memory) is a failure the GPU run exists to find."""
    said = str(err).lower()
    words = ("compute capability",) if device.type == "cuda" else ("cuda", "gpu", "compute capability",
                                                                    "accelerator", "xpu")
    return any(w in said for w in words)


def nf4_config(dtype: torch.dtype) -> Any:
    """diffusers' PipelineQuantizationConfig putting the denoiser in bitsandbytes NF4 (notebook 09's settings)."""
    from diffusers import PipelineQuantizationConfig

    return PipelineQuantizationConfig(quant_backend="bitsandbytes_4bit",
                                      quant_kwargs={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                                    "bnb_4bit_compute_dtype": dtype},
                                      components_to_quantize=["transformer"])


def probe_nf4(sub: Subject, profile: str) -> Cell:
    """`<Pipeline>.from_pretrained(folder, quantization_config=PipelineQuantizationConfig(NF4))` on the saved smoke
    pipeline: diffusers' refusal without a GPU, or the NF4 denoiser's drift from bf16. On the full profile the
    random weights are never written to disk, so it is not run there."""
    measured: dict[str, Any] = {}
    if profile != "smoke":
        weights = sum(p.numel() * p.element_size() for p in sub.net.parameters()) / 2**30
        measured["not_run"] = (f"NF4 quantizes while from_pretrained loads from disk; the full profile's random "
                               f"weights ({weights:.1f} GiB) are not written to disk")
    else:
        dtype = next(sub.net.parameters()).dtype
        with tempfile.TemporaryDirectory(prefix="nb16-nf4-") as folder:
            sub.pipe.save_pretrained(folder)
            try:
                quantized = type(sub.pipe).from_pretrained(folder, quantization_config=nf4_config(dtype),
                                                           dtype=dtype).to(sub.device)
                net = pipelines.denoiser(quantized)
                measured["layers"] = sum(1 for m in net.modules() if type(m).__name__ == "Linear4bit")
                measured["drift"] = compile_tools.relative_error(sub.step(module=net), sub.reference)
            except Exception as err:  # noqa: BLE001
                measured["refused" if _hardware_refusal(err, sub.device) else "error"] = text.first_line(err)
    return Cell(sub.model, "nf4", *verdict_nf4(measured, QUANTIZED_DRIFT_BAND["nf4"]), measured=measured)


def probe_lora(sub: Subject, folder: Path) -> Cell:
    """Two seeded adapters (ranks LORA_RANKS); the ordinary load of the second for reference; then
    `enable_lora_hotswap(target_rank)`, the first loaded, regional compile, a step, the second hot-swapped in
    (`load_lora_weights(..., hotswap=True)`), a step: recompiles counted, output against the ordinary load's."""
    from helpers import lora

    measured: dict[str, Any] = {"ranks": list(LORA_RANKS)}
    try:
        first, second = (lora.make_adapter(sub.pipe, folder / f"rank{r}", r, seed=sub.seed + i + 1)
                         for i, r in enumerate(LORA_RANKS))
        with lora.ordinary_load(sub.pipe, second, "ordinary"):
            ordinary = sub.step().clone()
        sub.pipe.enable_lora_hotswap(target_rank=max(LORA_RANKS))
        sub.pipe.load_lora_weights(str(first), adapter_name="default")
        measured["layers"] = len(lora.loaded_layers(sub.net, "default"))
        compile_tools.reset()
        sub.net.compile_repeated_blocks(fullgraph=True, backend=sub.compiler)
        with compile_tools.counting() as compiled:
            sub.step()
        sub.pipe.load_lora_weights(str(second), adapter_name="default", hotswap=True)
        with compile_tools.counting() as swapped:
            out = sub.step()
        measured |= {"graphs": compiled.graphs, "graph_breaks": compiled.graph_breaks + swapped.graph_breaks,
                     "swap_recompiles": swapped.graphs,
                     "drift": compile_tools.relative_error(out, ordinary)}
    except Exception as err:  # noqa: BLE001
        measured["error"] = text.first_line(err)
    finally:
        compile_tools.uncompile(sub.net)
        compile_tools.reset()
        with contextlib.suppress(Exception):
            sub.pipe.unload_lora_weights()
        sub.restore()
    return Cell(sub.model, "lora hot-swap", *verdict_lora(measured, sub.tolerance), measured=measured)


def probe_offload(sub: Subject, mode: str) -> Cell:
    """`pipe.enable_model_cpu_offload()` or `transformer.enable_group_offload(block_level, 1 block a group)`: the
    library's refusal, or parity with the resident denoiser and where its weights sit between calls."""
    measured: dict[str, Any] = {"mode": mode}
    cuda, installed = sub.device.type == "cuda", False
    try:
        if mode == "model":
            sub.pipe.enable_model_cpu_offload()
        else:
            sub.net.enable_group_offload(onload_device=sub.device, offload_device=torch.device("cpu"),
                                         offload_type="block_level", num_blocks_per_group=1)
        installed = True
        measured["drift"] = compile_tools.relative_error(sub.step(), sub.reference)
        if mode == "model":  # its hook keeps a model on the GPU until the next one runs, as a pipeline call ends
            sub.pipe.maybe_free_model_hooks()
        on_cpu = sum(p.numel() for p in sub.net.parameters() if p.device.type == "cpu")
        total = sum(p.numel() for p in sub.net.parameters())
        measured["moved"] = cuda
        measured["weights_off_device"] = (f"{on_cpu / total:.0%} of the denoiser's weights on the CPU between calls"
                                          if cuda else "hooks installed, but a CPU moves nothing (onload and "
                                          "offload are the same memory)")
    except Exception as err:  # noqa: BLE001
        measured["refused" if _hardware_refusal(err, sub.device) else "error"] = text.first_line(err)
    finally:
        if installed:  # model offload: hooks off, weights back; group offload: its hooks live in the denoiser
            with contextlib.suppress(Exception):
                sub.pipe.remove_all_hooks()
            if mode == "group":
                sub.restore()
            if cuda:
                sub.pipe.to(sub.device)
    return Cell(sub.model, f"{mode} offload", *verdict_offload(measured, sub.tolerance), measured=measured)


def probe_context_parallel(sub: Subject, run_split: Callable[[], dict[str, Any]] | None) -> Cell:
    """Context parallelism: the class's `_cp_plan`, then (where run_split can run two ranks) Ulysses over two ranks
    against one process; run_split returns {'drift', 'degree', 'backend', 'weights', 'dtype', tokens} or {'error'},
    with {'plain_error', 'change'} where the plain config refused an uneven split and `ulysses_anything=True` was
    tried (helpers.transfer_cp)."""
    plan = getattr(type(sub.net), "_cp_plan", None) or {}
    measured: dict[str, Any] = {"cp_plan": len(plan)}
    if plan:
        if run_split is None:
            measured["not_run"] = (f"needs two ranks: {torch.cuda.device_count()} GPU here" if sub.device.type ==
                                   "cuda" else "needs two ranks")
        else:
            measured |= run_split()
    return Cell(sub.model, "context parallel", *verdict_context_parallel(measured, sub.tolerance), measured=measured)


def probe_attention(sub: Subject, backends: tuple[str, ...] = attention_backends.BACKENDS) -> Cell:
    """Every attention backend diffusers names: skipped with its reason, or run for one step with the calls that
    reached it, the kernels the profiler saw, a silent fallback found, and drift from the default backend."""
    from diffusers import attention_backend

    dtype = next(sub.net.parameters()).dtype
    head_dim = sub.net.config.attention_head_dim
    ran: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    with attention_backend("native"):  # restores the process default afterwards
        for backend in backends:
            why = attention_backends.skip_reason(backend, sub.device, dtype, head_dim)
            if why:
                skipped[backend] = why
                continue
            sub.net.set_attention_backend(backend)
            with attention_backends.dispatch_counter(backend) as dispatched:
                kernels, out = attention_backends.kernels_seen(sub.step)
            ran[backend] = {"dispatched": dispatched["calls"], "kernels": kernels,
                            "fallback": attention_backends.fallback_problem(backend, kernels, dispatched["calls"]),
                            "drift": compile_tools.relative_error(out, sub.reference)}
        sub.net.reset_attention_backend()
    measured = {"ran": ran, "skipped": skipped}
    return Cell(sub.model, "attention backends", *verdict_attention(measured, sub.tolerance), measured=measured)


# --- the table ---

TABLE_LIMIT = 240  # characters of a library's message a table cell keeps: its first line, whole as a rule


def cells_frame(cells: list[Cell]) -> pd.DataFrame:
    """Lever rows x model columns of cell texts, in LEVERS and MODELS order ('' where not run)."""
    models = [m for m in MODELS if any(c.model == m for c in cells)]
    levers = [lever for lever in LEVERS if any(c.lever == lever for c in cells)]
    table = pd.DataFrame("", index=levers, columns=[MODEL_NAMES[m] for m in models])
    for c in cells:
        table.loc[c.lever, MODEL_NAMES[c.model]] = c.text(limit=TABLE_LIMIT)
    table.index.name = "lever"
    return table


def counts_line(cells: list[Cell]) -> str:
    """Per model, how many of its levers work, and which work with breaks or recompiles, work with a change, are
    refused or not run here, or fail (only the outcomes that occur), e.g. 'Qwen-Image: 11 of 16 work, 1 works with
    a change (context parallel), 4 refused or not run here (fp8, nf4, model offload, group offload)'."""
    parts = []
    for model in [m for m in MODELS if any(c.model == m for c in cells)]:
        mine = [c for c in cells if c.model == model]
        levers = {what: [c.lever for c in mine if c.outcome in kinds] for what, kinds in (
            (("works with breaks or recompiles", "work with breaks or recompiles"), ("breaks", "recompiles")),
            (("works with a change", "work with a change"), ("needs a change",)),
            (("refused or not run here", "refused or not run here"), ("refused here", "not run here")),
            (("fails", "fail"), ("fails",)))}
        said = [f"{sum(c.outcome == 'works' for c in mine)} of {len(mine)} work"]
        said += [f"{len(named)} {what[len(named) != 1]} ({', '.join(named)})" for what, named in levers.items() if named]
        parts.append(f"{MODEL_NAMES[model]}: " + ", ".join(said))
    return "; ".join(parts)


def committed_counts(results_dir: Path, notebook: str = "16_does_it_transfer") -> str:
    """The TL;DR line: counts_line of each committed run of the notebook (per hardware and profile; the table file
    names the revision), or that none is committed."""
    rows = results.read_rows(results_dir, notebook=notebook)
    if rows.empty:
        return "no run of this notebook is committed yet"
    lines = []
    for (hardware, profile), runs in rows.groupby(["hardware", "profile"]):
        cells = [cell_from_row(r) for r in runs.to_dict("records") if "outcome" in (r.get("extra") or {})]
        if cells:
            lines.append(f"committed run ({hardware}, {profile} profile): " + counts_line(cells))
    return "\n".join(lines) or "no run of this notebook is committed yet"


def markdown(cells: list[Cell], header: str) -> str:
    """The table as markdown, after a header paragraph (what ran, where, and how to read it)."""
    table = cells_frame(cells)
    lines = [header, "", "| lever | " + " | ".join(table.columns) + " |", "|---|" + "---|" * len(table.columns)]
    lines += [f"| {lever} | " + " | ".join(row) + " |" for lever, row in table.iterrows()]
    return "\n".join(lines) + "\n"


def write_table(path: Path, cells: list[Cell], header: str) -> Path:
    """Write the markdown table to path (atomically: a partial file never stands)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(markdown(cells, header))
    tmp.replace(path)
    return path


def cell_from_row(row: dict[str, Any]) -> Cell:
    """A Cell back from the row the notebook recorded (extra: model_tested, lever, outcome, figure, message)."""
    extra = row["extra"]
    return Cell(extra["model_tested"], extra["lever"], extra["outcome"], extra.get("figure", ""),
                extra.get("message", ""), extra.get("measured", {}))


def row_fields(cell: Cell) -> dict[str, Any]:
    """What the notebook records for a cell: status 'skipped' (with the reason) where it was refused or not run here,
    else 'ok' with the outcome (a lever that fails on a model is a measured outcome, not a failed notebook: its row
    keeps the library's message as its reason; one that needs a change keeps the change as its reason)."""
    skipped = cell.outcome in ("refused here", "not run here")
    m = cell.measured
    lifted = {k: m[k] for k in ("compile_s", "graph_breaks", "speedup", "eager_step_s", "compiled_step_s", "drift")
              if isinstance(m.get(k), (int, float))}
    if isinstance(m.get("recompiles", m.get("swap_recompiles")), int):
        lifted["recompiles"] = m.get("recompiles", m.get("swap_recompiles"))
    why = cell.message or cell.figure
    reason = why if skipped else f"the lever fails here (a measured outcome): {why}" if cell.outcome == "fails" else \
        f"the lever works here only with a change to the user's code: {cell.figure}" \
        if cell.outcome == "needs a change" else ""
    return {"status": "skipped" if skipped else "ok", "reason": reason,
            "model_tested": cell.model, "lever": cell.lever, "outcome": cell.outcome, "verdict": cell.verdict,
            "figure": cell.figure,
            "message": cell.message, "text": cell.text(), "measured": json.loads(json.dumps(m, default=str)),
            **lifted}


def scenario(cell: Cell) -> str:
    """The row's scenario of a cell: '<lever> | <model>' (e.g. 'compile | qwen-image')."""
    return f"{cell.lever} | {cell.model}"


@contextlib.contextmanager
def lora_folder() -> Iterator[Path]:
    """A temporary folder for the probe's adapters, deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix="nb16-lora-") as folder:
        yield Path(folder)


# --- checks of a finished table (the Checks cell; the unit tests plant failures) ---

def works_problems(cell: Cell, tolerance: float) -> list[str]:
    """What is wrong with a cell that says 'works' (as is, or with a change: WORKING), re-read from what it measured
    ([] when nothing is, or when the cell says neither): a graph break, a recompile, drift past the band, a cache
    that skipped nothing, an attention backend that fell back, an offload whose output differs, a hot-swap that
    recompiled, a change claimed without the plain call's error that asked for it."""
    if cell.outcome not in WORKING:
        return []
    m, problems = cell.measured, []
    if m.get("graph_breaks", 0):
        problems.append(text.count(m['graph_breaks'], 'graph break'))
    for key in ("recompiles", "swap_recompiles"):
        if m.get(key, 0):
            problems.append(f"{m[key]} {key.replace('_', ' ')}")
    if cell.lever == "new resolution" and m.get("dynamic_recompiles", 1):
        problems.append(f"dynamic=True recompiled {text.count(m.get('dynamic_recompiles'), 'time')}")
    band = QUANTIZED_DRIFT_BAND.get(cell.lever, tolerance)
    if "drift" in m and not m["drift"] <= band:
        problems.append(f"drift {m['drift']:.2e} above {band:g}")
    if cell.lever in CACHES and not (m.get("skipped", 0) > 0 and m.get("finite")):
        problems.append("the cache skipped nothing (or the output is not finite)")
    if cell.lever == "attention backends":
        ran = m.get("ran", {})
        problems += [r["fallback"] for r in ran.values() if r.get("fallback")]
        problems += [f"{b}: drift {r['drift']:.2e}" for b, r in ran.items() if not r["drift"] <= tolerance]
        problems += [] if ran else ["no backend ran"]
    if m.get("error"):
        problems.append(f"an error was recorded: {m['error']}")
    if cell.outcome == "needs a change" and not (m.get("change") and m.get("plain_error")):
        problems.append("a change is claimed, but no plain call failed for want of it")
    if cell.works and m.get("change"):
        problems.append(f"says works, but ran only with a change: {m['change']}")
    return problems


def verdict_holds(cell: Cell, tolerance: float) -> bool:
    """Whether the cell's outcome is the one its verdict function gives for what it measured (the table was not
    edited after the fact)."""
    return recompute(cell, tolerance)[0] == cell.outcome


def recompute(cell: Cell, tolerance: float) -> tuple[str, str, str]:
    """The verdict function of the cell's lever applied again to what it measured."""
    m, lever = cell.measured, cell.lever
    if cell.outcome == "not run here" and lever != "context parallel" and not m:
        return "not run here", cell.figure, cell.message  # a model that does not fit the GPU: nothing measured
    if lever == "compile":
        return verdict_compile(m, tolerance)
    if lever == "regional compile":
        return verdict_regional(m, tolerance)
    if lever == "new resolution":
        return verdict_resolution(m)
    if lever in CACHES:
        return verdict_cache(m)
    if lever in ("int8", "fp8"):
        return verdict_quantized(m, QUANTIZED_DRIFT_BAND[lever])
    if lever == "nf4":
        return verdict_nf4(m, QUANTIZED_DRIFT_BAND["nf4"])
    if lever == "lora hot-swap":
        return verdict_lora(m, tolerance)
    if lever in ("model offload", "group offload"):
        return verdict_offload(m, tolerance)
    if lever == "context parallel":
        return verdict_context_parallel(m, tolerance)
    return verdict_attention(m, tolerance)


# --- running every lever on one model ---

def run_levers(sub: Subject, levers: list[str], *, prompt: str, cache_steps: int, sizes: list[int], profile: str,
               split: Callable[[], dict[str, Any]] | None) -> Iterator[Cell]:
    """Each lever's probe on the subject in the order given (a GPU command lists first what it must not miss),
    yielding each cell as it is measured; regional compilation is compared with compile's cold seconds when compile
    ran before it."""
    full_compile_s = None
    for lever in dict.fromkeys(levers):
        if lever == "compile":
            cell = probe_compile(sub)
            full_compile_s = cell.measured.get("compile_s")
        elif lever == "regional compile":
            cell = probe_regional(sub, full_compile_s)
        elif lever == "new resolution":
            cell = probe_resolution(sub, [(size, size) for size in sizes])
        elif lever in CACHES:
            cell = probe_cache(sub, lever, prompt, cache_steps)
        elif lever in ("int8", "fp8"):
            cell = probe_quantized(sub, lever)
        elif lever == "nf4":
            cell = probe_nf4(sub, profile)
        elif lever == "lora hot-swap":
            with lora_folder() as folder:
                cell = probe_lora(sub, folder)
        elif lever in ("model offload", "group offload"):
            cell = probe_offload(sub, lever.split()[0])
        elif lever == "context parallel":
            cell = probe_context_parallel(sub, split)
        else:
            cell = probe_attention(sub)
        yield cell


def check_model_weights(model: str, weights: str) -> None:
    """Refuse a folder or hub id for MODEL='all' (one WEIGHTS cannot hold three models' weights)."""
    from helpers.params import ParameterError

    if model == "all" and weights not in ("auto", "random"):
        raise ParameterError(f"WEIGHTS={weights!r} with MODEL='all': one folder or hub id cannot hold three models; "
                             f"use WEIGHTS='auto' or 'random', or name one model: MODEL in {MODELS}")


def table_path(value: Any, results_dir: Path, hardware: str, profile: str, model: str) -> Path:
    """Where the table is written: TABLE_FILE when given (a non-empty string), else <RESULTS_DIR>/transfer-table.md
    on the smoke profile and <RESULTS_DIR>/<hardware>/transfer-table.<MODEL>.md on the full one."""
    from helpers.params import ParameterError

    if value is not None and (not isinstance(value, str) or not value.strip().endswith(".md")):
        raise ParameterError(f"TABLE_FILE={value!r} is not allowed; use None or a path ending in .md")
    if value:
        return Path(value).expanduser().resolve()
    return results_dir / "transfer-table.md" if profile == "smoke" else \
        results_dir / hardware / f"transfer-table.{model}.md"


def tolerance(dtype_name: str) -> float:
    """The parity tolerance of a dtype (compile_tools.PARITY_TOLERANCE)."""
    return compile_tools.PARITY_TOLERANCE[dtype_name]


READING = ("works: the lever installs, the graph holds (0 breaks with fullgraph=True), nothing recompiles, the output "
           "matches the plain model's within the dtype's tolerance (quantization: within notebook 12's band) and the "
           "lever did something (a cache skipped computations, a backend ran its own kernel); works with graph "
           "breaks / recompiles: it runs, counted; works with a change: the plain call fails with an error that names "
           "its fix, and with that change to the user's code (shown) the lever works; refused here: the library "
           "refused on this machine (no GPU), the model is not to blame; not run here: needs what this machine lacks "
           "(two ranks, weights on disk, memory); fails: the library's error on this model, shortened, or the check "
           "that failed")


def table_header(run: Any, card: Any, levers: list[str], compiler: str, models: list[str]) -> str:
    """The paragraph above the table: what ran, where, with what, and how to read a cell."""
    from importlib.metadata import version

    versions = ", ".join(f"{k} {card.versions.get(k) or version(k)}" for k in ("torch", "diffusers", "torchao", "peft"))
    size = "tiny models in the real classes (data/configs/<model>/smoke)" if run.profile == "smoke" else \
        "the released architectures with seeded random weights (FLUX.2 without its text encoder)"
    return (f"# Does it transfer? Every lever on {', '.join(MODEL_NAMES[m] for m in models)}\n\n"
            f"Made by notebooks/16_does_it_transfer.ipynb on the {run.profile} profile: {size}; {card.device_name}, "
            f"{run.dtype_name}, graphs compiled with the `{compiler}` backend; {versions}; git {card.git_rev}; "
            f"{len(levers)} levers. {scope(run.profile, compiler)}How to read a cell: {READING}.")


def scope(profile: str, compiler: str) -> str:
    """What a verdict of this run covers: on the smoke profile the code path up to what the backend lowers, at this
    run's token counts, with no figure a GPU's speed."""
    if profile != "smoke":
        return ""
    lowering = ("inductor lowered the graphs as on a GPU" if compiler == "inductor" else
                f"the graphs ran on dynamo's `{compiler}` backend, so a failure in inductor's lowering (int8's "
                f"`_int_mm`, fp8) shows only on the full profile")
    return (f"On the smoke profile a verdict is about the code path up to the compiler: {lowering}; context "
            f"parallelism depends on this run's token counts; skip counts on random weights say that a cache skips, "
            f"not how often; no figure is a GPU's speed. ")


def published_lines(cells: list[Cell], hardware: str, profile: str) -> str:
    """The published figures for these models beside what this run measured: the Qwen-Image compile speedup
    (a comparison), cache-dit's Qwen-Image baseline and SGLang's FLUX.2 step (shown, not divided)."""
    from helpers import report

    def measured(model: str, key: str) -> float | None:
        hit = [c.measured.get(key) for c in cells if c.model == model and c.lever == "compile"]
        return hit[0] if hit and isinstance(hit[0], (int, float)) else None

    speed, qwen_step, flux2_step = (measured("qwen-image", "speedup"), measured("qwen-image", "eager_step_s"),
                                    measured("flux2-dev", "eager_step_s"))
    fmt = lambda v: "not timed here, the full profile times it" if v is None else f"{v:.3f} s per step"
    return "\n".join([
        report.published_line("transfer-qwen-compile-speedup-docs", speed, hardware, profile, model="qwen-image"),
        report.published_beside("Qwen-Image without levers", f"one eager step {fmt(qwen_step)}", hardware, profile,
                                 "Qwen-Image baseline (H100x1)", metric="latency", source="cache-dit benchmark doc",
                                 note="cache-dit's figure is a whole 50-step image"),
        report.published_beside("FLUX.2 [dev] step", fmt(flux2_step), hardware, profile,
                                "FLUX.2-dev denoise step (SGLang main before the PR)", metric="latency",
                                source="sglang PR 16055", note="SGLang's own FLUX.2 code, GPU not named"),
    ])
