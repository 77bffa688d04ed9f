"""LoRA adapters for hot-swapping: make seeded random ones in diffusers' format (scaled, if asked, until their
output is measurably apart from given outputs), check a file before a swap, load one the ordinary way for a
reference output.

Adapters are written with the pipeline class's own `save_lora_weights` (a `pytorch_lora_weights.safetensors`
file plus the peft `LoraConfig` as metadata), in the key layout peft's `get_peft_model_state_dict` produces:
`<module>.lora_A.weight` (rank x in) and `<module>.lora_B.weight` (out x rank). Nothing here times anything.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from peft import LoraConfig
from tqdm.auto import tqdm

from helpers import params, text

# The attention projections of Flux's double-stream and single-stream blocks (image stream and output).
ATTENTION_PROJECTIONS: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
WEIGHT_FILE = "pytorch_lora_weights.safetensors"
_KEY = re.compile(r"^(?:transformer\.)?(?P<layer>.+)\.lora_(?P<ab>[AB])\.(?:[\w-]+\.)?weight$")


class _DropTextEncoderNotice(logging.Filter):
    """Drop diffusers' notice that an adapter has no keys for the CLIP text encoder (ours target the transformer)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the 'No LoRA keys associated to CLIPTextModel' notice, True for everything else."""
        return not str(record.msg).startswith("No LoRA keys associated to CLIPTextModel")


logging.getLogger("diffusers.loaders.lora_base").addFilter(_DropTextEncoderNotice())


def target_layers(module: torch.nn.Module, suffixes: Iterable[str] = ATTENTION_PROJECTIONS) -> list[str]:
    """Names of the nn.Linear layers of module whose name ends with one of suffixes (the LoRA targets)."""
    ends = tuple("." + s for s in suffixes)
    return [name for name, m in module.named_modules()
            if isinstance(m, torch.nn.Linear) and name.endswith(ends) and ".lora_" not in name
            and not name.endswith(".base_layer")]


# One lora_alpha for every adapter, as trained adapters often share one: adapters of different ranks then have
# different scalings alpha / r, which a hot-swap must write into the compiled model without recompiling.
LORA_ALPHA: int = 16  # peft types lora_alpha as an int


def scaling(rank: int, alpha: float = LORA_ALPHA) -> float:
    """The factor peft multiplies B @ A by: lora_alpha / r."""
    return alpha / rank


@torch.no_grad()
def random_lora_state_dict(module: torch.nn.Module, layers: Iterable[str], rank: int, *, seed: int,
                           strength: float = 0.5, alpha: float = LORA_ALPHA) -> dict[str, torch.Tensor]:
    """Seeded LoRA weights for the named Linear layers; scaling(rank, alpha) x B @ A is about strength x the layer's scale."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in layers:
        layer = module.get_submodule(name)
        layer = getattr(layer, "base_layer", layer)
        d_out, d_in = layer.weight.shape
        a = torch.randn(rank, d_in, generator=gen) * d_in**-0.5
        b = torch.randn(d_out, rank, generator=gen) * (strength * (rank * d_in) ** -0.5 / scaling(rank, alpha))
        out[f"{name}.lora_A.weight"] = a.to(layer.weight.dtype)
        out[f"{name}.lora_B.weight"] = b.to(layer.weight.dtype)
    return out


def lora_config(layers: Iterable[str], rank: int, alpha: float = LORA_ALPHA) -> LoraConfig:
    """The peft LoraConfig of an adapter on exactly these layers, with lora_alpha = alpha (scaling alpha / rank)."""
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(layers), init_lora_weights=False)


def save_adapter(pipeline_class: Any, folder: Path, state_dict: dict[str, torch.Tensor], rank: int,
                 alpha: float = LORA_ALPHA) -> Path:
    """Write an adapter with the pipeline class's save_lora_weights (safetensors + LoraConfig metadata)."""
    layers = sorted(layer_ranks(state_dict))
    config = lora_config(layers, rank, alpha).to_dict()
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    pipeline_class.save_lora_weights(Path(folder), transformer_lora_layers=state_dict,
                                     transformer_lora_adapter_metadata=config)
    return Path(folder)


def make_adapter(pipe: Any, folder: Path, rank: int, *, seed: int, layers: Iterable[str] | None = None,
                 strength: float = 0.5) -> Path:
    """Make and save a seeded random adapter of the given rank for pipe.transformer (default: attention layers)."""
    net = pipe.transformer
    chosen = list(layers) if layers is not None else target_layers(net)
    sd = random_lora_state_dict(net, chosen, rank, seed=seed, strength=strength)
    return save_adapter(type(pipe), folder, sd, rank)


def layer_ranks(state_dict: Mapping[str, torch.Tensor | Sequence[int]]) -> dict[str, int]:
    """Layer name -> LoRA rank for tensors (or their shapes) in peft/diffusers layout ('transformer.' optional)."""
    ranks: dict[str, int] = {}
    for key, value in state_dict.items():
        m = _KEY.match(key)
        if m and m["ab"] == "A":
            shape = value.shape if isinstance(value, torch.Tensor) else value
            ranks[m["layer"]] = int(shape[0])
    return ranks


def _weight_file(folder: Path) -> Path:
    """The safetensors file of an adapter folder (or the file itself); FileNotFoundError if there is none."""
    path = Path(folder)
    path = path / WEIGHT_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no LoRA weights at {path}")
    return path


def read_adapter(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of an adapter folder (or a .safetensors file) written by save_lora_weights."""
    return safetensors.torch.load_file(str(_weight_file(folder)))


def adapter_shapes(folder: Path) -> dict[str, list[int]]:
    """Key -> shape of every tensor of an adapter, read from the safetensors header only (no tensor is loaded)."""
    with safetensors.safe_open(str(_weight_file(folder)), framework="pt") as f:
        return {key: list(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118 (safe_open is not iterable)


def loaded_layers(module: torch.nn.Module, adapter_name: str) -> list[str]:
    """Names of the layers of module that carry the LoRA adapter adapter_name."""
    return [name for name, m in module.named_modules()
            if hasattr(m, "lora_A") and adapter_name in getattr(m, "lora_A", {})]


def check_hotswap(folder: Path, module: torch.nn.Module, adapter_name: str, target_rank: int) -> dict[str, int]:
    """Raise ValueError (naming the file, the layer and the limit) unless folder can be hot-swapped into adapter_name.

    Reads only the file's header (names and shapes), so it costs a small fraction of the swap it guards."""
    path = Path(folder)
    ranks = layer_ranks(adapter_shapes(path))
    if not ranks:
        raise ValueError(f"{path}: no LoRA layers (keys '<layer>.lora_A.weight') found")
    allowed = set(loaded_layers(module, adapter_name))
    if not allowed:
        raise ValueError(f"{path}: adapter {adapter_name!r} is not loaded, so there is nothing to hot-swap into; "
                         "load the first adapter with load_lora_weights(..., adapter_name=...) first")
    too_big = {k: r for k, r in ranks.items() if r > target_rank}
    if too_big:
        layer, rank = next(iter(sorted(too_big.items())))
        raise ValueError(f"{path}: layer {layer!r} has LoRA rank {rank}, above target_rank={target_rank} declared "
                         f"with enable_lora_hotswap ({text.count(len(too_big), 'layer')} too big); hot-swap allows ranks "
                         f"<= {target_rank}")
    extra = sorted(set(ranks) - allowed)
    if extra:
        shown = ", ".join(sorted(allowed)[:4]) + (", ..." if len(allowed) > 4 else "")
        raise ValueError(f"{path}: layer {extra[0]!r} ({text.count(len(extra), 'layer')} in all) is not a target of the "
                         f"loaded adapter {adapter_name!r}; hot-swap allows only its {len(allowed)} target layers "
                         f"({shown}) or a subset")
    return ranks


@contextlib.contextmanager
def ordinary_load(pipe: Any, folder: Path, adapter_name: str) -> Iterator[None]:
    """Inside the block, the adapter is loaded the ordinary way (no hot-swap); on exit every LoRA is unloaded.

    For a reference output per adapter that shares nothing with the hot-swap path; one adapter at a time keeps
    memory bounded. Use it before `enable_lora_hotswap` and before compiling: unloading restores the base layers.
    """
    pipe.load_lora_weights(str(folder), adapter_name=adapter_name)
    try:
        yield
    finally:
        pipe.unload_lora_weights()


@dataclass(frozen=True)
class SeparatedAdapter:
    """An adapter made by separated_adapter: its folder, its output, and how far that is from the others."""

    folder: Path
    output: torch.Tensor
    scale: float
    distances: list[float]
    tries: int


def output_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 distance of two outputs, measured against the larger one: ||a - b|| / max(||a||, ||b||)."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / torch.maximum(a.norm(), b.norm()).clamp_min(1e-30))


def scaled_state_dict(state_dict: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The adapter with every lora_B multiplied by scale, so its update B @ A is scale times as large."""
    return {k: (v.float() * scale).to(v.dtype) if ".lora_B." in k else v for k, v in state_dict.items()}


@torch.no_grad()
def separated_adapter(pipe: Any, folder: Path, rank: int, *, seed: int, output: Callable[[], torch.Tensor],
                      apart_from: Sequence[torch.Tensor], gap: float, within: float = 0.5, tries: int = 24,
                      layers: Iterable[str] | None = None) -> SeparatedAdapter:
    """Seeded random adapter, scaled until its measured output is gap to (1 + within) x gap from the nearest of apart_from.

    output() runs the model on fixed inputs; the adapter is saved to folder and loaded the ordinary way for each
    measurement, and unloaded after it. The distance is output_distance (relative L2, against the larger output).
    Raises RuntimeError, with the distances measured, if no scale lands in the band within tries measurements."""
    if gap <= 0 or within <= 0 or not apart_from:
        raise ValueError(f"need gap > 0, within > 0 and outputs to keep apart from; got {gap}, {within}, "
                         f"{len(apart_from)} outputs")
    net = pipe.transformer
    chosen = list(layers) if layers is not None else target_layers(net)
    unit = random_lora_state_dict(net, chosen, rank, seed=seed, strength=1.0)
    target, top = gap * (1 + within / 2), gap * (1 + within)
    lo: tuple[float, float] = (0.0, 0.0)  # (scale, distance) of the largest scale seen below the band
    hi: tuple[float, float] | None = None  # and of the smallest one above it
    scale, seen = 1.0, []
    for n in range(1, tries + 1):
        save_adapter(type(pipe), folder, scaled_state_dict(unit, scale), rank)
        with ordinary_load(pipe, folder, adapter_name=f"separating_{Path(folder).name}"):
            out = output().detach().clone()
        distances = [output_distance(out, other) for other in apart_from]
        d = min(distances)
        seen.append((scale, d))
        if gap <= d <= top:
            return SeparatedAdapter(Path(folder), out, scale, distances, n)
        if d < gap:
            lo = max(lo, (scale, d))
        else:
            hi = (scale, d) if hi is None or scale < hi[0] else hi
        if hi is None or lo[0] == 0:  # one side of the band not seen yet: step as if distance ~ scale
            scale = scale * min(100.0, max(0.01, target / d)) if d > 0 else scale * 100.0
        else:  # both sides seen: interpolate between them, and bisect every third try in case that stalls
            (s0, d0), (s1, d1) = lo, hi
            guess = s0 + (target - d0) * (s1 - s0) / (d1 - d0)
            inside = s0 + 0.05 * (s1 - s0) < guess < s1 - 0.05 * (s1 - s0)
            scale = guess if inside and n % 3 else math.sqrt(s0 * s1)
    shown = ", ".join(f"scale {s:.3g}: {d:.3g}" for s, d in seen[-6:])
    raise RuntimeError(f"{folder}: no scale of the seed-{seed} rank-{rank} adapter puts its output between "
                       f"{gap:.3g} and {top:.3g} from the nearest given output in {tries} tries ({shown})")


# --- what notebook 10 calls: its knobs, its adapters, its bad files ---

def check_knobs(ranks: Any, target_rank: Any, gap: Any) -> tuple[list[int], int]:
    """RANKS, TARGET_RANK and ADAPTER_GAP checked: (the ranks, the target rank), or ParameterError naming the rule."""
    checked = params.check_positive_ints("RANKS", ranks)
    if len(checked) < 3 or len(set(checked)) != len(checked) or any(isinstance(r, bool) for r in checked):
        raise params.ParameterError(f"RANKS={ranks!r} must be at least three distinct positive integers, e.g. [4, 8, 16]")
    target = max(checked) if target_rank is None else target_rank
    if isinstance(target, bool) or not (isinstance(target, int) and target >= max(checked)):
        raise params.ParameterError(f"TARGET_RANK={target_rank!r} must be None or an integer >= max(RANKS) = "
                                    f"{max(checked)}: hot-swap pads every adapter to it and cannot shrink one")
    if isinstance(gap, bool) or not (isinstance(gap, (int, float)) and 8 <= gap <= 16):
        raise params.ParameterError(f"ADAPTER_GAP={gap!r} must be a number from 8 to 16 (parity tolerances), e.g. 10")
    return checked, target


def separated_adapters(pipe: Any, folder: Path, ranks: Sequence[int], *, seed: int, gap: float,
                       output: Callable[[], torch.Tensor], base: torch.Tensor) -> dict[int, SeparatedAdapter]:
    """One separated_adapter per rank (seed + rank), each kept gap apart from base and from the adapters before it."""
    made: dict[int, SeparatedAdapter] = {}
    for r in tqdm(ranks, desc="adapters, scaled apart"):
        made[r] = separated_adapter(pipe, Path(folder) / f"rank{r}", r, seed=seed + r, gap=gap, output=output,
                                    apart_from=[base] + [m.output for m in made.values()])
    return made


def bad_files(pipe: Any, folder: Path, first_rank: int, target_rank: int, *, seed: int) -> dict[str, Path]:
    """Two adapters hot-swap must refuse: one of rank 2 x target_rank, one of the first rank that also targets
    add_k_proj, a layer the attention-projection adapters leave alone."""
    net = pipe.transformer
    return {"rank above target": make_adapter(pipe, Path(folder) / "bad_rank", 2 * target_rank, seed=seed + 1000),
            "untargeted layer": make_adapter(pipe, Path(folder) / "bad_layer", first_rank, seed=seed + 2000,
                                             layers=target_layers(net) + target_layers(net, ("add_k_proj",)))}


def scaled_copy(pipe: Any, folder: Path, dest: Path, factor: float) -> Path:
    """A copy of an adapter with every lora_B multiplied by factor (its update factor times as strong), saved as the
    pipeline class saves one: same layers, same rank, so it can be hot-swapped in where the original can."""
    state = {k.removeprefix("transformer."): v for k, v in read_adapter(folder).items()}
    return save_adapter(type(pipe), dest, scaled_state_dict(state, factor), max(layer_ranks(state).values()))
