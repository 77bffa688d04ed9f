"""Published numbers beside measured ones: ratios, tolerance bands and verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from helpers import measure, paths, readme_region, results, text

GIB = 2**30


def published_numbers(reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame:
    """The published figures, one row each, with their source."""
    return pd.read_csv(reference_dir / "published-numbers.csv")


def comparisons(reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame:
    """Which measured row answers which published figure, and how (speedup, ratio or absolute)."""
    return pd.read_csv(reference_dir / "comparisons.csv", keep_default_na=False)


def coverage(reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame:
    """Every published figure with the comparisons that use it, or the reason no notebook reproduces it."""
    pub, comps = published_numbers(reference_dir), comparisons(reference_dir)
    skipped = pd.read_csv(reference_dir / "not-covered.csv", keep_default_na=False)
    out = []
    for r in pub.itertuples():
        used = [c.id for c in comps.itertuples() if c.published_source == r.source and c.published_metric == r.metric
                and r.scenario in (c.published_scenario, c.published_base_scenario)]
        why = skipped[(skipped["source"] == r.source) & (skipped["scenario"] == r.scenario)
                      & (skipped["metric"] == r.metric)]["reason"]
        out.append({"source": r.source, "hardware": r.hardware, "scenario": r.scenario, "metric": r.metric,
                    "published": f"{r.value:g} {r.unit}", "compared in": ", ".join(used),
                    "not reproduced because": why.iloc[0] if len(why) else ""})
    return pd.DataFrame(out)


def _published_value(pub: pd.DataFrame, source: str, scenario: str, metric: str) -> float:
    """One published figure, converted to seconds or bytes."""
    hit = pub[(pub["source"] == source) & (pub["scenario"] == scenario) & (pub["metric"] == metric)]
    if len(hit) != 1:
        raise KeyError(f"published-numbers.csv has {len(hit)} rows for {source!r} / {scenario!r} / {metric!r}")
    value, unit = float(hit["value"].iloc[0]), hit["unit"].iloc[0]
    return value * GIB if unit == "GB" else value


def _latest_ok(rows: pd.DataFrame, scenario: str) -> pd.Series | None:
    """The latest ok row of the named scenario, or None."""
    hit = rows[(rows["scenario"] == scenario) & (rows["status"] == "ok")]
    return None if hit.empty else hit.iloc[-1]


def _measured_value(rows: pd.DataFrame, scenario: str, field: str) -> float | None:
    """The measured field of the named scenario (a row column, else a key of its extra), or None when absent or not ok."""
    last = _latest_ok(rows, scenario)
    if last is None:
        return None
    value = last.get(field)
    if value is None or pd.isna(value):
        extra = last.get("extra")
        value = extra.get(field) if isinstance(extra, dict) else None
    return None if value is None or pd.isna(value) else float(value)


def _measured_dtype(rows: pd.DataFrame, scenario: str) -> str | None:
    """The dtype of the named scenario's latest ok row, or None when absent or not recorded."""
    last = _latest_ok(rows, scenario)
    if last is None or "dtype" not in last or pd.isna(last["dtype"]):
        return None
    return str(last["dtype"])


def _missing_levers(rows: pd.DataFrame, scenarios: list[str], requires: str) -> list[str]:
    """The levers a comparison requires (';'-separated) that the latest ok rows of its scenarios did not run with."""
    ran: set[str] = set()
    for scenario in [s for s in scenarios if s]:
        last = _latest_ok(rows, scenario)
        extra = last["extra"] if last is not None and "extra" in last else None
        ran |= set(extra.get("levers") or []) if isinstance(extra, dict) else set()
    return [lever for lever in str(requires or "").split(";") if lever and lever not in ran]


def _hardware_matches(hardware_class: str, hardware: str) -> bool:
    """True when a comparison of this class ('GPU', 'H100', 'RTX 4090', ...) may be made on this hardware slug."""
    if hardware == "cpu":
        return False
    return hardware_class == "GPU" or hardware.lower().startswith(hardware_class.lower().replace(" ", "-"))


def verdict(factor: float, tolerance: float, better: str) -> str:
    """'within ±x%' inside the band [1/(1+tol), 1+tol], else better or worse than published in the comparison's sense."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better={better!r}; allowed: 'higher', 'lower'")
    if 1 / (1 + tolerance) <= factor <= 1 + tolerance:
        return f"within ±{tolerance:.0%}"
    return "better than published" if (factor > 1) == (better == "higher") else "worse than published"


def _fmt(value: float | None, kind: str, field: str) -> str:
    """A published or measured value with its unit."""
    if value is None:
        return "—"
    if kind in ("speedup", "ratio", "factor"):
        return f"{value:.2f}x"
    if field == "peak_memory_bytes":  # a CPU working-memory peak of a tiny model is MiBs: 0.0 GiB would hide it
        return f"{value / GIB:.1f} GiB" if value >= GIB else f"{value / 2**20:.1f} MiB"
    return f"{value:.2f} s" if value >= 1 else f"{value:#.3g} s"  # a tiny model's 0.0241 s, not 0.02 s


def _comparison(comparison_id: str, reference_dir: Path = paths.REFERENCE_DIR) -> pd.Series:
    """The one row of comparisons.csv with this id; a KeyError naming the id otherwise."""
    comps = comparisons(reference_dir)
    hit = comps[comps["id"] == comparison_id]
    if len(hit) != 1:
        raise KeyError(f"comparisons.csv has {len(hit)} rows with id {comparison_id!r}")
    return hit.iloc[0]


def _published_of(pub: pd.DataFrame, c: Any) -> float:
    """A comparison's published figure: the value itself, or for a speedup or ratio the quotient of its two values."""
    pval = _published_value(pub, c.published_source, c.published_scenario, c.published_metric)
    if c.kind in ("absolute", "factor"):  # a 'factor' is published as the ratio itself (unit x)
        return pval
    base = _published_value(pub, c.published_source, c.published_base_scenario, c.published_metric)
    return base / pval if c.kind == "speedup" else pval / base


def _published_phrase(pub: pd.DataFrame, c: Any, with_model: bool = False) -> str:
    """'5.58 s on H200 (sglang PR 19673)' (with_model: '5.58 s for flux-dev on H200 (...)'): the published figure,
    where and whose."""
    row = pub[(pub["source"] == c.published_source) & (pub["scenario"] == c.published_scenario)]
    published_hw = row["hardware"].iloc[0] if len(row) else c.hardware_class
    model = f" for {c.model}" if with_model else ""
    return f"{_fmt(_published_of(pub, c), c.kind, c.measured_field)}{model} on {published_hw} ({c.published_source})"


def compare(rows: pd.DataFrame, notebook: str | None = None,
            reference_dir: Path = paths.REFERENCE_DIR, results_dir: Path = paths.RESULTS_DIR) -> pd.DataFrame:
    """For every comparison (of one notebook, or all), the published and measured values, factor and verdict, and
    for a verdict outside its band the cause recorded in gaps.csv beside the rows."""
    pub, comps, causes = published_numbers(reference_dir), comparisons(reference_dir), gaps(results_dir)
    if notebook:
        comps = comps[comps["notebook"] == notebook]
    out = []
    hardwares = sorted(rows["hardware"].unique()) if not rows.empty else ["cpu"]
    for hw in hardwares:
        for c in comps.itertuples():
            pval = _published_of(pub, c)
            mine = rows[(rows["hardware"] == hw) & (rows["notebook"] == c.notebook)] if not rows.empty else rows
            profiles = set(mine["profile"]) if not mine.empty else set()
            models = set(mine["model"]) if not mine.empty else set()
            mval, outcome = None, ""
            if mine.empty:
                outcome = "not measured: no rows"
            elif "full" not in profiles:
                outcome = f"not measured: {'/'.join(sorted(profiles))} profile only (tiny models)"
            elif c.model not in models:
                outcome = f"not measured: needs MODEL={c.model}"
            else:
                full = mine[(mine["profile"] == "full") & (mine["model"] == c.model)]
                mval = _measured_value(full, c.measured_scenario, c.measured_field)
                if not _hardware_matches(c.hardware_class, hw):  # shown, never divided by the published figure
                    outcome = f"not compared: published on {c.hardware_class}, measured on {hw}"
                dtype = _measured_dtype(full, c.measured_scenario)
                if mval is not None and c.dtype and dtype is not None and dtype != c.dtype:
                    mval, outcome = None, f"not compared: measured in {dtype}, published in {c.dtype}"
                elif mval is not None and c.kind != "absolute" and c.measured_base_scenario:
                    base = _measured_value(full, c.measured_base_scenario, c.measured_field)  # 'factor' too
                    mval = None if not base else (base / mval if c.kind == "speedup" else mval / base)
                if mval is None and not outcome:
                    outcome = "not measured: scenario missing or not ok"
                missing = _missing_levers(full, [c.measured_scenario, c.measured_base_scenario], c.requires_levers)
                if mval is not None and missing and not outcome:  # shown, never divided by the published figure
                    outcome = f"not compared: the stack ran without {', '.join(missing)}, which the published one has"
            factor = mval / pval if mval is not None and not outcome else None
            if factor is not None:
                outcome = verdict(factor, float(c.tolerance), c.better)
            out.append({
                "hardware": hw, "comparison": c.id, "notebook": c.notebook, "source": c.published_source,
                "published": _fmt(pval, c.kind, c.measured_field),
                "measured": _fmt(mval, c.kind, c.measured_field),
                "measured / published": None if factor is None else round(factor, 3),
                "verdict": outcome, "band": f"±{float(c.tolerance):.0%}", "compared on": c.hardware_class,
                "note": c.note, "why the gap": _gap_cause(causes, c.id, hw, outcome),
            })
    return pd.DataFrame(out)


GAP_UNEXPLAINED = "not explained yet"


def unexplained_gaps(table: pd.DataFrame) -> list[str]:
    """The compare() rows whose verdict lies outside their band with no cause recorded, as 'comparison on hardware'."""
    hit = table[table["why the gap"] == GAP_UNEXPLAINED]
    return [f"{c} on {h}" for c, h in zip(hit["comparison"], hit["hardware"])]


def gaps(results_dir: Path = paths.RESULTS_DIR) -> pd.DataFrame:
    """Why a measured figure misses its published band: data/results/gaps.csv (comparison, hardware, cause)."""
    path = results_dir / "gaps.csv"
    if not path.exists():
        return pd.DataFrame(columns=["comparison", "hardware", "cause"])
    return pd.read_csv(path, keep_default_na=False)


def _gap_cause(causes: pd.DataFrame, comparison: str, hardware: str, outcome: str) -> str:
    """The recorded cause of a verdict outside its band, 'not explained yet' where none is, '' inside the band."""
    if not outcome.endswith("than published"):
        return ""
    hit = causes[(causes["comparison"] == comparison) & (causes["hardware"] == hardware)]["cause"]
    return hit.iloc[0] if len(hit) else GAP_UNEXPLAINED


class Note(str):
    """A line of text that a notebook displays as it is, without quotes."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def notebook_comparisons(rows: pd.DataFrame, notebook: str,
                         reference_dir: Path = paths.REFERENCE_DIR) -> pd.DataFrame | Note:
    """A notebook's comparisons: the compare() table when a row was measured, else one line counting them by reason."""
    table = compare(rows, notebook, reference_dir)
    if table.empty:
        return Note(f"Nothing to compare: no comparison in comparisons.csv covers {notebook}.")
    if (table["measured"] != "—").any():
        return table
    n = len(table)
    what = "This notebook's comparison is" if n == 1 else f"This notebook's {n} comparisons are"
    return Note(f"{what} not measured on this run: {_reasons(table)}. Notebook 11 sets each published figure beside "
                "the GPU runs' rows.")


def published_line(comparison_id: str, measured: float | None, hardware: str, profile: str,
                   reference_dir: Path = paths.REFERENCE_DIR, model: str | None = None,
                   results_dir: Path = paths.RESULTS_DIR) -> str:
    """One line setting this run's figure beside the published one of a comparison (comparisons.csv id): what this
    run measured and on what, then the published figure, its hardware and source; a figure the smoke profile or
    another hardware class cannot compare is said to be no comparison, in the same line; off the full profile, the
    project's own committed GPU figure follows (project_figure)."""
    pub, c = published_numbers(reference_dir), _comparison(comparison_id, reference_dir)
    what = c.get("label") or {"speedup": "speedup", "ratio": "ratio", "factor": "factor"}.get(
        c.kind, c.published_metric.replace("_", " "))  # what is compared, in words (comparisons.csv's label)
    mine = ("not measured" if measured is None else measure.human_speedup(measured) if c.kind == "speedup"
            else _fmt(measured, c.kind, c.measured_field))
    if profile != "full":
        status = "tiny model: no comparison"
    elif model is not None and model != c.model:
        status = f"no comparison: published for {c.model}, this run is {model}"
    elif not _hardware_matches(c.hardware_class, hardware):
        status = f"no comparison: published on {c.hardware_class}"
    else:
        status = "compared in the table below"
    ours = "" if profile == "full" else project_figure(comparison_id, reference_dir, results_dir)
    published = _published_phrase(pub, c, with_model=True)
    return f"{what}: this run ({hardware}, {profile} profile) {mine} ({status}); published: {published}" + (
        f"; {ours}" if ours else "")


def beside_published(figures: dict[str, float | None], hardware: str, profile: str,
                     reference_dir: Path = paths.REFERENCE_DIR, results_dir: Path = paths.RESULTS_DIR) -> Note:
    """Several comparisons' lines (comparison id: this run's figure or None): a published_line for each measured
    figure, then the unmeasured ones under one line that says so, each with its published figure and the project's
    own GPU figure where committed."""
    lines = [published_line(c, v, hardware, profile, reference_dir, results_dir=results_dir)
             for c, v in figures.items() if v is not None]
    missing = [c for c, v in figures.items() if v is None]
    if len(missing) == 1:
        lines.append(published_line(missing[0], None, hardware, profile, reference_dir, results_dir=results_dir))
    elif missing:
        pub = published_numbers(reference_dir)
        lines.append(f"not measured on this run ({hardware}, {profile} profile); published:")
        for cid in missing:
            c, ours = _comparison(cid, reference_dir), project_figure(cid, reference_dir, results_dir)
            lines.append(f"- {c.label}: {_published_phrase(pub, c, with_model=True)}" + (f"; {ours}" if ours else ""))
    return Note("\n".join(lines))


def project_figure(comparison_id: str, reference_dir: Path = paths.REFERENCE_DIR,
                   results_dir: Path = paths.RESULTS_DIR) -> str:
    """The project's own committed full-profile figures of a comparison, one phrase per GPU ('measured by this
    project: 1.31x on h200 (2026-11-26), within ±15%'), or '' where none is committed."""
    rows = results.read_rows(results_dir)
    if rows.empty or "profile" not in rows:
        return ""
    comps = comparisons(reference_dir)
    notebook = comps.loc[comps["id"] == comparison_id, "notebook"].iloc[0]
    full = rows[(rows["profile"] == "full") & (rows["notebook"] == notebook)]
    if full.empty:
        return ""
    table = compare(full, notebook, reference_dir, results_dir)
    table = table[(table["comparison"] == comparison_id) & (table["measured"] != "—")]
    phrases = []
    records = sorted(table.to_dict("records"), key=lambda t: t["verdict"].startswith("not compared"))  # like first
    for t in records:
        day = str(full.loc[full["hardware"] == t["hardware"], "timestamp"].max())[:10]
        why = t["why the gap"]  # a paragraph, given in notebook 11's table
        gap = "" if not why else f" ({why})" if why == GAP_UNEXPLAINED else " (why: notebook 11)"
        verdict = (f"{t['verdict']} of the published figure" if t["verdict"].startswith("within")
                   else "another GPU, not compared" if t["verdict"].startswith("not compared: published on")
                   else t["verdict"])
        phrases.append(f"{t['measured']} on {t['hardware']} ({day}), {verdict}{gap}")
    return ("measured by this project: " + "; ".join(phrases)) if phrases else ""


def headline(comparison_id: str, reference_dir: Path = paths.REFERENCE_DIR,
             results_dir: Path = paths.RESULTS_DIR) -> str:
    """The TL;DR line of a notebook: the published figure with its hardware and source, then the comparison's figure
    as this project measured it on each GPU where a full-profile run is committed (with its verdict)."""
    pub, c = published_numbers(reference_dir), _comparison(comparison_id, reference_dir)
    published = f"published: {_published_phrase(pub, c)}"
    ours = project_figure(comparison_id, reference_dir, results_dir)
    return f"{published}; {ours}" if ours else f"{published}; not yet measured on a GPU by notebook {c.notebook[:2]}"


def label(comparison_id: str, reference_dir: Path = paths.REFERENCE_DIR) -> str:
    """What a comparison compares, in words (comparisons.csv's label column)."""
    return str(_comparison(comparison_id, reference_dir)["label"])


def tldr(comparison_id: str) -> str:
    """A notebook's TL;DR line: 'TL;DR, <what is compared>: <headline>'."""
    return f"TL;DR, {label(comparison_id)}: {headline(comparison_id)}"


def published_beside(what: str, measured: str, hardware: str, profile: str, scenario: str | None,
                     metric: str = "compile_latency", source: str = "hands-on-guide", note: str = "",
                     why_none: str = "") -> str:
    """One line setting this run's figure beside a published one of data/reference/published-numbers.csv (for
    notebooks without a comparison id): what, this run's figure and where it ran (on the smoke profile: a tiny
    model, no comparison), then the published value, model, hardware and source, or (scenario None) 'none' and
    why_none; then note."""
    status = "tiny model: no comparison" if profile != "full" else "not compared: no like-for-like figure"
    line = f"{what}: this run ({hardware}, {profile} profile) {measured} ({status}); published: "
    if scenario is None:
        line += f"none ({why_none})" if why_none else "none"
    else:
        pub = published_numbers()
        hit = pub[(pub["source"] == source) & (pub["scenario"] == scenario) & (pub["metric"] == metric)]
        if len(hit) != 1:
            raise KeyError(f"published-numbers.csv has {len(hit)} rows for {source!r}, {scenario!r}, {metric!r}")
        p = hit.iloc[0]
        line += f"{p['value']:g} {p['unit']} for {p['model']} on {p['hardware']} ({source}: {scenario})"
    return line + (f"; {note}" if note else "")


def published_figure(source: str, scenario: str, base: str | None = None, metric: str | None = None) -> str:
    """A published figure from data/reference/published-numbers.csv as one phrase: its value and unit (with base,
    the speedup base / scenario of the metric, latency by default), the hardware and the source."""
    pub = published_numbers()
    pub = pub[pub["source"] == source]

    def row(name: str) -> pd.Series:
        hit = pub[(pub["scenario"] == name) & ((pub["metric"] == metric) if metric else True)]
        if len(hit) != 1:
            raise KeyError(f"published-numbers.csv has {len(hit)} rows for {source!r} / {name!r} / {metric!r}")
        return hit.iloc[0]

    r = row(scenario)
    value = f"{row(base).value / r.value:.2f}x" if base else f"{r.value:g}{'x' if r.unit == 'x' else ' ' + r.unit}"
    return f"{value} on an {r.hardware} ({source})"


# --- The reproduction report (notebook 11): tables, figures and the README's generated region ---

README_START, README_END = readme_region.markers("results")


def tolerances(reference_dir: Path = paths.REFERENCE_DIR) -> dict[str, float]:
    """Comparison id -> tolerance of its band, from comparisons.csv."""
    comps = comparisons(reference_dir)
    return {c: float(t) for c, t in zip(comps["id"], comps["tolerance"])}


def skipped(rows: pd.DataFrame) -> pd.DataFrame:
    """Measurements whose latest row (per hardware, notebook, model, profile, scenario) is not ok, with the reason."""
    cols = ["hardware", "notebook", "model", "scenario", "status", "reason"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    latest = rows.drop_duplicates(["hardware", "notebook", "model", "profile", "scenario"], keep="last")
    return latest.loc[latest["status"] != "ok", cols].sort_values(cols[:4]).reset_index(drop=True)


def key_latencies(rows: pd.DataFrame) -> pd.DataFrame:
    """Every ok row with a latency: hardware, profile, notebook, model, dtype, scenario, median seconds and spread."""
    cols = ["hardware", "profile", "notebook", "model", "dtype", "scenario", "latency median (s)", "spread (s)"]
    if rows.empty or "latency_median_s" not in rows:
        return pd.DataFrame(columns=cols)
    hit = rows[(rows["status"] == "ok") & rows["latency_median_s"].notna()]
    out = hit[["hardware", "profile", "notebook", "model", "dtype", "scenario", "latency_median_s", "latency_spread_s"]]
    return out.set_axis(cols, axis=1).sort_values(cols[:6]).reset_index(drop=True)


def timed_unit(scenario: str) -> str:
    """What a latency row's seconds are for: 'denoiser step' where its scenario names a step, else 'image'."""
    return "denoiser step" if "step" in scenario.split() else "image"


def latency_scenarios(reference_dir: Path = paths.REFERENCE_DIR) -> set[str]:
    """The scenarios whose latency some comparison reads (not those it reads compile seconds or memory from)."""
    comps = comparisons(reference_dir)
    timed = comps[comps["measured_field"].isin(["latency_median_s", "speedup"])]
    return (set(timed["measured_scenario"]) | set(timed["measured_base_scenario"])) - {""}


def provenance(rows: pd.DataFrame) -> pd.DataFrame:
    """Per hardware: the device, the profiles measured, torch versions, git revisions and the newest row's date."""
    cols = ["hardware", "device", "profiles", "torch", "git revisions", "newest row"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for hw, g in rows.groupby("hardware", sort=True):
        versions = g["versions"] if "versions" in g else pd.Series(dtype=object)
        torch_versions = {v.get("torch", "?") for v in versions if isinstance(v, dict)}
        devices = sorted(set(g["device_name"].dropna())) if "device_name" in g else []
        out.append({"hardware": hw, "device": ", ".join(devices) or "?",
                    "profiles": ", ".join(sorted(set(g["profile"]))),
                    "torch": ", ".join(sorted(torch_versions)) or "?",
                    "git revisions": len(set(g["git_rev"].dropna())) if "git_rev" in g else 0,
                    "newest row": str(g["timestamp"].max())[:10] if "timestamp" in g else "?"})
    return pd.DataFrame(out, columns=cols)


def skipped_grouped(skipped_rows: pd.DataFrame) -> pd.DataFrame:
    """skipped() folded by (hardware, notebook, status, reason): how many measurements, and which."""
    cols = ["hardware", "notebook", "status", "reason", "count", "scenarios"]
    if skipped_rows.empty:
        return pd.DataFrame(columns=cols)
    keys = ["hardware", "notebook", "status", "reason"]
    out = [dict(zip(keys, k)) | {"count": len(g), "scenarios": "; ".join(f"{sc} ({m})" for m, sc in
                                                                         zip(g["model"], g["scenario"]))}
           for k, g in skipped_rows.groupby(keys, sort=True)]
    return pd.DataFrame(out, columns=cols)


# Why a measurement was skipped, or a published figure is not reproduced, folded into a few kinds for notebook 11's
# short tables (the rows with their full reasons stay in report.md): (pattern searched in the reason, kind); the first
# pattern that matches gives the kind, and a reason no pattern matches is its own kind (nothing is hidden).
SKIP_KINDS: tuple[tuple[str, str], ...] = (
    (r"missing package|Hugging Face Hub at run time", "attention backend: package or Hub download absent"),
    (r"2 or more (GPUs|CUDA)|one GPU each", "needs two or more GPUs (this project's GPU runs had one)"),
    (r"offloaded pipeline did not run, as expected on a CPU",
     ("sequential offload: diffusers' enable_sequential_cpu_offload cannot run on a CPU (its device becomes cpu:0; "
      "a stand-in runs instead)")),
    (r"fastest (backend )?measured", "attention: no backend measurably beat native SDPA here, so nothing to switch"),
    (r"CUDA|NVIDIA GPU|No GPU found|accelerator|kernel for cpu|device is cpu",
     "needs a CUDA GPU (a kernel, a mode or GPU memory this machine lacks)"),
    (r"^fp32: eager rounds to no narrower dtype",
     "fp32: precision-cast emulation has no narrower dtype to emulate, so the run would repeat another"),
)
UNCOVERED_KINDS: tuple[tuple[str, str], ...] = (
    (r"one-GPU baseline", "a one-GPU baseline of a multi-GPU table (notebook 13's scaling model reads it)"),
    (r"needs \d+ (GPUs|H100s)", "needs several GPUs (this project's GPU runs had one)"),
    (r"FlashAttention-3", ("needs FlashAttention-3 or cache-dit (a Hub download or a source build; this "
                           "project's GPU runs had no network)")),
    (r"\bL20\b", "measured on an L20 (and a step cache's speedup needs the trained weights)"),
    (r"notebook 16 (asks|prints)", "another engine or workload than notebook 16's one step per lever (printed beside it)"),
    (r"Stable Diffusion 1\.5", "Stable Diffusion 1.5, not a model of this collection"),
    (r"ladder", "a single rung of diffusion-fast's ladder (the whole ladder is compared)"),
)


def reason_kind(reason: str, kinds: tuple[tuple[str, str], ...]) -> str:
    """The kind of the first pattern of kinds found in reason; else the reason's first clause (up to ':', ';' or '(')."""
    import re

    for pattern, kind in kinds:
        if re.search(pattern, str(reason)):
            return kind
    head = re.split(r": |; | \(", str(reason).strip(), maxsplit=1)[0]
    return head[:100] or "no reason recorded"


def by_reason(frame: pd.DataFrame, reason: str, kinds: tuple[tuple[str, str], ...], where: str,
              keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """frame folded by keys and the kind of its reason column: how many rows, and from where (the where column's
    values, each with its count), largest groups first."""
    cols = [*keys, "why", "count", where]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    kind = frame[reason].map(lambda r: reason_kind(r, kinds)).rename("why")
    out = []
    for key, g in frame.groupby([*(frame[k] for k in keys), kind], sort=False):
        key = key if isinstance(key, tuple) else (key,)
        counts = g[where].map(lambda v: str(v)[:2] if str(v)[:2].isdigit() else str(v)).value_counts()
        out.append(dict(zip([*keys, "why"], key, strict=True))
                   | {"count": len(g), where: ", ".join(f"{v} ×{n}" for v, n in counts.items())})
    return pd.DataFrame(out, columns=cols).sort_values([*keys, "count"], ascending=[True] * len(keys) + [False],
                                                      kind="stable").reset_index(drop=True)


READING_GUIDE = (
    "How to read a row: `measured / published` is the measured value divided by the published one. For a speedup "
    "or a ratio, above 1 means the effect measured here is larger than published (a larger speedup, or a larger "
    "memory or latency ratio); for seconds or GiB, above 1 means slower or more memory. The verdict is "
    "`within ±x%` when the factor lies in [1/(1+x), 1+x] (x is the row's band), otherwise `better than published` "
    "or `worse than published` in the comparison's own sense (faster, less memory, a larger speedup). A row is "
    "compared only on the hardware in `compared on` (any GPU, or the GPU model the source used), only from "
    "full-profile rows, only in the published dtype, and, for a stack of levers, only when the run had every lever "
    "of the published stack; otherwise the measured value is shown with the verdict `not compared` and its reason. "
    "`note` gives the remaining differences of setting.")
# The README's copy keeps the columns a reader compares; the full report adds notebook, band, note and gap cause.
BRIEF_COLUMNS: tuple[str, ...] = ("comparison", "source", "published", "measured", "measured / published", "verdict",
                                  "compared on")
BRIEF_GUIDE = READING_GUIDE.replace("`note` gives the remaining differences of setting.",
                                    "The full report adds each row's notebook, band, note on the setting and, for a "
                                    "verdict outside its band, the cause found.")


def factor_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """Measured/published factors of a compare() table side by side: one row per comparison, one column per hardware."""
    if table.empty:
        return pd.DataFrame()
    return table.pivot_table(index="comparison", columns="hardware", values="measured / published",
                             aggfunc="last", dropna=False).reindex(table["comparison"].unique())


def markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (index dropped, None/NaN as an em dash, pipes escaped)."""
    def cell(v: object) -> str:
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "—"
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines)


def not_measured_line(group: pd.DataFrame) -> str:
    """One line counting the comparisons of a compare() table (one hardware) that have no measurement, by reason."""
    left = group[group["measured"] == "—"]
    if left.empty:
        return ""
    return f"{len(left)} of {text.count(len(group), 'comparison')} not measured here: {_reasons(group)}."


def _reasons(group: pd.DataFrame) -> str:
    """Why a compare() table's unmeasured comparisons have no measurement: the one reason, or each with its count."""
    reasons = group.loc[group["measured"] == "—", "verdict"].str.removeprefix("not measured: ").value_counts()
    return reasons.index[0] if len(reasons) == 1 else "; ".join(f"{reason} ({n})" for reason, n in reasons.items())


def verdict_line(group: pd.DataFrame) -> str:
    """One line for a compare() table of one hardware: how many comparisons got a factor, and their verdicts."""
    factor = group["measured / published"].notna()
    within = group.loc[factor, "verdict"].str.startswith("within")
    other = group.loc[factor & ~group["verdict"].str.startswith("within"), "verdict"].value_counts()
    parts = [f"{int(factor.sum())} of {text.count(len(group), 'comparison')} compared: {int(within.sum())} within "
             "their band" + "".join(f", {n} {v}" for v, n in other.items())] if factor.any() else []
    shown = group.loc[~factor & (group["measured"] != "—"), "verdict"].value_counts()
    parts += [f"{n} {v}" for v, n in shown.items()]  # measured, not compared (another GPU class)
    return "; ".join(parts + ([rest] if (rest := not_measured_line(group)) else []))


def summary_markdown(table: pd.DataFrame, skipped_rows: pd.DataFrame, *, generated_by: str,
                     covered: pd.DataFrame | None = None, rows: pd.DataFrame | None = None,
                     brief: bool = False, full_report: str = "data/results/report.md") -> str:
    """The published-vs-measured comparison per hardware, what no notebook reproduces, and what was skipped.

    brief=True (the README's region) lists only the comparisons that have a measurement, with one line counting the
    rest by reason, and folds the figures no notebook reproduces and the skipped measurements into one line each,
    pointing to full_report (the full text, written with brief=False)."""
    if brief:
        return _brief_summary(table, skipped_rows, generated_by=generated_by, covered=covered, rows=rows,
                              full_report=full_report)
    parts = [f"_Generated by {generated_by} from the result rows under `data/results/`; do not edit by hand._"]
    if table.empty:
        return "\n\n".join(parts + ["No result rows yet: run `make reproduce`."])
    if rows is not None and not rows.empty:
        parts.append(_provenance_paragraph(rows))
    parts.append(READING_GUIDE)
    for hw, group in table.groupby("hardware", sort=True):
        compared = int(group["measured / published"].notna().sum())
        measured = int((group["measured"] != "—").sum())
        also = (f"; {measured - compared} more measured, not compared (the verdict says why)"
                if measured > compared else "")
        parts.append(f"### {hw}\n\n{compared} of {len(group)} comparisons with published figures measured and "
                     f"compared here{also}.\n\n" + markdown(group.drop(columns=["hardware"])))
    if covered is not None and not covered.empty:
        left = covered[covered["compared in"] == ""]
        parts.append(f"### Published figures no notebook reproduces\n\n{len(covered) - len(left)} of "
                     f"{len(covered)} published figures are used by the comparisons above; the others, and why:"
                     f"\n\n" + markdown(left[["source", "scenario", "published", "not reproduced because"]]))
    if not skipped_rows.empty:
        parts.append(f"### Skipped measurements\n\n{len(skipped_rows)} measurements were not made; each notebook "
                     "recorded why (its executed copy under `data/results/<hardware>/executed/` shows the cell):\n\n"
                     + markdown(skipped_grouped(skipped_rows)))
    return "\n\n".join(parts)


def _provenance_paragraph(rows: pd.DataFrame) -> str:
    """Where the rows come from, and whether a full-profile (GPU) run exists."""
    prov = provenance(rows)
    full = sorted(prov.loc[prov["profiles"].str.contains("full"), "hardware"])
    return (("Full-profile rows (the published workloads) come from: " + ", ".join(full) + "." if full else
             "**No full-profile (GPU) run is committed yet**, so no published figure has a measurement beside it. "
             "The rows are smoke-profile runs of tiny models: they check mechanisms (parity, recompiles, graph "
             "breaks, byte counts), not speed. `docs/gpu-plan.md` lists the GPU runs that fill the table.")
            + "\n\n" + markdown(prov))


def _brief_summary(table: pd.DataFrame, skipped_rows: pd.DataFrame, *, generated_by: str,
                   covered: pd.DataFrame | None, rows: pd.DataFrame | None, full_report: str) -> str:
    """summary_markdown(brief=True): measured comparisons only, everything else counted in one line each."""
    parts = [(f"_Generated by {generated_by} from the result rows under `data/results/`; do not edit by hand. "
              f"The full report, every comparison included, is `{full_report}`._")]
    if table.empty:
        return "\n\n".join(parts + ["No result rows yet: run `make reproduce`."])
    if rows is not None and not rows.empty:
        parts.append(_provenance_paragraph(rows))
    if table["measured / published"].notna().any():
        parts.append(BRIEF_GUIDE)
    for hw, group in table.groupby("hardware", sort=True):
        measured = group[group["measured"] != "—"]
        measured = measured[[c for c in BRIEF_COLUMNS if c in measured]]
        compared = int(group["measured / published"].notna().sum())
        section = f"### {hw}\n\n"
        if not measured.empty:
            also = (f"; {len(measured) - compared} more measured, not compared (the verdict says why)"
                    if len(measured) > compared else "")
            section += (f"{compared} of {len(group)} comparisons with published figures measured and compared "
                        f"here{also}:\n\n" + markdown(measured) + "\n\n")
        parts.append(section + not_measured_line(group))
    if covered is not None and not covered.empty:
        left = int((covered["compared in"] == "").sum())
        parts.append(f"{len(covered) - left} of {len(covered)} published figures are used by the comparisons; the "
                     f"other {left}, each with the reason no notebook reproduces it, are listed in the full report.")
    if not skipped_rows.empty:
        counts = skipped_rows.groupby("hardware").size()
        parts.append(f"{len(skipped_rows)} measurements were not made ("
                     + ", ".join(f"{n} on {hw}" for hw, n in counts.items())
                     + "); each notebook recorded why, and the full report lists them by reason.")
    return "\n\n".join(parts)


def replace_readme_region(text: str, region: str, markers: tuple[str, str] = (README_START, README_END)) -> str:
    """text with everything between the markers (the results region by default) replaced by region, markers kept."""
    return readme_region.replace(text, region, markers)


def write_readme_region(readme: Path, region: str, markers: tuple[str, str] = (README_START, README_END)) -> bool:
    """Rewrite one generated region of the README (the results region by default); True when the file changed."""
    return readme_region.write(readme, region, markers)


TLDR_MARKERS = readme_region.markers("tldr")
# The README's headline: what each line says, and the comparison whose committed GPU figure and published one it gives
TLDR_LINES: tuple[tuple[str, str], ...] = (
    ("Flux-1-Dev, 1024x1024, 28 steps, eager bf16, against the guide's H100 figure", "eager-latency"),
    ("the same, against SGLang's H200 figure", "eager-latency-sglang"),
    ("`torch.compile` of the DiT, speedup per image (03)", "compile-speedup-sglang"),
    ("regional compilation, full / regional cold compile (04)", "regional-cold-compile-ratio"),
    ("regional compilation, steady speed regional / full (04)", "regional-steady-ratio"),
)
# Notebook 15's goals (issue 38), stated as goals until a GPU run of 15 (group G10) measures the recipe
RECIPE_GOALS = "at most 3.6 s per image lossless and 2.0 s lossy on one H100 (notebook 15; not measured yet)"


def readme_tldr(reference_dir: Path = paths.REFERENCE_DIR, results_dir: Path = paths.RESULTS_DIR) -> str:
    """The README's TL;DR: each headline comparison as the committed GPU rows give it (headline), then the recipe's
    goals; made from the rows, so a new GPU run changes it (python -m helpers.report rewrites it)."""
    lines = [f"- {label}: {headline(cid, reference_dir, results_dir)}" for label, cid in TLDR_LINES]
    return "\n".join([*lines, f"- the recipe's goals: {RECIPE_GOALS}"])



def factor_figure(table: pd.DataFrame, tolerance: dict[str, float], hardware: str) -> plt.Figure:
    """Measured/published factor per measured comparison on one hardware (log scale), each with its tolerance band
    shaded; the comparisons without a measurement are counted in the title. Raises if none is measured."""
    group = table[table["hardware"] == hardware].reset_index(drop=True)
    left = int(group["measured / published"].isna().sum())
    group = group[group["measured / published"].notna()].reset_index(drop=True)
    if group.empty:
        raise ValueError(f"no comparison is measured on {hardware}: nothing to plot")
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(group) + 1.6))
    for i, r in group.iterrows():
        tol = tolerance.get(r["comparison"], 0.0)
        ax.fill_betweenx([i - 0.4, i + 0.4], 1 / (1 + tol), 1 + tol, color="#55A868", alpha=0.25, lw=0)
        factor, inside = r["measured / published"], str(r["verdict"]).startswith("within")
        ax.plot([factor], [i], "o" if inside else "D", color="#4C72B0" if inside else "#C44E52")
        ax.annotate(f"{factor:.2f}" + ("" if inside else f" ({r['verdict']})"), (factor, i),
                    textcoords="offset points", xytext=(6, 0), va="center", fontsize=8)
    ax.axvline(1.0, color="#333", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlim(0.25, 4)
    ticks = [0.25, 0.5, 0.8, 1, 1.25, 2, 4]  # plain numbers; log-scale minor labels overlapped ('3x10^-1 4x10^-1')
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_yticks(range(len(group)), group["comparison"])
    ax.invert_yaxis()
    ax.set_xlabel("measured / published (1 = as published; shaded: tolerance band; red: outside it)")
    ax.set_title(f"Published vs measured on {hardware}" + (f" ({left} more without a factor)" if left else ""))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


if __name__ == "__main__":  # python -m helpers.report: rewrite the README's TL;DR from the committed rows
    print("README.md", "rewritten" if write_readme_region(paths.ROOT / "README.md", readme_tldr(), TLDR_MARKERS)
          else "unchanged")
