"""Published numbers beside measured ones: ratios, tolerance bands and verdicts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from helpers import paths

GIB = 2**30


def published_numbers(reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame:
    """The published figures, one row each, with their source."""
    return pd.read_csv(reference_dir / "published-numbers.csv")


def comparisons(reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame:
    """Which measured row answers which published figure, and how (speedup, ratio or absolute)."""
    return pd.read_csv(reference_dir / "comparisons.csv", keep_default_na=False)


def _published_value(pub: pd.DataFrame, source: str, scenario: str, metric: str) -> float:
    """One published figure, converted to seconds or bytes."""
    hit = pub[(pub["source"] == source) & (pub["scenario"] == scenario) & (pub["metric"] == metric)]
    if len(hit) != 1:
        raise KeyError(f"published-numbers.csv has {len(hit)} rows for {source!r} / {scenario!r} / {metric!r}")
    value, unit = float(hit["value"].iloc[0]), hit["unit"].iloc[0]
    return value * GIB if unit == "GB" else value


def _measured_value(rows: pd.DataFrame, scenario: str, field: str) -> float | None:
    """The measured field of the named scenario, or None when absent or not ok."""
    hit = rows[(rows["scenario"] == scenario) & (rows["status"] == "ok")]
    if hit.empty or pd.isna(hit[field].iloc[-1]):
        return None
    return float(hit[field].iloc[-1])


def _hardware_matches(hardware_class: str, hardware: str) -> bool:
    """True when a comparison of this class may be made on this hardware."""
    if hardware == "cpu":
        return False
    return hardware_class == "GPU" or hardware.lower().startswith(hardware_class.lower())


def _fmt(value: float | None, kind: str, field: str) -> str:
    """A published or measured value with its unit."""
    if value is None:
        return "—"
    if kind in ("speedup", "ratio"):
        return f"{value:.2f}x"
    return f"{value / GIB:.1f} GiB" if field == "peak_memory_bytes" else f"{value:.2f} s"


def compare(rows: pd.DataFrame, notebook: str | None = None,
            reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame:
    """For every comparison (of one notebook, or all), the published and measured values, factor and verdict."""
    pub, comps = published_numbers(reference_dir), comparisons(reference_dir)
    if notebook:
        comps = comps[comps["notebook"] == notebook]
    out = []
    hardwares = sorted(rows["hardware"].unique()) if not rows.empty else ["cpu"]
    for hw in hardwares:
        for c in comps.itertuples():
            pval = _published_value(pub, c.published_source, c.published_scenario, c.published_metric)
            if c.kind != "absolute":
                base = _published_value(pub, c.published_source, c.published_base_scenario, c.published_metric)
                pval = base / pval if c.kind == "speedup" else pval / base
            mine = rows[(rows["hardware"] == hw) & (rows["notebook"] == c.notebook)] if not rows.empty else rows
            profiles = set(mine["profile"]) if not mine.empty else set()
            models = set(mine["model"]) if not mine.empty else set()
            mval, verdict = None, ""
            if mine.empty:
                verdict = "not measured: no rows"
            elif "full" not in profiles:
                verdict = f"not measured: {'/'.join(sorted(profiles))} profile only (tiny models)"
            elif c.model not in models:
                verdict = f"not measured: needs MODEL={c.model}"
            elif not _hardware_matches(c.hardware_class, hw):
                verdict = f"not compared: absolute figure from {c.hardware_class}, measured on {hw}"
            else:
                full = mine[(mine["profile"] == "full") & (mine["model"] == c.model)]
                mval = _measured_value(full, c.measured_scenario, c.measured_field)
                if mval is not None and c.kind != "absolute":
                    base = _measured_value(full, c.measured_base_scenario, c.measured_field)
                    mval = None if not base else (base / mval if c.kind == "speedup" else mval / base)
                if mval is None:
                    verdict = "not measured: scenario missing or not ok"
            factor = mval / pval if mval is not None else None
            if factor is not None:
                tol = float(c.tolerance)
                inside = 1 / (1 + tol) <= factor <= 1 + tol
                verdict = f"within ±{tol:.0%}" if inside else ("better than published" if (
                    factor > 1) == (c.kind == "speedup") else "worse than published")
            out.append({
                "hardware": hw, "comparison": c.id, "notebook": c.notebook, "source": c.published_source,
                "published": _fmt(pval, c.kind, c.measured_field),
                "measured": _fmt(mval, c.kind, c.measured_field),
                "measured / published": None if factor is None else round(factor, 3),
                "verdict": verdict, "note": c.note,
            })
    return pd.DataFrame(out)
