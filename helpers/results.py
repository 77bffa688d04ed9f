"""Result rows: one per measurement, appended atomically under <results>/<hardware>/<notebook>.jsonl."""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from helpers import paths
from helpers.environment import EnvironmentCard
from helpers.measure import MEMORY_LABELS, Memory, Timing
from helpers.params import Run

SCHEMA_VERSION = 1
STATUSES: tuple[str, ...] = ("ok", "skipped", "oom", "failed")


@dataclass
class Row:
    """One measurement. Fields that do not apply stay None; 'extra' holds notebook-specific values."""

    notebook: str
    scenario: str
    status: str
    reason: str
    model: str
    profile: str
    weights: str
    dtype: str
    hardware: str
    device_name: str
    steps: int
    height: int
    width: int
    latency_median_s: float | None = None
    latency_spread_s: float | None = None
    latency_samples_s: list[float] | None = None
    timing_method: str | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    compile_s: float | None = None
    recompiles: int | None = None
    graph_breaks: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    peak_tflops: float | None = None
    gpu_memory_cap_gib: float | None = None  # GPU_MEMORY_GIB: the run stood for a card of this memory
    git_rev: str = "unknown"
    run_id: str = ""
    timestamp: str = ""
    schema: int = SCHEMA_VERSION


def _clean(value: Any) -> Any:
    """Make a value JSON-safe: tensors and numpy scalars to Python, NaN/inf to strings."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows to a JSON-lines file atomically: earlier lines are kept, a crash leaves the old file, and two
    processes appending to the same file at once (the GPU check runs notebooks side by side) take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _append_locked(path, rows)


def _append_locked(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """append_rows' work, under its lock."""
    old = path.read_bytes() if path.exists() else b""
    if old and not old.endswith(b"\n"):
        raise ValueError(f"{path} does not end with a newline; refusing to append to a damaged results file")
    new = "".join(json.dumps(_clean(r), sort_keys=True) + "\n" for r in rows).encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(old + new)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _weights_label(weights: str) -> str:
    """WEIGHTS as a row keeps it: a local folder inside the project relative to its root, else as given."""
    return paths.relative(Path(weights)) if Path(weights).is_absolute() else weights


class ResultWriter:
    """Writes the rows of one notebook run; every row carries the run's id, card and parameters."""

    def __init__(self, run: Run, card: EnvironmentCard) -> None:
        """Prepare a writer for run on the hardware the card describes; nothing is written yet."""
        self.run, self.card = run, card
        self.run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
        self.path = run.results_dir / card.hardware / f"{run.notebook}.jsonl"
        self.rows: list[Row] = []

    def record(
        self,
        scenario: str,
        *,
        timing: Timing | None = None,
        memory: Memory | None = None,
        status: str = "ok",
        reason: str = "",
        **fields: Any,
    ) -> Row:
        """Build a row from the measurements given and append it to the results file at once."""
        if status not in STATUSES:
            raise ValueError(f"status={status!r}; allowed: {STATUSES}")
        if status != "ok" and not reason:
            raise ValueError(f"a row with status {status!r} needs a reason")
        s = self.run.settings
        base = {
            "steps": s.steps, "height": s.height, "width": s.width, "dtype": self.run.dtype_name, "model": self.run.model,
        }
        known = {f for f in Row.__dataclass_fields__}
        extra = {k: v for k, v in fields.items() if k not in known}
        base.update({k: v for k, v in fields.items() if k in known})
        row = Row(
            notebook=self.run.notebook, scenario=scenario, status=status, reason=reason,
            profile=self.run.profile, weights=_weights_label(self.run.weights), hardware=self.card.hardware,
            device_name=self.card.device_name, versions=self.card.versions, git_rev=self.card.git_rev,
            peak_tflops=self.card.peak_tflops, gpu_memory_cap_gib=self.run.gpu_memory_gib, run_id=self.run_id,
            timestamp=datetime.now(UTC).isoformat(timespec="seconds"), **base,
        )
        row.extra.update(extra)
        if timing is not None:
            row.latency_median_s, row.latency_spread_s = timing.median_s, timing.spread_s
            row.latency_samples_s, row.timing_method = list(timing.samples_s), timing.method
            row.extra.setdefault("warmup", timing.warmup)  # the timed repeats are len(latency_samples_s)
        if memory is not None:
            row.peak_memory_bytes, row.memory_kind = memory.peak_bytes, memory.kind
        append_rows(self.path, [asdict(row)])
        self.rows.append(row)
        return row

    def frame(self) -> pd.DataFrame:
        """This run's rows as a DataFrame with the columns read_rows gives (for report.compare and plots)."""
        return pd.DataFrame([asdict(r) for r in self.rows])

    def table(self) -> pd.DataFrame:
        """This run's rows as a display table: units in the column names, 4 significant digits, '—' for none."""
        return readable(rows_table(pd.DataFrame([asdict(r) for r in self.rows])))


def set_aside(path: Path) -> None:
    """Move an existing executed notebook into previous/ beside it, stamped with its time, so a rerun keeps it."""
    if path.exists():
        stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC).strftime("%Y%m%dT%H%M%SZ")
        (path.parent / "previous").mkdir(exist_ok=True)
        os.replace(path, path.parent / "previous" / f"{path.stem}.{stamp}{path.suffix}")


def strip_root(notebook: Path) -> bool:
    """Write an executed notebook without the absolute folder it ran in (papermill's input_path names it): each path
    under that folder becomes relative to it, so a committed copy names no machine's paths. True if it changed."""
    text = notebook.read_text()
    ran_in = json.loads(text).get("metadata", {}).get("papermill", {}).get("input_path") or ""
    root = ran_in.rpartition("/notebooks/")[0]
    if not root.startswith("/") or root not in text:
        return False
    notebook.write_text(re.sub(re.escape(root) + r"(?![\w.-])", ".", text.replace(root + "/", "")))
    return True


def read_rows(results_dir: Path, *, hardware: str | None = None, notebook: str | None = None,
              latest_run_only: bool = True) -> pd.DataFrame:
    """All rows under results_dir (optionally one hardware / notebook); by default only the latest run of each
    (hardware, notebook, model, profile), so a later smoke or SDXL run does not hide a full or Flux one."""
    pattern = f"{hardware or '*'}/{notebook or '*'}.jsonl"
    records = []
    for path in sorted(Path(results_dir).glob(pattern)):
        with open(path) as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}:{i} is not a JSON row: {err}") from err
    df = pd.DataFrame(records)
    if df.empty or not latest_run_only:
        return df
    keys = [k for k in ("hardware", "notebook", "model", "profile") if k in df]
    latest = df.groupby(keys, dropna=False)["run_id"].transform("max")
    return df[df["run_id"] == latest].reset_index(drop=True)


def rows_table(df: pd.DataFrame) -> pd.DataFrame:
    """Compact display of rows: scenario, status (and a probe's outcome), latency (ms when every one is below a
    second, else s; with what was timed where a row tags it: extra 'timed', else a whole image), spread (same unit,
    from two samples on), peak memory (MiB or GiB), compile (s), and the reason of a row not ok (a reason said before
    points at its first row)."""
    if df.empty:
        return df
    out = pd.DataFrame({"scenario": df["scenario"], "status": df["status"]})
    extra = df["extra"] if "extra" in df else pd.Series([{}] * len(df), index=df.index)
    outcome = extra.map(lambda e: (e or {}).get("verdict", (e or {}).get("outcome")))  # a probe's words first
    if outcome.notna().any():  # a probe's verdict (notebook 16): 'ok' is the measurement, this is what it found
        out["outcome"] = outcome
    latency = df["latency_median_s"].astype(float)
    time_unit, per_s = ("ms", 1e3) if latency.max() < 1 else ("s", 1.0)  # 3.41 ms, not 0.003405 s
    out[f"latency median ({time_unit})"] = latency * per_s
    timed = extra.map(lambda e: (e or {}).get("timed"))
    if timed.notna().any():  # a notebook timing other things than whole images tags those rows timed='...'
        out["timed"] = timed.fillna("whole image").where(latency.notna())
    samples = df["latency_samples_s"] if "latency_samples_s" in df else pd.Series([None] * len(df), index=df.index)
    timed_twice = samples.map(lambda x: isinstance(x, list | tuple) and len(x) > 1)
    out[f"spread max-min ({time_unit})"] = df["latency_spread_s"].astype(float).where(timed_twice) * per_s  # 1 sample: none
    peak = df["peak_memory_bytes"].astype(float)
    unit, scale = ("GiB", 2**30) if peak.max() >= 2**30 else ("MiB", 2**20)  # 3.7 MiB, not 0.003706 GiB
    kinds = sorted(set(df["memory_kind"].dropna())) if "memory_kind" in df else []
    labels = [MEMORY_LABELS.get(k, k) for k in kinds]  # 'CPU memory the call allocated, ...', not the raw key
    out[f"peak memory ({unit}{'; ' + '; '.join(labels) if labels else ''})"] = peak / scale
    out["compile (s)"] = df["compile_s"]
    for col in ("recompiles", "graph_breaks"):
        if df[col].notna().any():
            out[col.replace("_", " ")] = df[col]
    if (df["status"] != "ok").any() or df["reason"].fillna("").astype(bool).any():  # an ok row may say why too
        first = {}  # a reason repeated word for word reads once, later rows point at it
        out["reason"] = [None if not r else r if first.setdefault(r, i) == i else f"as row {first[r]}"
                         for i, r in zip(out.index, df["reason"].fillna(""), strict=True)]
    return out.dropna(axis=1, how="all")


def readable(df: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """df for display: whole-number floats (counts, bytes) as integers, other floats to `digits` significant digits,
    missing values as '—'."""
    def fmt(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "—"
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.{digits}g}" if isinstance(v, float) else v
    return df.map(fmt)
