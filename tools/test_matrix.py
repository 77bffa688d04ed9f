"""Run every notebook on the smoke profile over a matrix of the parameters a learner may change, and tabulate.

    python tools/test_matrix.py                      # every notebook, seeds 0-4, MODEL=sdxl, each DTYPE
    python tools/test_matrix.py --only 10 --seeds 0-9 --out /tmp/matrix.md
    python tools/test_matrix.py --only 04 --axes dtype   # only the DTYPE columns
    make test-matrix MATRIX_ARGS="--only 02,10 --jobs 2"

Each cell of the table is one papermill run of a notebook with PROFILE="smoke", its RESULTS_DIR and FIGURES_DIR
in a temporary folder (never the project's data/results or figures), and one setting changed from the
notebook's defaults. A cell reads:

- ok: the notebook ran to the end (every claim it asserts held);
- refused: the setup cell raised helpers.params.ParameterError (a value the notebook does not support, refused
  before any work, naming what is allowed) and nothing was written under the results folder;
- FAILED: anything else (an assertion, an exception in a later cell, a ParameterError raised after the setup
  cell, a refusal that wrote rows, a timeout). A failed cell is a bug to fix at its cause.

Axes (--seeds, default 0-4): SEED=<each seed> at the notebook's own MODEL and DTYPE; MODEL="sdxl"; DTYPE= each of
"fp32", "fp16", "bf16". Every axis runs on every notebook, so a notebook that does not offer SDXL or a dtype shows
it is refused up front. A setting equal to the notebook's defaults and an earlier cell (DTYPE="bf16" is the seed-0
run where bf16 is the default, as in 09) runs once and is shown in both places. Most notebooks default to
DTYPE="auto" (bf16 where native, else fp32), so the seed columns test "auto" and the DTYPE columns each format.

Two notebooks are special:

- 04_regional_compilation spawns fresh Python processes that compile and time the denoiser, and asserts that a
  regional cold compile beats a full one and a warm start beats a cold one. Those are timing claims, so a run of
  04 never shares the CPU with another matrix cell: with --jobs > 1 it runs alone. Its axes are the same as
  everyone's (each seed draws other random weights and inputs for the child processes' parity checks).
- 11_reproduction_report measures nothing; it reads rows. It runs after every other notebook, on a temporary
  copy of the project's data/results plus the rows this matrix run wrote, so it reports on real rows of several
  seeds, models and dtypes without touching the project's folder. Its SEED, MODEL and DTYPE are documented as
  ignored; the matrix runs them anyway (cheap) to show that changing them breaks nothing.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = ROOT / "notebooks"
DTYPES = ("fp32", "fp16", "bf16")
EXCLUSIVE = ("04",)  # runs alone: it times compiles in child processes (see the module docstring)
REPORT = "11"  # reads the rows of the others: runs last
CELL_TIMEOUT_S = 900  # papermill's per-cell limit, as in tests/nbrun.py


@dataclass(frozen=True)
class Setting:
    """One column of the table: a label and the parameters it changes."""

    label: str
    params: dict[str, Any]


@dataclass
class Outcome:
    """What one notebook run under one setting gave."""

    status: str  # "ok", "refused" or "failed"
    message: str = ""
    seconds: float = 0.0
    shared_with: str = ""  # label of the earlier setting whose run this cell reuses
    extra: dict[str, Any] = field(default_factory=dict)


def parse_seeds(text: str) -> list[int]:
    """'0-4' or '0,3,7' or '0-2,9' -> list of ints, in order, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        values = range(int(lo), int(hi) + 1) if hi else [int(lo)]
        seeds += [s for s in values if s not in seeds]
    if not seeds:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: no seed given")
    return seeds


AXES = ("seeds", "model", "dtype")


def parse_axes(text: str) -> tuple[str, ...]:
    """'seeds,dtype' -> ("seeds", "dtype"), in the table's order; an unknown axis is an error naming the allowed."""
    asked = {a.strip() for a in text.split(",") if a.strip()}
    unknown = sorted(asked - set(AXES))
    if unknown or not asked:
        raise argparse.ArgumentTypeError(f"--axes {text!r}: choose from {', '.join(AXES)}")
    return tuple(a for a in AXES if a in asked)


def settings(seeds: list[int], axes: tuple[str, ...] = AXES) -> list[Setting]:
    """The matrix's columns: one per seed, then MODEL=sdxl, then one per dtype (only the axes asked for)."""
    cols = [Setting(f"seed {s}", {"SEED": s}) for s in seeds] if "seeds" in axes else []
    cols += [Setting("MODEL=sdxl", {"MODEL": "sdxl"})] if "model" in axes else []
    cols += [Setting(f"DTYPE={d}", {"DTYPE": d}) for d in DTYPES] if "dtype" in axes else []
    return cols


def notebook_defaults(path: Path) -> dict[str, Any]:
    """The parameters cell's values, as papermill reads them."""
    import papermill

    found = papermill.inspect_notebook(str(path))
    out = {}
    for name, p in found.items():
        try:
            out[name] = ast.literal_eval(p["default"])
        except (ValueError, SyntaxError):
            out[name] = p["default"]
    return out


def setup_cell_source(path: Path) -> str:
    """Source of the setup cell: the second code cell (the first is the parameters cell)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"][1].source


def _files_under(folder: Path) -> list[str]:
    """Files under folder (relative names), empty if it does not exist."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def run_cell(path: Path, params: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Execute one notebook with papermill (in this process) and classify the outcome; returns a JSON-able dict."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    res, figs = workdir / "results", workdir / "figures"
    full = {"PROFILE": "smoke", "RESULTS_DIR": str(res), "FIGURES_DIR": str(figs)} | params
    start = time.perf_counter()
    try:
        papermill.execute_notebook(str(path), str(workdir / "executed.ipynb"), parameters=full,
                                   kernel_name="python3", cwd=str(path.parent), progress_bar=False,
                                   execution_timeout=CELL_TIMEOUT_S)
        status, message = "ok", ""
    except PapermillExecutionError as err:
        in_setup = err.source.strip() == setup_cell_source(path).strip()
        message = f"{err.ename}: {err.evalue}".strip()
        where = "setup cell" if in_setup else f"cell {err.exec_count}"
        if err.ename == "ParameterError" and in_setup:
            written = _files_under(res)
            status = "failed" if written else "refused"
            if written:
                message = f"refused in the setup cell but wrote {written}: {message}"
        else:
            status, message = "failed", f"{where}: {message}"
    except Exception as err:  # noqa: BLE001 (a kernel death or a timeout is a failed cell, with its message)
        status, message = "failed", f"{type(err).__name__}: {err}"
    seconds = time.perf_counter() - start
    return {"status": status, "message": message, "seconds": seconds}


def _run_in_subprocess(notebook: str, params: dict[str, Any], workdir: Path, timeout_s: float,
                       threads: int | None) -> Outcome:
    """run_cell in a child Python, so a crash or a hang ends that cell only (killed after timeout_s)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MPLBACKEND="Agg")
    if threads:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", notebook, json.dumps(params), str(workdir)]
    start = time.perf_counter()
    with open(workdir / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return Outcome("failed", f"timed out after {timeout_s:.0f} s", time.perf_counter() - start)
    result = workdir / "outcome.json"
    if not result.is_file():
        tail = (workdir / "log.txt").read_text()[-400:]
        return Outcome("failed", f"runner exited {proc.returncode} without an outcome: {tail}",
                       time.perf_counter() - start)
    data = json.loads(result.read_text())
    return Outcome(data["status"], data["message"], data["seconds"])


def _collect_rows(workroot: Path, into: Path) -> int:
    """Append the rows every finished cell wrote (results/<hardware>/<notebook>.jsonl) into a results folder."""
    count = 0
    for jsonl in sorted(workroot.glob("*/results/*/*.jsonl")):  # the report's own folder is "rows", not matched
        target = into / jsonl.parent.name / jsonl.name
        target.parent.mkdir(parents=True, exist_ok=True)
        text = jsonl.read_text()
        with open(target, "a") as f:
            f.write(text if text.endswith("\n") or not text else text + "\n")
        count += sum(1 for line in text.splitlines() if line.strip())
    return count


def _short(text: str, limit: int = 300) -> str:
    """One line, at most limit characters, with '|' escaped for markdown."""
    line = " ".join(text.split())
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    return line.replace("|", "\\|")


def markdown_table(notebooks: list[str], cols: list[Setting], outcomes: dict[tuple[str, str], Outcome],
                   wall_s: float, header: str) -> str:
    """The matrix as markdown: one row per notebook, a cell per setting, footnotes with the messages."""
    notes: dict[str, str] = {}
    lines = [header, "", "| notebook | " + " | ".join(c.label for c in cols) + " | run time (s) |",
             "|---|" + "---|" * len(cols) + "---:|"]
    for nb in notebooks:
        cells, total = [], 0.0
        for c in cols:
            o = outcomes.get((nb, c.label))
            if o is None:
                cells.append("not run")
                continue
            total += 0.0 if o.shared_with else o.seconds
            text = {"ok": "ok", "refused": "refused", "failed": "**FAILED**"}[o.status]
            if o.message:
                key = f"{o.status[0]}{1 + sum(k.startswith(o.status[0]) for k in notes)}"
                found = next((k for k, v in notes.items() if v == o.message and k[0] == o.status[0]), None)
                if found is None:
                    notes[key] = o.message
                    found = key
                text += f" ({found})"
            if o.shared_with:
                text += f" = {o.shared_with}"
            cells.append(text)
        lines.append(f"| {nb} | " + " | ".join(cells) + f" | {total:.0f} |")
    failed = sum(o.status == "failed" for o in outcomes.values())
    refused = sum(o.status == "refused" for o in outcomes.values())
    ok = sum(o.status == "ok" for o in outcomes.values())
    summary = (f"{ok} ok, {refused} refused in the setup cell, {failed} failed; wall time {wall_s:.0f} s "
               f"({wall_s / 60:.1f} min).")
    lines += ["", summary, ""]
    if notes:
        lines.append("Messages (r: refused in the setup cell, f: failed):")
        lines.append("")
        lines += [f"- {k}: {_short(v)}" for k, v in notes.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the matrix, print and write the table; exit 1 if any cell failed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated notebook numbers, e.g. 02,10 (default: all)")
    ap.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-4"), help="e.g. 0-4 or 0,3,7 (default 0-4)")
    ap.add_argument("--axes", type=parse_axes, default=AXES, help="comma-separated columns to run: seeds, model, "
                                                                  "dtype (default: all three)")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks run at once (default 1; 04 always runs alone)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as markdown to this file")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before one run is killed (default 3600)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep executed notebooks and rows here "
                                                              "(default: a temporary folder, deleted at the end)")
    ap.add_argument("--cell", nargs=3, metavar=("NOTEBOOK", "PARAMS_JSON", "WORKDIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.cell:  # child mode: one papermill run, outcome written as JSON
        notebook, params, workdir = args.cell
        outcome = run_cell(NOTEBOOKS_DIR / f"{notebook}.ipynb", json.loads(params), Path(workdir))
        (Path(workdir) / "outcome.json").write_text(json.dumps(outcome))
        return 0

    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    all_nbs = sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    wanted = [x.strip().zfill(2) for x in args.only.split(",") if x.strip()]
    unknown = [w for w in wanted if not any(nb.startswith(w + "_") for nb in all_nbs)]
    if unknown:
        ap.error(f"--only: no notebook numbered {unknown}; have {[nb[:2] for nb in all_nbs]}")
    notebooks = [nb for nb in all_nbs if not wanted or nb[:2] in wanted]
    cols = settings(args.seeds, args.axes)

    # one run per distinct set of effective parameters; cells equal to an earlier one share its run
    runs: list[tuple[str, Setting]] = []
    shared: dict[tuple[str, str], str] = {}
    for nb in notebooks:
        defaults, seen = notebook_defaults(NOTEBOOKS_DIR / f"{nb}.ipynb"), {}
        for c in cols:
            key = json.dumps(defaults | c.params, sort_keys=True, default=str)
            if key in seen:
                shared[(nb, c.label)] = seen[key]
            else:
                seen[key] = c.label
                runs.append((nb, c))

    keep = args.workdir is not None
    workroot = (args.workdir.resolve() if keep else Path(tempfile.mkdtemp(prefix="test_matrix_")))
    workroot.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    print(f"test matrix: {len(notebooks)} notebooks x {len(cols)} settings = {len(runs)} runs "
          f"(+{len(shared)} cells that repeat a run), jobs={args.jobs}, work folder {workroot}", flush=True)

    outcomes: dict[tuple[str, str], Outcome] = {}
    lock = threading.Lock()
    started = time.perf_counter()

    def one(nb: str, c: Setting) -> None:
        slug = f"{nb[:2]}_{c.label.replace(' ', '').replace('=', '_')}"
        params = dict(c.params)
        if nb[:2] == REPORT:  # RESULTS_DIR: a copy of the project's rows plus the rows this matrix wrote
            rows_dir = workroot / slug / "rows"
            if (ROOT / "data" / "results").is_dir():
                shutil.copytree(ROOT / "data" / "results", rows_dir, dirs_exist_ok=True)
            _collect_rows(workroot, rows_dir)
            params["RESULTS_DIR"] = str(rows_dir)
        o = _run_in_subprocess(nb, params, workroot / slug, args.timeout, threads)
        if nb[:2] == REPORT and o.status == "refused":
            o = Outcome("failed", "the report refused parameters it documents as ignored: " + o.message, o.seconds)
        with lock:
            outcomes[(nb, c.label)] = o
            done = len(outcomes)
            msg = f": {_short(o.message, 200)}" if o.message else ""
            print(f"[{done}/{len(runs)} {time.perf_counter() - started:6.0f} s] {nb} {c.label}: {o.status} "
                  f"({o.seconds:.0f} s){msg}", flush=True)

    ordinary = [r for r in runs if r[0][:2] not in EXCLUSIVE and r[0][:2] != REPORT]
    exclusive = [r for r in runs if r[0][:2] in EXCLUSIVE]
    report_runs = [r for r in runs if r[0][:2] == REPORT]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda r: one(*r), ordinary))
    for r in exclusive:  # alone on the machine: 04 times compiles
        one(*r)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda r: one(*r), report_runs))
    wall = time.perf_counter() - started

    for (nb, label), first in shared.items():
        o = outcomes[(nb, first)]
        outcomes[(nb, label)] = Outcome(o.status, o.message, o.seconds, shared_with=first)
    import torch

    from helpers import environment

    axes = f"seeds {args.seeds}" if "seeds" in args.axes else "no seed column"
    axes += "" if args.axes == AXES else f" (axes: {', '.join(args.axes)})"
    header = (f"Test matrix, smoke profile, {time.strftime('%Y-%m-%d %H:%M')}: {axes}, jobs {args.jobs}, "
              f"{os.cpu_count()} CPU cores, torch {torch.__version__}, CUDA: {torch.cuda.is_available()}\n\n"
              f"Hardware: {environment.cpu_note()}")
    table = markdown_table(notebooks, cols, outcomes, wall, header)
    print()
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
        print(f"table written to {args.out}")
    if not keep:
        shutil.rmtree(workroot, ignore_errors=True)
    return 1 if any(o.status == "failed" for o in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
