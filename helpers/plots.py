"""Plots in one house style, saved under figures/<hardware>/."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker

from helpers.params import Run

# Words that name a unit (or say the axis is a plain count or ratio): a value axis must carry one.
UNIT_WORDS: tuple[str, ...] = ("(s)", "(ms)", "(GiB)", "(MiB)", "(x)", "(%)", "seconds", "milliseconds", "per ",
                               "relative", "ratio", "count", "(TFLOP/s)")


def check_labels(title: str, xlabel: str, ylabel: str) -> None:
    """Refuse a plot without a title or axis labels, or whose value axis names no unit."""
    missing = [n for n, v in (("title", title), ("xlabel", xlabel), ("ylabel", ylabel)) if not v.strip()]
    if missing:
        raise ValueError(f"a plot needs a title and both axis labels; missing: {', '.join(missing)}")
    if not any(w in ylabel for w in UNIT_WORDS):
        raise ValueError(f"ylabel={ylabel!r} names no unit; say one of {UNIT_WORDS}, e.g. 'latency (s)'")


def figure_path(run: Run, hardware: str, name: str) -> Path:
    """Where a notebook's figure goes: <figures>/<hardware>/<notebook>_<name>.png, with '.<model>' before '.png' for
    a model other than Flux-1-Dev (as the executed copies are named), so an SDXL run keeps the Flux run's figures."""
    model = "" if run.model == "flux-dev" else f".{run.model}"
    return run.figures_dir / hardware / f"{run.notebook}_{name}{model}.png"


def save(fig: plt.Figure, run: Run, hardware: str, name: str) -> Path:
    """Save fig as PNG under the run's figures folder and return the path."""
    path = figure_path(run, hardware, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def save_image(image: Any, run: Run, hardware: str, name: str) -> Path:
    """Save a PIL image (an image grid, say) as PNG under the run's figures folder and return the path."""
    path = figure_path(run, hardware, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def smoke_caveat(run: Run, sep: str = "; ") -> str:
    """'' on the full profile; on smoke, what a figure's numbers are (a tiny model's on this device), after sep."""
    where = "a GPU" if run.device.type == "cuda" else "a CPU"
    return "" if run.profile == "full" else f"{sep}smoke: a tiny model on {where}, not the full-size workload"


LONG_LABEL = 16  # characters: longer category labels turn the chart on its side, where they read level
WRAP = 34  # characters per line of a category label on a sideways chart


def bars(labels: Sequence[str], values: Sequence[float], *, title: str, xlabel: str, ylabel: str,
         errors: Sequence[float] | tuple[Sequence[float], Sequence[float]] | None = None,
         note: str = "") -> plt.Figure:
    """A labelled bar chart (optionally with error bars: one half-width per bar, or a pair (below, above) of lists,
    e.g. median - fastest and slowest - median) with the value printed on each bar; drawn sideways, with wrapped
    labels, when a label is longer than LONG_LABEL. xlabel names the categories, ylabel the values."""
    check_labels(title, xlabel, ylabel)
    sideways = any(len(str(label)) > LONG_LABEL for label in labels)
    if sideways:
        wrapped = [textwrap.fill(str(label), WRAP, break_on_hyphens=False) for label in labels]
        height = 1.2 + 0.28 * sum(w.count("\n") + 1 for w in wrapped) + 0.2 * len(labels)
        fig, ax = plt.subplots(figsize=(7, max(2.6, height)))
        bars_ = ax.barh(range(len(labels)), values, xerr=errors, capsize=4, color="#4C72B0")
        ax.set_yticks(range(len(labels)), wrapped, fontsize=9)
        ax.invert_yaxis()  # the first label on top, as it reads in a table
        ax.set_xlabel(ylabel)
        ax.set_ylabel(xlabel)
        ax.margins(x=0.18)
        ax.grid(axis="x", alpha=0.3)
    else:
        fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(labels) + 2), 3.6))
        bars_ = ax.bar(range(len(labels)), values, yerr=errors, capsize=4, color="#4C72B0")
        ax.set_xticks(range(len(labels)), labels, rotation=20 if len(labels) > 4 else 0,
                      ha="right" if len(labels) > 4 else "center")
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    ax.set_title(title + (f"\n{note}" if note else ""), fontsize=11)
    ax.bar_label(bars_, fmt="%.3g", padding=4 if sideways else 2, fontsize=8)
    fig.tight_layout()
    return fig


def lines(x: Sequence[float], series: dict[str, Sequence[float]], *, title: str, xlabel: str, ylabel: str,
          logy: bool = False, note: str = "") -> plt.Figure:
    """A labelled line chart, one line per series, markers on the measured points."""
    check_labels(title, xlabel, ylabel)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for label, ys in series.items():
        ax.plot(x, ys, marker="o", label=label)
    ax.set_title(title + (f"\n{note}" if note else ""), fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:  # plain numbers on every labelled tick ('0.006', not '6 x 10^-3')
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        low, high = ax.get_ylim()
        if high / low < 30:  # within about a decade and a half, label 2, 4 and 6 of each decade too
            ax.yaxis.set_minor_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "246" else ""))
    if len(x) <= 8:
        ax.set_xticks(list(x))  # a tick at each measured point
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
