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
