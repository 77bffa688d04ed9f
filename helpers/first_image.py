"""A pipeline's first image and its steady images, measured inside a fresh process (notebook 15's cold and warm
starts); the JSON line it prints is the one helpers.coldstart.run_script reads back.

coldstart.Child times one denoiser step on inputs it builds itself; a recipe is judged by the image a user waits for,
so this times whole pipeline calls: the first (where the compile happens) with the compile caches' hits and misses
counted, then steady calls with any recompile counted, and the image's distance to a reference image the notebook
saved (its eager image of the same seed and prompt).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from helpers import coldstart, compile_tools, measure


class Child:
    """The measuring half of notebook 15's script: `first_and_steady(call)` times a pipeline call that returns images
    (a tensor), `json_line()` is what the script prints for the parent."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        """cfg: the parent's settings (repeats, warmup, reference, launched_at, save_artifacts)."""
        self.cfg = cfg
        self.result: dict[str, Any] = {"how": cfg.get("how", "regional"), "artifacts_loaded": False,
                                       "artifacts_saved_bytes": 0, "artifacts_load_s": 0.0, "extra": {}}

    timing = coldstart.Child.timing  # the wall seconds of a block, under a name (e.g. loading compile artifacts)
    note = coldstart.Child.note  # more fields for what the process reports (e.g. artifacts_loaded=True)

    def first_and_steady(self, call: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
        """Time the first call (it compiles) counting graphs and compile-cache lookups, then the steady calls
        (counting recompiles); the first call's images, whose distance to the reference is recorded."""
        self.result["startup_s"] = time.time() - self.cfg.get("launched_at", time.time())
        with compile_tools.counting() as first:
            first_s, images = measure.first_call_seconds(call, device)
        with compile_tools.counting() as later:
            steady = measure.time_callable(call, device, repeats=self.cfg["repeats"], warmup=self.cfg["warmup"])
        reference = torch.load(self.cfg["reference"]) if self.cfg.get("reference") else images
        self.note(first_call_s=first_s, steady_samples_s=list(steady.samples_s), timing_method=steady.method,
                  rel_error=compile_tools.relative_error(images.cpu(), reference.cpu()), graphs=first.graphs,
                  ops_captured=first.ops_captured, recompiles_after_first=later.graphs,
                  first_call_cache_hits=first.cache_hits, first_call_cache_misses=first.cache_misses)
        self.result["extra"]["start_to_first_image_s"] = self.result["startup_s"] + first_s
        return images

    def json_line(self) -> str:
        """The line the parent reads back, with the process's CUDA peak (0 on a CPU) and the size of the artifacts
        file the script saved, if it saved one."""
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        saved = Path(self.cfg.get("save_artifacts") or "")
        size = saved.stat().st_size if self.cfg.get("save_artifacts") and saved.is_file() else 0
        return coldstart._MARK + json.dumps(self.result | {"cuda_peak_bytes": peak, "artifacts_saved_bytes": size})
