"""Count what a step cache skipped: every call of a denoiser's blocks, and whether the block's own code ran.

diffusers' caches (`transformer.enable_cache(...)`) replace a block's or an attention layer's `forward` with a hook
that either runs the original forward or returns a cached (or predicted) output. The hooked module is still called
once per step either way, so counting calls says nothing; what tells a computation from a skip is whether the
module's own code ran, and that code always calls the module's children (norms, projections, the attention layer).
`count_computations` puts PyTorch forward hooks on the blocks and on their children and counts, per call, whether
any child ran: counted, not inferred from the cache's settings. The hooks are plain Python and belong to eager runs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

# The ModuleLists diffusers' block caches walk (hooks/_common.py: _ALL_TRANSFORMER_BLOCK_IDENTIFIERS), in Flux's order.
BLOCK_LISTS: tuple[str, ...] = ("transformer_blocks", "single_transformer_blocks", "blocks", "layers")
# Attention layers of those blocks, as diffusers' attention caches (TaylorSeer, FasterCache, PAB) name them.
ATTENTION_PATTERN = re.compile(r"^(transformer_blocks|single_transformer_blocks|blocks|layers)\.\d+\.attn$")
UNITS: tuple[str, ...] = ("block", "attention")


@dataclass
class Counts:
    """Per counted module (by name): one entry per call, True where its own code ran, False where it was skipped."""

    unit: str
    history: dict[str, list[bool]] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        """Calls of the counted modules (computed or skipped)."""
        return sum(len(h) for h in self.history.values())

    @property
    def computed(self) -> int:
        """Calls in which the module's own code ran."""
        return sum(sum(h) for h in self.history.values())

    @property
    def skipped(self) -> int:
        """Calls answered from the cache without running the module's own code."""
        return self.calls - self.computed

    @property
    def skipped_share(self) -> float:
        """Skipped calls over all calls (0.0 when nothing was called)."""
        return self.skipped / self.calls if self.calls else 0.0

    def pattern(self, name: str | None = None) -> str:
        """One module's calls as a string, 'C' computed and 's' skipped (default: the last module, e.g. 'CCsCsC')."""
        key = name if name is not None else list(self.history)[-1]
        return "".join("C" if ran else "s" for ran in self.history[key])

    def summary(self) -> dict[str, Any]:
        """The counts as a row keeps them."""
        return {"unit": self.unit, "calls": self.calls, "computed": self.computed, "skipped": self.skipped,
                "skipped_share": self.skipped_share, "modules": len(self.history)}


def counted_modules(model: torch.nn.Module, unit: str) -> dict[str, torch.nn.Module]:
    """The modules counted for a unit: 'block' (each entry of the block lists) or 'attention' (each block's attn)."""
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r}; allowed: {UNITS}")
    if unit == "attention":
        return {name: m for name, m in model.named_modules() if ATTENTION_PATTERN.match(name)}
    return {f"{lst}.{i}": block for lst in BLOCK_LISTS if isinstance(getattr(model, lst, None), torch.nn.ModuleList)
            for i, block in enumerate(getattr(model, lst))}


@contextlib.contextmanager
def count_computations(model: torch.nn.Module, unit: str = "block") -> Iterator[Counts]:
    """Inside the block, record for every call of model's blocks (or attention layers) whether its own code ran."""
    counts = Counts(unit)
    modules = counted_modules(model, unit)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no {unit} modules to count")
    handles = []
    for name, module in modules.items():
        counts.history[name] = []
        ran = [False]

        def before(_m: torch.nn.Module, _args: Any, ran: list[bool] = ran) -> None:
            ran[0] = False

        def child_ran(_m: torch.nn.Module, _args: Any, ran: list[bool] = ran) -> None:
            ran[0] = True

        def after(_m: torch.nn.Module, _args: Any, _out: Any, ran: list[bool] = ran,
                  history: list[bool] = counts.history[name]) -> None:
            history.append(ran[0])

        handles.append(module.register_forward_pre_hook(before))
        handles.append(module.register_forward_hook(after))
        handles += [child.register_forward_pre_hook(child_ran) for child in module.children()]
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def skip_problem(setting: float, counts: Counts, *, off: bool) -> str:
    """What is wrong with a cache's counts at one setting ('' when nothing is): at its 'off' setting (a threshold of
    0) nothing may be skipped; at the sweep's most aggressive setting something must be, or the cache did nothing."""
    if counts.calls == 0:
        return f"at {setting:g}: no {counts.unit} was called, so nothing was counted"
    if off and counts.skipped:
        return f"at {setting:g} (off): {counts.skipped} of {counts.calls} {counts.unit} computations skipped, expected 0"
    if not off and counts.skipped == 0:
        return f"at {setting:g}: 0 of {counts.calls} {counts.unit} computations skipped: the cache never took effect"
    return ""


# judge()'s and count_computations' keys as a table heads them (notebook 14 shows its tables with these).
SHOWN_AS: dict[str, str] = {
    "speedup": "speedup (x)", "distance": "distance to reference (rel. L2)", "psnr_db": "PSNR vs reference (dB)",
    "ssim": "SSIM vs reference", "recognized": "read as prompted (share)", "same_digit": "same digit as reference (share)",
    "frechet": "Frechet distance to real digits", "calls": "calls (of its unit)", "skipped_share": "skipped (share)",
    "skipped_timed_share": "skipped in the timed image (share)",
}
THRESHOLD_CACHES: tuple[str, ...] = ("first-block", "mag")  # decide by a threshold; the other three by an interval
CACHE_NAMES: tuple[str, ...] = ("first-block", "mag", "taylorseer", "pyramid", "faster")


def cache_config(name: str, value: float, *, steps: int, pipe: Any) -> Any:
    """diffusers' cache configuration `name` at one setting of its knob (a threshold or an interval), as notebook 14's
    list shows each: MagCache with Flux-1-Dev's shipped ratios, TaylorSeer with float32 factors, the two attention
    caches reading the timestep from pipe (diffusers 0.42 asks for it), FasterCache for a guidance-distilled model."""
    from diffusers import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    if name == "first-block":
        return FirstBlockCacheConfig(threshold=value)
    if name == "mag":
        return MagCacheConfig(threshold=value, num_inference_steps=steps, mag_ratios=FLUX_MAG_RATIOS)
    if name == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=int(value), taylor_factors_dtype=torch.float32)
    now = lambda: pipe.current_timestep
    if name == "pyramid":
        return PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=int(value),
                                               current_timestep_callback=now)
    if name == "faster":
        return FasterCacheConfig(spatial_attention_block_skip_range=int(value), current_timestep_callback=now,
                                 attention_weight_callback=lambda _: 0.5, is_guidance_distilled=True)
    raise ValueError(f"cache {name!r}; allowed: {CACHE_NAMES}")


def mag_skip_cap(config: Any) -> int:
    """The most steps a MagCacheConfig can skip in one image whatever its threshold: no skip before
    round(retention_ratio x steps), then at most max_skip_steps in a row before a computed step (hooks/mag_cache.py)."""
    steps = config.num_inference_steps
    run = skipped = 0
    for _ in range(int(config.retention_ratio * steps + 0.5), steps):
        run += 1
        if run <= config.max_skip_steps:
            skipped += 1
        else:
            run = 0
    return skipped


def skipped_steps(counts: Counts) -> int:
    """Steps in which the last counted block's own code did not run: the steps a block cache skipped (First Block
    Cache still runs the first block then; MagCache skips every block)."""
    return counts.pattern().count("s")


def judge(batch: torch.Tensor, reference: torch.Tensor, *, images_judgeable: bool, digits: bool) -> dict[str, float]:
    """Quality of a batch against the reference batch of the same prompts and seed: relative L2 distance always; PSNR
    and SSIM where the weights draw images (not random ones); where the batch is the ten digits of the trained smoke
    model, the share recognized as 0-9, the share the classifier reads as the reference's digit (same_digit: a digit
    near the judge's confidence limit can flip on a tiny change) and the Frechet distance."""
    from helpers import compile_tools, quality

    out = {"distance": compile_tools.relative_error(batch, reference)}
    if images_judgeable:
        out |= {"psnr_db": quality.psnr(batch, reference), "ssim": quality.ssim(batch, reference)}
    if digits:
        out |= {"recognized": quality.recognized(batch, range(10)),
                "same_digit": float((quality.predict(batch) == quality.predict(reference)).float().mean()),
                "frechet": quality.frechet_distance(batch)}
    return out


def measure_stage(generate: Any, images: Any, transformer: torch.nn.Module, device: torch.device, *,
                  repeats: int, warmup: int) -> tuple[Any, float, torch.Tensor, dict[str, Any]]:
    """One stage of notebook 14's waterfall: (steady timing of generate(), its first call's seconds, the judged batch
    of images(), and what was counted): graphs compiled at the first image and batch, graphs compiled in the timed
    calls (recompiles), and where a cache is on, what it skipped in one more images() call and one more generate()
    call (the timed image), each run eagerly (the counting hooks are Python: compiled code would trace them)."""
    from helpers import compile_tools, measure

    with compile_tools.counting() as first:
        first_s, _ = measure.first_call_seconds(generate, device)
        batch = images()  # one more compile where its batch size differs
    with compile_tools.counting() as steady:
        timing = measure.time_callable(generate, device, repeats=repeats, warmup=warmup)
    found: dict[str, Any] = {"graphs": first.graphs, "recompiles": steady.graphs}
    if transformer.is_cache_enabled:
        with torch.compiler.set_stance("force_eager"):
            with count_computations(transformer) as counts:
                images()
            with count_computations(transformer) as timed:
                generate()
        found |= {"skipped": counts.skipped, "skipped_share": counts.skipped_share,
                  "skipped_timed_share": timed.skipped_share}
    return timing, first_s, batch, found


def uncompile_blocks(transformer: torch.nn.Module) -> None:
    """Undo notebook 14's compile_blocks: drop each block's instance `forward`, so its class's forward answers again."""
    for name in BLOCK_LISTS:
        for block in getattr(transformer, name, None) or []:
            block.__dict__.pop("forward", None)


def paired_timing(transformer: torch.nn.Module, config: Any, generate: Any, device: torch.device, *, repeats: int,
                  warmup: int) -> dict[str, Any]:
    """The same pipeline timed with the cache on and off in turn, round by round (switched untimed between calls), so
    that load which changes during the measurement lands on both alike: {'cache on': Timing, 'cache off': Timing}.
    The cache is on afterwards."""
    from helpers import measure

    def switch(name: str) -> None:
        if name == "cache on" and not transformer.is_cache_enabled:
            transformer.enable_cache(config)
        elif name == "cache off" and transformer.is_cache_enabled:
            transformer.disable_cache()

    timed = measure.time_interleaved({"cache on": generate, "cache off": generate}, device, repeats=repeats,
                                     warmup=warmup, setup=switch)
    switch("cache on")
    return timed
