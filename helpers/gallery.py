"""What a learner sees: every image a notebook shows goes through here, is judged, and is kept as a row.

`Gallery.show` displays one image or a grid and records what the digit judge (helpers.quality) reads in each
image: on the project's trained smoke model every shown image must read as its prompt's digit (a grid: its share
at least the floor stated with it), and the Checks cell adds that claim by itself (`claim`). Images of random
weights are shown with a line that says they are noise by design. `Gallery.show_committed` displays a figure a
GPU run committed under figures/<hardware>/, so a notebook run on a CPU shows the full-size result beside its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from helpers import paths, quality, text
from helpers.results import ResultWriter

SHOWN = "shown: "  # the scenario prefix of the rows that record a shown image or grid
SIZE = 192  # pixels per shown image: the smoke model draws 128x128, enlarged (nearest) so its strokes are visible


def digit_in(prompt: str) -> int | None:
    """The digit a prompt names ('a handwritten digit seven' -> 7), or None when it names none or several."""
    words = set(re.findall(r"[a-z]+", prompt.lower()))
    found = [d for d, w in enumerate(quality.DIGIT_WORDS) if w in words]
    return found[0] if len(found) == 1 else None


def _display(obj: Any) -> None:
    """IPython's display where there is one (a notebook), else nothing (a script or a test)."""
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is pinned
        return
    display(obj)


# The trained smoke VAE's decoder tints the outermost row and column of every image it draws (eager ones too):
# measured on an eager "zero", the edge rows and columns carry a colour cast that the rows next to them do not.
EDGE_NOTE = ("(the thin coloured line along an image's edge comes from the tiny smoke model's VAE decoder: eager images "
             "have it too, so it is no lever's doing)")


def judge_rule() -> str:
    """How the judge reads an image, said once a run under its first judged image (limits from quality.limits)."""
    lim = quality.limits()
    return (f"(the judge, a classifier trained on real digits, counts a read when its confidence is at least "
            f"{lim['confidence_floor']:.2f} and the image, shrunk to 8x8 pixels in [0, 1], lies within "
            f"{lim['distance_ceiling']:.2f} of a real digit of that class (Euclidean distance over the 64 pixel values); "
            "both limits were set on held-out real digits)")


class Gallery:
    """The images one notebook run shows, each judged where the weights and prompt allow, recorded as rows."""

    def __init__(self, writer: ResultWriter) -> None:
        """Show images for the run of writer; rows go through it."""
        self.writer = writer
        self._notes_said = False

    def why_not_judged(self, prompts: Sequence[str]) -> str:
        """'' when images of these prompts can be judged on this run, else why not (random weights, no digit)."""
        weights = str(self.writer.run.weights)
        if weights == "random":
            return "random weights: the image is noise by design; it shows that the pipeline ran, not what it draws"
        if not Path(weights).is_dir() or Path(weights).resolve() != quality.SMOKE_MODEL_DIR.resolve():
            return f"weights {Path(weights).name}: the digit judge knows only the project's trained smoke model"
        bad = sorted({p for p in prompts if digit_in(p) is None})
        return f"prompt {bad[0]!r} names no digit: the judge reads digits only" if bad else ""

    def show(self, images: Any, prompts: str | Sequence[str], title: str, *, labels: Sequence[str] | None = None,
             floor: float = 1.0, size: int = SIZE) -> dict[str, Any]:
        """Display one image (prompts: its prompt) or rows of images (prompts: one per column, the same in every
        row; labels: one per row), print what the judge reads, and record it as the row 'shown: <title>'.

        A single image must read as its prompt's digit; each row of a grid must reach floor (a share)."""
        single = isinstance(prompts, str)
        rows = [[images]] if single else [list(r) for r in images]
        prompts = [prompts] if single else list(prompts)
        if not rows:  # every part that would have made an image was skipped or ran out of memory: its row says so
            print(f"{title.strip(' ,')}: no image to show (the parts that made none have 'skipped' or 'oom' rows)")
            return {"judged": False, "rows": []}
        if any(len(r) != len(prompts) for r in rows):
            raise ValueError(f"show({title!r}): {len(prompts)} prompts but rows of {[len(r) for r in rows]} images")
        labels = list(labels) if labels else [""] * len(rows)
        heads = [str(d) if (d := digit_in(p)) is not None else p[:12] for p in prompts] if len(prompts) > 1 else None
        _display(quality.image_grid(rows, labels if any(labels) else None, size=size, columns=heads))
        why = self.why_not_judged(prompts)
        judged: list[dict[str, Any]] = []
        if not why:
            digits = [digit_in(p) for p in prompts]
            for label, row in zip(labels, rows, strict=True):
                reads = quality.read(row)
                share = sum(r.is_digit and r.digit == d for r, d in zip(reads, digits, strict=True)) / len(row)
                missed = [f"the {d} ({r})" for r, d in zip(reads, digits, strict=True) if not (r.is_digit and r.digit == d)]
                judged.append({"label": label, "share": share, "floor": floor, "holds": share >= floor,
                               "reads": [str(r) for r in reads], "missed": missed})
            print(self._caption(judged, digits, single))
            if not self._notes_said:  # once a run, at its first judged image: the judge's rule, the edge line
                print(judge_rule())
                print(EDGE_NOTE)
                self._notes_said = True
        else:
            print(why)
        self.writer.record(SHOWN + title, judged=not why, reason_not_judged=why, prompts=prompts, grid=judged)
        return {"judged": not why, "rows": judged}

    @staticmethod
    def _caption(judged: list[dict[str, Any]], digits: list[int | None], single: bool) -> str:
        """One line per row: what the judge read, against what was asked (and how many the row needs)."""
        if single:
            return f"asked for a {digits[0]}; the judge reads {judged[0]['reads'][0]}"
        n = len(digits)
        said = "reads as its prompt's digit" if n == 1 else "read as their prompt's digit"
        return "\n".join(f"{j['label'] or 'row'}: {round(j['share'] * n)} of {n} {said} "
                         f"(this row needs {math.ceil(j['floor'] * n - 1e-9)})"
                         + (f"; missed: {', '.join(j['missed'])}" if j["missed"] else "") for j in judged)

    def show_committed(self, name: str, caption: str = "") -> list[Path]:
        """Display each figure `<notebook>_<name>.png` a GPU run committed under figures/<hardware>/, naming the
        hardware; a line saying so when no GPU run has committed it. Returns the paths shown."""
        found = committed_figures(self.writer.run.notebook, name, self.writer.run.model)
        if not found:
            print("no GPU run of this figure is committed yet: on a CUDA GPU with the full profile this cell draws it")
        from IPython.display import Image as IPImage  # lazy: only a notebook displays

        for hardware, path in found:
            print(f"committed GPU run on {hardware}, full profile ({paths.relative(path)})"
                  + (f": {caption}" if caption else ""))
            _display(IPImage(filename=str(path)))
        return [p for _, p in found]


def committed_figures(notebook: str, name: str, model: str = "flux-dev",
                      figures_dir: Path = paths.FIGURES_DIR) -> list[tuple[str, Path]]:
    """(hardware, path) of each committed GPU figure of a notebook and name (model's suffix off Flux), by hardware."""
    suffix = "" if model == "flux-dev" else f".{model}"
    return [(p.parent.name, p) for p in sorted(figures_dir.glob(f"*/{notebook}_{name}{suffix}.png"))
            if p.parent.name != "cpu"]


def claim(writer: ResultWriter) -> tuple[str, str, str, bool] | None:
    """The Checks cell's claim about the shown images (claim, measured, expected, holds), or None if none was judged."""
    judged = [r for r in writer.rows if r.scenario.startswith(SHOWN) and r.extra.get("judged")]
    if not judged:
        return None
    grids = [g for r in judged for g in r.extra["grid"]]
    bad = [f"{r.scenario.removeprefix(SHOWN)} ({g['label'] or 'image'}: {g['share']:.0%})"
           for r in judged for g in r.extra["grid"] if not g["holds"]]
    return ("every image shown reads as its prompt's digit (a grid row: at least its floor)",
            f"{len(grids) - len(bad)} of {text.count(len(grids), 'image or grid row', 'images or grid rows')} read "
            "right" + (f"; not: {'; '.join(bad)}" if bad else ""),
            f"all {len(grids)}", not bad)
