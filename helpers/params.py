"""Validate a notebook's parameters and resolve its profile before any heavy work."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from helpers import fit, paths, precision

PROFILES: tuple[str, ...] = ("auto", "smoke", "full")
MODELS: tuple[str, ...] = ("flux-dev", "sdxl")
TRANSFER_ONLY_MODELS: tuple[str, ...] = ("qwen-image", "flux2-dev")  # notebook 16 only: the others refuse them
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# DTYPE="auto": bf16 where the device computes it natively (any CUDA GPU, a CPU with AVX512-BF16 or AMX), else fp32.
# On a CPU without bf16 instructions the bf16 convolutions run a slow fallback that makes the VAE most of a smoke
# image, so a smoke run there would teach the fallback instead of the lever; fp32 keeps the shares of the full run.
DTYPE_CHOICES: tuple[str, ...] = ("auto", *DTYPES)

# Whether a notebook's full profile fits a GPU is decided per notebook, model and part by helpers.fit; this is only
# the rule for a caller that is not a notebook of the collection (make reproduce's opening line).
FULL_PROFILE_MIN_GPU_GIB = 40.0


@dataclass(frozen=True)
class ProfileSettings:
    """Workload of a profile: resolution, steps, text length and how many timed repeats."""

    height: int
    width: int
    steps: int
    guidance: float
    max_sequence_length: int
    warmup: int
    repeats: int


# full: the published setting (1024x1024, 28 steps, guidance 3.5, 512 text tokens).
# smoke: the same code path on tiny models, small enough for a 2-core CPU in CI.
PROFILE_SETTINGS: dict[str, ProfileSettings] = {
    "full": ProfileSettings(1024, 1024, 28, 3.5, 512, warmup=2, repeats=5),
    "smoke": ProfileSettings(128, 128, 2, 3.5, 32, warmup=1, repeats=3),
}


class ParameterError(ValueError):
    """A notebook parameter has a value the notebook cannot run with."""


@dataclass(frozen=True)
class Run:
    """Everything a notebook needs to know about this run, resolved and validated."""

    notebook: str
    profile: str
    profile_reason: str
    model: str
    weights: str
    dtype_name: str
    dtype: torch.dtype
    device: torch.device
    seed: int
    results_dir: Path
    figures_dir: Path
    settings: ProfileSettings
    knobs: dict[str, Any] = field(default_factory=dict)
    dtype_reason: str = ""
    weights_reason: str = ""
    gpu_memory_gib: float | None = None  # GPU_MEMORY_GIB: the cap standing for a smaller card's memory, or None

    @property
    def is_cuda(self) -> bool:
        """True when the run executes on a CUDA GPU."""
        return self.device.type == "cuda"


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return value if it is one of allowed (same type too: 1 is not True), else raise naming the choices."""
    allowed = tuple(allowed)
    if not any(value == a and type(value) is type(a) for a in allowed):
        choices = ", ".join(repr(a) for a in allowed)
        raise ParameterError(f"{name}={value!r} is not allowed; choose one of: {choices}")
    return value


def check_subset(name: str, values: Iterable[Any], allowed: Iterable[Any]) -> list[Any]:
    """Return values as a non-empty list if each is in allowed, else raise naming the bad ones."""
    values, allowed = list(values), tuple(allowed)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        choices = ", ".join(repr(a) for a in allowed)
        what = f"contains {bad!r}" if bad else "is empty"
        raise ParameterError(f"{name} {what}; each entry must be one of: {choices}")
    return values


def check_text(name: str, value: Any) -> str:
    """Return value if it is a non-empty string, else raise a ParameterError naming the parameter."""
    if not isinstance(value, str) or not value.strip():
        raise ParameterError(f"{name}={value!r} is not allowed; use a non-empty string")
    return value


def _is_positive_int(v: Any) -> bool:
    """An int (not a bool) above zero."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def check_positive_ints(name: str, values: Iterable[Any], multiple_of: int = 1) -> list[int]:
    """Return values as a non-empty list of positive ints divisible by multiple_of, else raise."""
    values = list(values)
    if not values or not all(_is_positive_int(v) and v % multiple_of == 0 for v in values):
        also = f" divisible by {multiple_of}" if multiple_of > 1 else ""
        raise ParameterError(f"{name}={values!r} must be a non-empty list of positive integers{also}")
    return values


def check_nonnegative_numbers(name: str, values: Iterable[Any]) -> list[float]:
    """Return values as a non-empty list of numbers >= 0 (ints or floats, not bools), else raise naming the parameter."""
    values = list(values)
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ParameterError(f"{name}={values!r} must be a non-empty list of numbers >= 0, e.g. [0.0, 0.1]")
    return values


def check_positive_int(name: str, value: Any) -> int:
    """Return value if it is a positive int (not a bool), else raise naming the parameter."""
    if not _is_positive_int(value):
        raise ParameterError(f"{name}={value!r} must be a positive integer, e.g. 2")
    return value


WEIGHT_CHOICES = ("'auto' (the smoke profile: the project's trained tiny model where it ships one, else 'random'; the "
                  "full profile: 'random'), 'random' (seeded random weights in the real architecture, from "
                  "data/configs), an existing local folder, or a hub id such as 'black-forest-labs/FLUX.1-dev'")


def trained_smoke_folder(model: str) -> Path:
    """Where the project's trained smoke model of a MODEL ships (it may not exist: then 'auto' means 'random')."""
    return paths.MODELS_DIR / f"{model}-smoke"


def check_weights(weights: str) -> str:
    """Accept 'auto', 'random', an existing local folder (returned resolved), or a hub id of the form org/name."""
    if weights in ("auto", "random"):
        return weights
    if Path(weights).expanduser().is_dir():
        return str(Path(weights).expanduser().resolve())
    looks_like_path = weights.startswith((".", "/", "~")) or weights.count("/") != 1 or "\\" in weights
    if looks_like_path or not re.fullmatch(r"[\w.-]+/[\w.-]+", weights):
        raise ParameterError(f"WEIGHTS={weights!r} is not usable: it is not an existing folder. "
                             f"Allowed: {WEIGHT_CHOICES}")
    return weights


# Notebooks whose lesson is the model's depth: there WEIGHTS='auto' gives seeded random weights at full depth.
AUTO_RANDOM = {"04_regional_compilation": "compile time grows with the blocks, so this notebook builds them at full "
                                          "depth (the trained smoke model has 6 blocks)"}


def resolve_weights(weights: str, model: str, profile: str, notebook: str = "") -> tuple[str, str]:
    """Turn WEIGHTS='auto' into the trained smoke folder (smoke, where one ships) or 'random', and say why."""
    if weights != "auto":
        return weights, f"{weights}: chosen explicitly"
    if notebook in AUTO_RANDOM:
        return "random", f"auto: random, because {AUTO_RANDOM[notebook]}"
    folder = trained_smoke_folder(model)
    if profile == "smoke" and (folder / "model_index.json").is_file():
        return str(folder), f"auto: the project's trained smoke model ({paths.relative(folder)})"
    if model == "all" and profile == "smoke":  # notebook 16's MODEL="all": each model resolves its own
        trained = [m for m in (*MODELS, *TRANSFER_ONLY_MODELS)
                   if (trained_smoke_folder(m) / "model_index.json").is_file()]
        return "random", (f"auto, per model: the project's trained smoke model for {', '.join(trained) or 'none'}, "
                          "random weights for the others")
    why = "the full profile keeps the real architecture with seeded random weights (no download)" \
        if profile == "full" else f"no trained smoke model ships for {model}"
    return "random", f"auto: random, because {why}"


@dataclass(frozen=True)
class Gpu:
    """The CUDA GPU a run would use: its name, memory and whether it computes bf16 natively (compute capability 8+)."""

    name: str
    total_gib: float
    bf16: bool


def _gpu() -> Gpu | None:
    """CUDA device 0, or None without CUDA (tests plant other GPUs here)."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return Gpu(torch.cuda.get_device_name(0), props.total_memory / 2**30, props.major >= 8)


def _cuda_memory_gib() -> float:
    """Total memory of CUDA device 0 in GiB, or 0 without CUDA."""
    gpu = _gpu()
    return gpu.total_gib if gpu else 0.0


def _resolve_profile(profile: str, notebook: str = "", model: str = "flux-dev", dtype_name: str = "bf16",
                     cap_gib: float | None = None) -> tuple[str, str]:
    """Turn PROFILE into smoke/full and say why: full only where the notebook's lesson fits this GPU's memory (or
    the cap, GPU_MEMORY_GIB), decided by helpers.fit before anything is built."""
    gpu = _gpu()
    if gpu is None:
        if profile == "full":
            raise ParameterError("PROFILE='full' needs a CUDA GPU; here: no CUDA GPU. Use PROFILE='smoke' or 'auto'")
        return ("smoke", "auto: no CUDA GPU is visible; the full profile needs one") if profile == "auto" \
            else (profile, f"{profile}: chosen explicitly")
    if profile == "smoke":
        return "smoke", "smoke: chosen explicitly"
    if notebook not in fit.PARTS:  # not a notebook of the collection (make reproduce's own check, a test)
        big = (cap_gib or gpu.total_gib) >= FULL_PROFILE_MIN_GPU_GIB
        if profile == "full" and not big:
            raise ParameterError(f"PROFILE='full' needs >= {FULL_PROFILE_MIN_GPU_GIB:.0f} GiB; here: {gpu.name}. "
                                 f"Use PROFILE='smoke' or 'auto'")
        return ("full" if big else "smoke"), f"{profile}: {gpu.name} with {cap_gib or gpu.total_gib:.0f} GiB"
    decision = fit.decide(notebook, model, gpu.total_gib, cap_gib, dtype_name)
    if profile == "full" and not decision.runs:
        raise ParameterError(f"PROFILE='full' on {gpu.name}: {decision.reason}. Or use PROFILE='smoke' or 'auto'")
    if profile == "full":
        return "full", f"full: chosen explicitly; {decision.reason}"
    if decision.runs:
        return "full", f"auto: full on {gpu.name}, because {decision.reason}"
    return "smoke", f"auto: smoke on {gpu.name}, because {decision.reason}"


def resolve_dtype(dtype: str, device: torch.device, model: str = "flux-dev") -> tuple[str, str]:
    """Turn DTYPE into bf16/fp16/fp32 and say why ('auto': bf16 where native on device; on a GPU without native bf16,
    fp16 for SDXL and fp32 for Flux-1-Dev; on a CPU without it, fp32)."""
    if dtype != "auto":
        return dtype, f"{dtype}: chosen explicitly"
    gpu = _gpu() if device.type == "cuda" else None
    if gpu is not None and not gpu.bf16:
        if model == "sdxl":
            return "fp16", (f"auto: fp16, because {gpu.name} has no native bf16 (compute capability below 8.0); SDXL "
                            f"runs in fp16 with its VAE kept in fp32 or the fp16-fixed VAE (notebook 01)")
        return "fp32", (f"auto: fp32, because {gpu.name} has no native bf16 (compute capability below 8.0) and "
                        f"Flux-1-Dev's T5-XXL overflows fp16 (diffusers keeps T5's `wo` in fp32 for it, notebook "
                        f"01); fp16 would draw NaN. MODEL='sdxl' runs in fp16 here")
    not_native = precision.native_half_reason(device, "bf16")
    if not not_native:
        return "bf16", f"auto: bf16, which {device.type.upper()} computes natively here"
    return "fp32", (f"auto: fp32, because {not_native}; in bf16 that fallback would dominate the run "
                    f"(set DTYPE='bf16' to see it)")


def resolve(
    notebook: str,
    *,
    PROFILE: str = "auto",
    MODEL: str = "flux-dev",
    WEIGHTS: str = "random",
    DTYPE: str = "auto",
    SEED: int = 0,
    RESULTS_DIR: str = "",
    FIGURES_DIR: str = "",
    REPEATS: int | None = None,
    WARMUP: int | None = None,
    GPU_MEMORY_GIB: float | None = None,
    models: Iterable[str] = MODELS,
    **knobs: Any,
) -> Run:
    """Validate the common parameters of a notebook and return the resolved Run.

    REPEATS / WARMUP (None: the profile's) shorten a measurement where a GPU slot needs it; every timed row records
    its warm-up and its samples, so a reduced setting is visible in the results. GPU_MEMORY_GIB (None: all of the
    GPU) caps the CUDA allocator so the GPU stands for a card of that memory (helpers.fit)."""
    check_choice("PROFILE", PROFILE, PROFILES)
    if MODEL in TRANSFER_ONLY_MODELS and MODEL not in tuple(models):
        raise ParameterError(f"MODEL={MODEL!r} is not taught in {notebook}, whose lesson runs on "
                             f"{', '.join(repr(m) for m in models)}; notebook 16_does_it_transfer tries every lever of "
                             f"the collection on {MODEL}")
    check_choice("MODEL", MODEL, tuple(models))
    check_choice("DTYPE", DTYPE, DTYPE_CHOICES)
    if not isinstance(SEED, int):
        raise ParameterError(f"SEED={SEED!r} must be an integer")
    weights = check_weights(str(WEIGHTS))
    if "PROMPT" in knobs:
        check_text("PROMPT", knobs["PROMPT"])
    if REPEATS is not None:
        check_positive_int("REPEATS", REPEATS)
    if WARMUP is not None and not (isinstance(WARMUP, int) and not isinstance(WARMUP, bool) and WARMUP >= 0):
        raise ParameterError(f"WARMUP={WARMUP!r} must be None or an integer >= 0, e.g. 1")
    try:
        cap = fit.check_cap(GPU_MEMORY_GIB, _cuda_memory_gib())
    except fit.CapError as err:
        raise ParameterError(str(err)) from None
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dtype_name, dtype_reason = resolve_dtype(DTYPE, device, MODEL)
    profile, reason = _resolve_profile(PROFILE, notebook, MODEL, dtype_name, cap)
    weights, weights_reason = resolve_weights(weights, MODEL, profile, notebook)
    settings = PROFILE_SETTINGS[profile]
    settings = replace(settings, repeats=REPEATS or settings.repeats,
                       warmup=settings.warmup if WARMUP is None else WARMUP)
    return Run(
        notebook=notebook,
        profile=profile,
        profile_reason=reason,
        model=MODEL,
        weights=weights,
        dtype_name=dtype_name,
        dtype=DTYPES[dtype_name],
        device=device,
        seed=SEED,
        results_dir=Path(RESULTS_DIR).expanduser().resolve() if RESULTS_DIR else paths.RESULTS_DIR,
        figures_dir=Path(FIGURES_DIR).expanduser().resolve() if FIGURES_DIR else paths.FIGURES_DIR,
        settings=settings,
        knobs=dict(knobs),
        dtype_reason=dtype_reason,
        weights_reason=weights_reason,
        gpu_memory_gib=cap,
    )
