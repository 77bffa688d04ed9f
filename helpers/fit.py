"""GPU memory: what a notebook's full profile needs, whether it fits this GPU (or the cap GPU_MEMORY_GIB, which
makes a big GPU stand for a smaller card's memory), and an out-of-memory row instead of a crash.

`check_cap` validates the parameter before anything is built; `apply_cap` sets the CUDA caching allocator's limit
so that the allocator plus the CUDA context (which lives outside the allocator) use at most the cap, as on a card
of that size (a cap stands for a card's memory, never for its speed). `decide` says, from the weights counted by
helpers.footprint and the peaks measured or published (each Need says which), whether a notebook's lesson fits
and which of its parts must be skipped, with "needs N GiB, this GPU has M GiB"; params.resolve uses it to choose
the profile, notebooks to skip a part; `table` is the README's "Which notebooks run on my GPU". `guard` turns an
out-of-memory error into an 'oom' row with the figure.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from helpers import readme_region

GIB = 2**30


class CapError(ValueError):
    """GPU_MEMORY_GIB has a value this machine cannot honour."""


@dataclass(frozen=True)
class Cap:
    """A memory cap as applied: the card size it stands for, the CUDA context's share, the allocator's limit."""

    cap_gib: float
    total_gib: float
    context_gib: float
    allocator_gib: float

    def __str__(self) -> str:
        return (f"capped at {self.cap_gib:g} GiB of {self.total_gib:.1f} GiB (allocator {self.allocator_gib:.2f} GiB "
                f"+ CUDA context {self.context_gib:.2f} GiB)")


def check_cap(value: object, total_gib: float) -> float | None:
    """GPU_MEMORY_GIB as a float, or None (no cap); an error naming what is allowed when it cannot be honoured.

    total_gib is the GPU's memory (0 without a CUDA GPU)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CapError(f"GPU_MEMORY_GIB={value!r} is not allowed; use None (all of the GPU) or a number of GiB > 0, "
                       f"e.g. 24 for an RTX 4090's memory")
    if total_gib <= 0:
        raise CapError(f"GPU_MEMORY_GIB={value!r} caps a CUDA GPU's memory, and no CUDA GPU is visible here; "
                       f"use None")
    if value > total_gib:
        raise CapError(f"GPU_MEMORY_GIB={value!r} is more than this GPU's {total_gib:.1f} GiB; use None or a "
                       f"number up to {total_gib:.1f}")
    return float(value)


def context_gib(device: int = 0) -> float:
    """GiB the CUDA context holds on device outside PyTorch's allocator (driver, kernels), after initialising it."""
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    return max(0.0, (total - free - torch.cuda.memory_reserved(device)) / GIB)


def apply_cap(cap_gib: float, device: int = 0) -> Cap:
    """Limit the caching allocator so that it and the CUDA context fit in cap_gib; allocations past it raise
    torch.OutOfMemoryError as on a card of that size."""
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    ctx = context_gib(device)
    allocator = cap_gib - ctx
    if allocator <= 0:
        raise CapError(f"GPU_MEMORY_GIB={cap_gib:g} leaves nothing beside the CUDA context ({ctx:.2f} GiB)")
    torch.cuda.set_per_process_memory_fraction(min(1.0, allocator / total), device)
    return Cap(cap_gib, total, ctx, allocator)


# --- Will it fit: the full profile's peak per notebook part, against the GPU's memory (or the cap) ---

# Weights of the full-size models in GiB, counted on the meta device by helpers.footprint (tests/test_fit.py holds
# these to it): per component in 16-bit, and the NF4 DiT and T5 as bitsandbytes stores them.
WEIGHTS_GIB: dict[str, dict[str, float]] = {
    "flux-dev": {"transformer": 22.168, "text_encoder": 0.229, "text_encoder_2": 8.87, "vae": 0.156},
    "sdxl": {"unet": 4.782, "text_encoder": 0.229, "text_encoder_2": 1.294, "vae": 0.156},
    "flux2-dev": {"transformer": 60.021, "text_encoder": 44.725, "vae": 0.157},
    "qwen-image": {"transformer": 38.055, "text_encoder": 15.445, "vae": 0.236},
}
NF4_GIB: dict[str, float] = {"transformer": 6.239, "text_encoder_2": 4.019}
# Flux-1-Dev's eager bf16 pipeline peaked at 33.85 GiB on the H200 (notebook 00, 2026-11-26,
# torch.cuda.max_memory_allocated): 2.4 GiB above its 31.42 GiB of weights, the activations and workspace of a
# 1024x1024 image (the VAE decode's, mostly).
FLUX_EAGER_GIB = 33.85
FLUX_ACTIVATIONS_GIB = round(FLUX_EAGER_GIB - sum(WEIGHTS_GIB["flux-dev"].values()), 2)
# diffusers' fuse_qkv_projections keeps the unfused q/k/v layers beside the fused ones: Flux-1-Dev's DiT gains 2.15 B
# parameters, 4.01 GiB in 16 bits (counted on the meta device, tests/test_fit.py; notebook 15's recipe holds the same)
FUSED_QKV_GIB = 4.01
COMPILE_WORKSPACE_GIB = 2.0  # an estimate (not measured yet): what inductor's kernels and graphs may add
SDXL_ACTIVATIONS_GIB = 3.5  # an estimate (not measured yet): SDXL's UNet and VAE decode at 1024x1024 in fp16
CONTEXT_GIB = 0.5  # the CUDA context, outside the allocator (estimated; fit.context_gib measures it on a GPU)
MARGIN_GIB = 0.5  # kept free for the allocator's fragmentation: a peak must stay below the card less both
MEMORY_CLASSES: tuple[int, ...] = (12, 16, 24, 32, 40, 48, 80)  # the cards a learner has, in GiB (README table)


@dataclass(frozen=True)
class Need:
    """One part of a notebook's full-profile run: the GPU memory it peaks at, and on what that figure rests."""

    part: str  # what the README's table shows ("eager pipeline")
    gib: float
    basis: str
    central: bool = False
    key: str = ""  # the notebook's name for it, a PARTS key ("eager"; notebook 16: the model); needs() sets it


def _w(model: str, *names: str, nf4: tuple[str, ...] = ()) -> float:
    """GiB of the named components' 16-bit weights (nf4: those stored in NF4 instead); all components if none."""
    comps = WEIGHTS_GIB[model]
    return sum(NF4_GIB[n] if n in nf4 else comps[n] for n in (names or tuple(comps)))


def _flux_needs() -> dict[str, Need]:
    """The parts Flux-1-Dev's notebooks run, and their peaks."""
    eager = Need("eager pipeline", FLUX_EAGER_GIB, "measured: 00's eager bf16 peak on an H200 (2026-11-26)")
    compiled = Need("compiled pipeline", round(FLUX_EAGER_GIB + COMPILE_WORKSPACE_GIB, 2),
                    f"estimated: the measured eager peak + {COMPILE_WORKSPACE_GIB:g} GiB of compile workspace")
    fp32 = round(2 * sum(WEIGHTS_GIB["flux-dev"].values()) + 2 * FLUX_ACTIVATIONS_GIB, 2)
    dit_8bit = (WEIGHTS_GIB["flux-dev"]["transformer"] + FUSED_QKV_GIB) / 2  # its weights are nearly all Linear
    return {
        "eager": eager, "compiled": compiled,
        "fused-qkv": Need("compiled with fused QKV", round(compiled.gib + FUSED_QKV_GIB, 2),
                          f"estimated: the compiled estimate + the {FUSED_QKV_GIB:g} GiB of unfused q/k/v that "
                          "fuse_qkv_projections keeps (counted)"),
        "aoti": Need("AOTInductor package beside its model",
                     round(compiled.gib - WEIGHTS_GIB["flux-dev"]["transformer"] + 2 * dit_8bit, 2),
                     f"estimated: the compiled estimate with an 8-bit fused DiT ({dit_8bit:.2f} GiB) twice, in the "
                     "model and in the package loaded beside it"),
        "fp32": Need("fp32 reference pipeline", fp32, "estimated: fp32 weights (footprint) + twice the bf16 "
                     "activations measured in 00"),
        "model offload": Need("model CPU offload", 22.7, "published: the hands-on guide's peak on an H100 (GB read as "
                              "GiB); the DiT alone holds 22.17 GiB"),
        "sequential offload": Need("sequential CPU offload", round(FLUX_ACTIVATIONS_GIB + 1.0, 2),
                                   "estimated: the 1024x1024 activations (00) + 1 GiB of layers in flight"),
        "group offload": Need("group offload (block level)",
                              round(max(_w("flux-dev", "text_encoder_2"), FLUX_ACTIVATIONS_GIB) + 1.0, 2),
                              "estimated: block level moves T5 whole (it has no top-level block list), "
                              f"{_w('flux-dev', 'text_encoder_2'):g} GiB, more than the 1024x1024 activations (00) and "
                              "one transformer block; + 1 GiB for what is in flight"),
        "nf4": Need("NF4 pipeline", 15.0, "published: the hands-on guide's NF4 peak on an H100 (GB read as GiB)"),
        "nf4 offload": Need("NF4 + model CPU offload", 12.2, "published: the hands-on guide's peak on an H100"),
    }


def _sdxl_needs() -> dict[str, Need]:
    """The parts SDXL's notebooks run, and their peaks (estimated: no GPU run of SDXL yet)."""
    w = sum(WEIGHTS_GIB["sdxl"].values())
    return {
        "eager": Need("eager pipeline", round(w + SDXL_ACTIVATIONS_GIB, 2),
                      f"estimated: 16-bit weights (footprint) + {SDXL_ACTIVATIONS_GIB:g} GiB of 1024x1024 activations"),
        "compiled": Need("compiled pipeline", round(w + SDXL_ACTIVATIONS_GIB + COMPILE_WORKSPACE_GIB, 2),
                         f"estimated: the eager estimate + {COMPILE_WORKSPACE_GIB:g} GiB of compile workspace"),
        "fp32": Need("fp32 reference pipeline", round(2 * w + 2 * SDXL_ACTIVATIONS_GIB, 2),
                     "estimated: fp32 weights (footprint) + twice the 16-bit activations estimate"),
    }


def _transfer_needs() -> dict[str, Need]:
    """Notebook 16's parts: one per model, each the model's pipeline compiled at 1024x1024 (estimated: no GPU run of
    FLUX.2 or Qwen-Image yet; their activations are taken as Flux-1-Dev's measured ones, same image tokens)."""
    act, ws = FLUX_ACTIVATIONS_GIB, COMPILE_WORKSPACE_GIB
    basis = (f"estimated: 16-bit weights (footprint) + Flux-1-Dev's measured 1024x1024 activations ({act:g} GiB) + "
             f"{ws:g} GiB of compile workspace")
    return {
        "flux-dev": dataclasses.replace(_flux_needs()["compiled"], part="flux-dev"),
        "qwen-image": Need("qwen-image", round(_w("qwen-image") + act + ws, 2), basis),
        "flux2-dev": Need("flux2-dev", round(_w("flux2-dev", "transformer", "vae") + act + ws, 2),
                          basis + "; the DiT and VAE only: the 24B text encoder is left out and the DiT fed random "
                          "prompt embeddings (pipelines.TEXT_ENCODER_LEFT_OUT)"),
    }


TRANSFER_NOTEBOOK = "16_does_it_transfer"
TRANSFER_MODELS: tuple[str, ...] = ("flux-dev", "qwen-image", "flux2-dev")  # MODEL="all": each a part, smallest first

# Which parts each notebook runs on the full profile, the central one first: the least memory that still shows the
# lesson (08: an offload that fits the smallest card; 09: NF4 with offload); a part not listed is not run there. 11 reads
# rows only. 16's parts are its models (MODEL="all": all three, Flux-1-Dev's the central one; or the one MODEL names).
PARTS: dict[str, tuple[str, ...]] = {
    "00_setup_and_baseline": ("eager",),
    "01_dtype": ("fp32", "eager"),
    "02_attention_sdpa": ("eager", "fp32"),  # fp32: Going deeper's SDPA gain in fp32 converts the whole pipeline
    "03_torch_compile": ("compiled", "eager"),
    "04_regional_compilation": ("compiled", "eager"),
    "05_dynamic_shapes": ("compiled",),
    "06_graph_breaks": ("compiled",),
    "07_scheduler_syncs": ("compiled",),
    "08_cpu_offload": ("group offload", "model offload", "sequential offload", "eager"),
    "09_nf4_quantization": ("nf4 offload", "nf4", "eager"),
    "10_lora_hotswap": ("compiled",),
    "11_reproduction_report": (),
    "12_maximum_speed": ("compiled", "fused-qkv", "aoti", "eager"),  # 12 skips a lever whose part does not fit
    "13_beyond_one_gpu": ("compiled",),
    "14_caching_attention_steps": ("compiled", "fused-qkv", "eager"),
    # 15 with random weights builds bf16 Flux whole (load()'s NF4 and offload need a checkpoint): the compiled need;
    # its fast() fuses QKV only where the copy fits (the same rule: tests/test_nb15_the_recipe.py)
    "15_the_recipe": ("compiled", "fused-qkv"),
    TRANSFER_NOTEBOOK: TRANSFER_MODELS,
}
# What fits instead, named in a refusal: by model, the notebook or setting with the smallest need.
INSTEAD: dict[str, str] = {
    "flux-dev": ("MODEL='sdxl' (about 10 GiB), notebook 08 (model CPU offload: 22.7 GiB) or notebook 09 (NF4: "
                 "15.0 GiB; NF4 + offload: 12.2 GiB, compile included)"),
    "sdxl": "a GPU with more memory, or the smoke profile (PROFILE='smoke')",
    "all": "the smoke profile (PROFILE='smoke'); each model's need is in helpers.fit._transfer_needs",
    "qwen-image": "MODEL='flux-dev' (about 36 GiB), or the smoke profile (PROFILE='smoke')",
    "flux2-dev": "MODEL='qwen-image' (about 58 GiB) or MODEL='flux-dev' (about 36 GiB), or the smoke profile",
}


def needs(notebook: str, model: str) -> list[Need]:
    """The full-profile parts of a notebook for a model, the central one first (its lesson). Notebook 16's parts are
    models: all three for MODEL='all', else the one named."""
    if notebook == TRANSFER_NOTEBOOK:
        table = _transfer_needs()
        parts = [p for p in PARTS[notebook] if model in ("all", p)]
        return [dataclasses.replace(table[p], central=(i == 0), key=p) for i, p in enumerate(parts)]
    table = _flux_needs() if model == "flux-dev" else _sdxl_needs() if model == "sdxl" else {}
    parts = [p for p in PARTS.get(notebook, ()) if p in table]
    return [dataclasses.replace(table[p], central=(i == 0), key=p) for i, p in enumerate(parts)]


@dataclass(frozen=True)
class Decision:
    """What a notebook does on a GPU of usable_gib for its full profile: run, and which parts skip and why.

    skipped is keyed by PARTS keys (the notebooks' names: "eager", "model offload"); names maps each key of a part
    with a need to the README table's name ("eager pipeline")."""

    notebook: str
    model: str
    usable_gib: float
    runs: bool
    reason: str
    skipped: dict[str, str]
    names: dict[str, str] = dataclasses.field(default_factory=dict)

    def part(self, part: str) -> str:
        """'' when the part fits, else the skip reason ('needs N GiB, this GPU has M GiB; ...'). part is a PARTS key
        or the README's name for it; any other name is an error (a typo must not read as 'fits')."""
        allowed = (*PARTS.get(self.notebook, ()), *self.names.values())
        if part not in allowed:
            raise ValueError(f"part={part!r} is not a part of {self.notebook}; one of: "
                             f"{', '.join(repr(p) for p in dict.fromkeys(allowed))}")
        return self.skipped.get({name: key for key, name in self.names.items()}.get(part, part), "")


def usable_gib(total_gib: float, cap_gib: float | None = None) -> float:
    """GiB a run may allocate: the card (or the cap standing for a smaller card) less the CUDA context and a margin
    for the allocator's fragmentation."""
    return round((cap_gib if cap_gib is not None else total_gib) - CONTEXT_GIB - MARGIN_GIB, 2)


def decide(notebook: str, model: str, gpu_gib: float, cap_gib: float | None = None,
           dtype_name: str = "bf16") -> Decision:
    """Whether a notebook's full profile fits a GPU of gpu_gib (or a cap), part by part, before anything is built.

    A part fits when its peak is below the usable memory (the card less the CUDA context and MARGIN_GIB); in fp32,
    every 16-bit figure counts twice (estimated)."""
    usable = usable_gib(gpu_gib, cap_gib)
    card = f"{cap_gib:g} GiB (GPU_MEMORY_GIB)" if cap_gib is not None else f"{gpu_gib:.0f} GiB"
    parts = needs(notebook, model)
    if dtype_name == "fp32":
        parts = [n if n.part.startswith("fp32") else
                 dataclasses.replace(n, gib=round(2 * n.gib, 2), basis=f"estimated: twice the 16-bit figure ({n.basis})")
                 for n in parts]
    skipped = {n.key: f"needs {n.gib:.1f} GiB ({n.basis}), this GPU has {usable:.1f} GiB usable of {card}"
               for n in parts if not n.gib < usable}
    names = {n.key: n.part for n in parts}
    central = parts[0] if parts else None
    if central is None or central.key not in skipped:
        return Decision(notebook, model, usable, True, f"the full profile fits {card}", skipped, names)
    why = f"its lesson ({central.part}) {skipped[central.key]}; fits instead: {INSTEAD.get(model, '')}"
    return Decision(notebook, model, usable, False, why, skipped, names)


# The notebooks that offer MODEL="sdxl" (the others teach on Flux-1-Dev only)
SDXL_NOTEBOOKS = {"00_setup_and_baseline", "01_dtype", "02_attention_sdpa", "03_torch_compile", "08_cpu_offload",
                  "12_maximum_speed"}


# Notebooks whose rows the README's generated table leaves out (none: tests/test_fit.py holds README and table() equal)
NOT_IN_README_TABLE: set[str] = set()


def table() -> list[dict[str, str]]:
    """Which notebooks run at full size on each memory class (README 'Which notebooks run on my GPU')."""
    out = []
    for nb in [n for n in PARTS if n not in NOT_IN_README_TABLE]:
        models = TRANSFER_MODELS if nb == TRANSFER_NOTEBOOK else ("flux-dev", "sdxl") if nb in SDXL_NOTEBOOKS else (
            "flux-dev",)  # 16: a row per model it tries
        for model in models:
            ns = needs(nb, model)
            if not ns:
                continue
            row = {"notebook": nb[:2], "model": model, "lesson needs (GiB)": f"{ns[0].gib:.1f}"}
            for gib in MEMORY_CLASSES:
                d = decide(nb, model, gib)
                skips = ", ".join(d.names[k] for k in d.skipped)  # the README shows the descriptive names
                row[f"{gib} GB"] = ("runs, skips " + skips if skips else "runs") if d.runs else "smoke"
            out.append(row)
    return out


def readme_table() -> str:
    """table() as the README's markdown (made by the same code that decides, so the two cannot drift)."""
    rows = table()
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    return "\n".join(lines)


README_REGION = "gpu-fit"


def write_readme(readme: Path) -> bool:
    """Rewrite the README's generated 'Which notebooks run on my GPU' table; True when it changed."""
    return readme_region.write(readme, readme_table(), readme_region.markers(README_REGION))


if __name__ == "__main__":  # python -m helpers.fit: regenerate the README's table
    from helpers import paths

    print("README.md", "rewritten" if write_readme(paths.ROOT / "README.md") else "unchanged")


class Guard:
    """What `guard` saw: whether the part ran out of memory, and the row it recorded then."""

    def __init__(self) -> None:
        self.oom = False
        self.row: Any = None


@contextlib.contextmanager
def guard(writer: Any, scenario: str, **fields: Any) -> Iterator[Guard]:
    """Run a part of a notebook; when it runs out of GPU memory (past the card, or past GPU_MEMORY_GIB), record an
    'oom' row with what it tried to allocate and the part's own peak, free the cache, and carry on: never a crash."""
    seen = Guard()
    if torch.cuda.is_available():  # the oom row's peak is this part's, not an earlier part's
        torch.cuda.reset_peak_memory_stats()
    try:
        yield seen
    except torch.OutOfMemoryError as err:
        seen.oom = True
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        cap = getattr(writer.run, "gpu_memory_gib", None)
        seen.row = writer.record(scenario, status="oom", reason=f"out of memory{f' under a {cap:g} GiB cap' if cap else ''}: "
                                 f"{first[:300]}", peak_memory_bytes=peak,
                                 memory_kind="cuda_max_allocated" if peak is not None else None, **fields)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
