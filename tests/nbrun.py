"""Run a notebook with papermill on the smoke profile into a temporary folder and read back its rows; or run only its
parameters and setup cells in this process, to check that a bad knob is refused there."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import papermill

from helpers import paths, results

CELL_TIMEOUT_S = 900


@dataclass
class NotebookRun:
    """An executed notebook and the rows it wrote."""

    notebook: nbformat.NotebookNode
    rows: pd.DataFrame
    results_dir: Path
    figures_dir: Path

    def row(self, scenario: str) -> pd.Series:
        """The single row of a scenario (fails if there is not exactly one)."""
        hit = self.rows[self.rows["scenario"] == scenario]
        assert len(hit) == 1, f"expected one row {scenario!r}, found {len(hit)}: {sorted(self.rows['scenario'])}"
        return hit.iloc[0]

    def checks(self) -> dict[str, dict[str, Any]]:
        """The notebook's Checks table as it recorded it (row 'checks'): claim -> {measured, expected, holds}."""
        return {c["claim"]: c for c in self.row("checks")["extra"]["checks"]}

    def text(self) -> str:
        """All text outputs of the executed notebook, for assertions on what it printed."""
        out = []
        for cell in self.notebook.cells:
            for o in cell.get("outputs", []):
                out.append(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")))
        return "\n".join(out)


def run_notebook(name: str, tmp_path: Path, **parameters: Any) -> NotebookRun:
    """Execute notebooks/<name>.ipynb on the smoke profile (plus parameters) with kernel python3."""
    res, figs = tmp_path / "results", tmp_path / "figures"
    params = {"PROFILE": "smoke", "RESULTS_DIR": str(res), "FIGURES_DIR": str(figs)} | parameters
    out = tmp_path / f"{name}.executed.ipynb"
    papermill.execute_notebook(
        str(paths.NOTEBOOKS_DIR / f"{name}.ipynb"), str(out), parameters=params, kernel_name="python3",
        cwd=str(paths.NOTEBOOKS_DIR), execution_timeout=CELL_TIMEOUT_S, progress_bar=False,
    )
    return NotebookRun(nbformat.read(out, as_version=4), results.read_rows(res, notebook=name), res, figs)


def run_setup(name: str, tmp_path: Path, **parameters: Any) -> dict[str, Any]:
    """Execute only the parameters cell, papermill's overrides and the setup cell of notebooks/<name>.ipynb, here.

    The setup cell is where every knob is validated, so a refusal shows here exactly as in a kernel (the same
    source, the same order as papermill's injected cell), without a kernel start and the imports that cost a
    papermill run 10-15 s. Returns the cells' namespace.
    """
    nb = nbformat.read(paths.NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    res, figs = tmp_path / "results", tmp_path / "figures"
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with contextlib.chdir(paths.NOTEBOOKS_DIR):
        exec(compile(code[first].source, f"<{name} parameters>", "exec"), namespace)  # noqa: S102 (the notebook's own cell)
        namespace |= {"PROFILE": "smoke", "RESULTS_DIR": str(res), "FIGURES_DIR": str(figs)} | parameters
        exec(compile(code[first + 1].source, f"<{name} setup>", "exec"), namespace)  # noqa: S102
    return namespace
