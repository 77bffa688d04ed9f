"""Weight memory of the full-size models, counted on PyTorch's meta device: per component, per format, per scenario.

Nothing here allocates real weights or measures anything: components are built from `data/configs/` on the
`meta` device (shapes and dtypes only), and the bytes are numel x element size. NF4 sizes follow the layout
bitsandbytes gives the project's `quantize.nf4_config` (no double quantization, blocks of 64): per converted
`nn.Linear`, half a byte per weight, one fp32 absmax per block of 64 and a 16-entry fp32 code book; its bias
and every other tensor stay as stored. Which layers the libraries convert mirrors their own rules (diffusers:
all but `_keep_in_fp32_modules`; transformers: also tied and output embeddings), checked against real
quantized smoke models in `tests/test_full_profile_dryrun.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import transformers

from helpers import pipelines, precision

GIB = 2**30
# GPU memory of the H100 the full profile is planned on (an 80 GB card; the project's GPU machines report ~78 GiB).
H100_GIB = 78.0
# What a full scenario must leave free beside its weights, for activations, the allocator and compile workspace.
MIN_FREE_GIB = 10.0
NF4_BLOCKSIZE = 64  # bitsandbytes' default 4-bit block; nf4_config sets no other
NF4_CODE_BOOK_BYTES = 16 * 4  # each Linear4bit's quant_state holds its own 16-entry fp32 NF4 code book


@dataclass(frozen=True)
class Scenario:
    """A set of weights a full-profile run holds on the GPU at once, and the notebooks that hold it."""

    name: str
    notebooks: str
    weight_bytes: int

    @property
    def weight_gib(self) -> float:
        """The weights in GiB."""
        return self.weight_bytes / GIB


def meta_components(model: str = "flux-dev", profile: str = "full",
                    dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.nn.Module]:
    """Every model component of a pipeline, built from data/configs on the meta device in dtype: no memory."""
    return pipelines._build_models(model, profile, torch.device("meta"), dtype)


def parameter_counts(components: dict[str, torch.nn.Module]) -> dict[str, int]:
    """Parameters of each component, each shared tensor counted once (T5's tied embedding)."""
    return {name: sum(p.numel() for p in module.parameters()) for name, module in components.items()}


def stored_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers as stored (numel x element size), each tensor counted once."""
    seen: set[int] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def component_bytes(components: dict[str, torch.nn.Module], dtype: torch.dtype) -> dict[str, int]:
    """Stored bytes of each component after casting its floating-point tensors to dtype (in place; meta: free)."""
    out = {}
    for name, module in components.items():
        if any(not t.is_meta for t in [*module.parameters(), *module.buffers()]):
            raise ValueError(f"{name} holds real tensors; component_bytes casts in place and is for meta models")
        precision.cast_module(module, dtype)
        out[name] = stored_bytes(module)
    return out


def model_weight_bytes(model: str, dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Stored bytes of each component of a model's full-size pipeline in dtype (any of pipelines.MODELS: Flux-1-Dev,
    SDXL, FLUX.2 [dev], Qwen-Image), counted on the meta device: no memory is allocated."""
    return component_bytes(meta_components(model, "full", dtype), dtype)


def nf4_kept_linears(module: torch.nn.Module) -> list[str]:
    """Names of the nn.Linear layers the owning library's bitsandbytes quantizer leaves out of 4-bit."""
    # transformers 5: skips get_keys_to_not_convert (tied/output embeddings, last module) and the class's
    # _keep_in_fp32_modules (T5: the feed-forward `wo`), matched by its should_convert_module, and converts only
    # layers whose type is exactly nn.Linear. diffusers 0.42: skips _keep_in_fp32_modules only (none for Flux),
    # matched as `key == name or key + "." in name`.
    linears = {n: m for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    if isinstance(module, transformers.PreTrainedModel):
        from transformers.quantizers.base import get_keys_to_not_convert
        from transformers.quantizers.quantizers_utils import should_convert_module

        patterns = list({*get_keys_to_not_convert(module), *(module._keep_in_fp32_modules or [])})
        return [n for n, m in linears.items()
                if type(m) is not torch.nn.Linear or not should_convert_module(n, patterns)]
    keys = list(getattr(module, "_keep_in_fp32_modules", None) or [])
    return [n for n in linears if any(k == n or f"{k}." in n for k in keys)]


def nf4_bytes(module: torch.nn.Module, kept: list[str] | None = None) -> dict[str, int]:
    """Bytes, by part, a module in its compute dtype would hold with its nn.Linear weights (all but kept) in NF4."""
    # Per converted layer of n weights: ceil(n / 2) bytes of packed 4-bit codes, 4 * ceil(n / 64) bytes of fp32
    # absmax scales and a 64-byte code book; its bias keeps its dtype. kept defaults to nf4_kept_linears(module).
    kept_set = set(nf4_kept_linears(module) if kept is None else kept)
    converted = {id(m.weight): m.weight.numel() for n, m in module.named_modules()
                 if isinstance(m, torch.nn.Linear) and n not in kept_set}
    packed = sum((n + 1) // 2 for n in converted.values())
    scales = sum(4 * math.ceil(n / NF4_BLOCKSIZE) for n in converted.values())
    codes = NF4_CODE_BOOK_BYTES * len(converted)
    seen: set[int] = set()
    other = 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen and id(t) not in converted:
            seen.add(id(t))
            other += t.numel() * t.element_size()
    return {"nf4_layers": len(converted), "kept_layers": len(kept_set), "packed_bytes": packed,
            "scale_bytes": scales, "code_book_bytes": codes, "other_bytes": other,
            "total_bytes": packed + scales + codes + other}


def flux_sequence_lengths(vae_config: dict, transformer_config: dict, height: int, width: int,
                          max_sequence_length: int) -> tuple[int, int]:
    """(image tokens, text tokens) the Flux DiT reads at height x width, from the configs as FluxPipeline packs them."""
    # The VAE downsamples by 2 ** (len(block_out_channels) - 1); the pipeline packs 2x2 latent patches into one
    # token of 4 * latent_channels features (which must be the DiT's in_channels); the DiT patchifies no further
    # when patch_size is 1. T5 is padded to max_sequence_length tokens.
    vae_scale = 2 ** (len(vae_config["block_out_channels"]) - 1)
    packed = 4 * vae_config["latent_channels"]
    patch = transformer_config.get("patch_size", 1)
    if transformer_config["in_channels"] != packed * patch**2:
        raise ValueError(f"the DiT reads {transformer_config['in_channels']} features per token, but 2x2-packed "
                         f"latents of {vae_config['latent_channels']} channels give {packed * patch**2}")
    side = 2 * vae_scale * patch
    if height % side or width % side:
        raise ValueError(f"{height}x{width} is not a multiple of {side} (VAE x{vae_scale}, 2x2 packing, patch {patch})")
    return (height // side) * (width // side), max_sequence_length


def full_scenarios(bf16: dict[str, int], fp32: dict[str, int], nf4: dict[str, int],
                   quantized: tuple[str, ...] = ("transformer", "text_encoder_2")) -> list[Scenario]:
    """The sets of weights the notebooks' full-profile runs hold on the GPU at once, from per-component bytes."""
    # bf16 / fp32: bytes per component in that dtype; nf4: bytes of the quantized components in NF4. Model CPU
    # offload holds one component at a time (accelerate offloads the previous one before moving the next in).
    mixed = {name: nf4[name] if name in quantized else b for name, b in bf16.items()}
    return [
        Scenario("bf16 pipeline resident", "00, 02-07, 08 (no-offload reference), 09 (bf16 reference), 10",
                 sum(bf16.values())),
        Scenario("fp32 pipeline resident (master copy on the CPU)", "01", sum(fp32.values())),
        Scenario("bf16 pipeline + NF4 DiT and T5 loaded beside it", "09 (section 2)",
                 sum(bf16.values()) + sum(nf4[name] for name in quantized)),
        Scenario("NF4 DiT + NF4 T5, bf16 CLIP + VAE", "09 (sections 3-4)", sum(mixed.values())),
        Scenario("bf16 model CPU offload (largest component)", "08", max(bf16.values())),
        Scenario("NF4 + model CPU offload (largest component)", "09 (section 5)", max(mixed.values())),
    ]


def check_fits(name: str, weight_bytes: int, gpu_gib: float = H100_GIB, min_free_gib: float = MIN_FREE_GIB) -> float:
    """GiB left free on a gpu_gib card beside weight_bytes of weights; raise if that is under min_free_gib."""
    free = gpu_gib - weight_bytes / GIB
    if free < min_free_gib:
        raise ValueError(f"{name}: {weight_bytes / GIB:.2f} GiB of weights leave {free:.2f} GiB free on a "
                         f"{gpu_gib:g} GiB GPU; at least {min_free_gib:g} GiB must stay free")
    return free


def check_band(name: str, value: float, low: float, high: float) -> float:
    """Return value if low <= value <= high, else raise naming the band."""
    if not low <= value <= high:
        raise ValueError(f"{name} = {value:,.0f} is outside [{low:,.0f}, {high:,.0f}]")
    return value
