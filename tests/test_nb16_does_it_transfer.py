"""Notebook 16 on the smoke profile: the levers of make test's subset (transfer.QUICK_LEVERS; make test-matrix runs
them all) on Flux-1-Dev, Qwen-Image and FLUX.2 [dev]; the table's cells against the rows, and what diffusers 0.42.1
and torchao 0.18 answer on a CPU."""

import pytest

from helpers import compile_tools, params, paths, transfer
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

NB = "16_does_it_transfer"
QUICK = list(transfer.QUICK_LEVERS)


def test_does_it_transfer(tmp_path):
    nb = run_notebook(NB, tmp_path, LEVERS=QUICK)
    rows = nb.rows
    assert set(rows["profile"]) == {"smoke"} and set(rows["model"]) == {"all"}
    tol = compile_tools.PARITY_TOLERANCE[rows["dtype"].iloc[0]]
    levered = rows[rows["extra"].map(lambda e: "lever" in e)]
    cells = {(e["lever"], e["model_tested"]): transfer.cell_from_row({"extra": e}) for e in levered["extra"]}
    assert set(cells) == {(lever, m) for lever in QUICK for m in transfer.MODELS} and len(levered) == len(cells)

    # every cell follows from what it measured, every "works" passes its check, and the file says what the rows say
    table = (nb.results_dir / "transfer-table.md").read_text()
    assert table.startswith("# Does it transfer?") and "smoke profile" in table
    for key, cell in cells.items():
        assert transfer.verdict_holds(cell, tol), key
        assert transfer.works_problems(cell, tol) == [], key
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {cell.lever} |"))
        assert cell.text(limit=transfer.TABLE_LIMIT) in line, (key, line)

    # what the libraries answer here, model by model
    for model in transfer.MODELS:
        compiled = cells[("compile", model)]
        assert compiled.works and compiled.measured["graphs"] == 1 and compiled.measured["graph_breaks"] == 0
        assert cells[("int8", model)].works and cells[("attention backends", model)].works
        assert {"native", "_native_math"} <= set(cells[("attention backends", model)].measured["ran"])
        assert cells[("fp8", model)].outcome == "refused here" and "compute capability" in cells[("fp8", model)].message
        assert cells[("nf4", model)].outcome == "refused here" and "No GPU found" in cells[("nf4", model)].message
        offload = cells[("model offload", model)]
        assert offload.outcome == "refused here" and "requires accelerator" in offload.message
    cache = "first-block cache"
    assert cells[(cache, "flux-dev")].works and cells[(cache, "qwen-image")].works
    # Flux2Pipeline calls its transformer without a cache context, which First Block Cache (and TaylorSeer) need; inside
    # the one the error asks for, diffusers 0.42.1's First Block Cache trips over FLUX.2's two block kinds
    fbc = cells[(cache, "flux2-dev")]
    assert fbc.outcome == "fails" and "TypeError" in fbc.message
    assert fbc.measured["change"] == transfer.CACHE_CONTEXT_LINE and "No cache context is set" in fbc.measured[
        "plain_error"]
    # the smoke profile's compile seconds are dynamo's trace on the eager backend, and say so
    assert "cold trace (dynamo, eager backend)" in cells[("compile", "flux-dev")].text()
    assert "only on the full profile" in table and "the same at any size" not in table
    skipped = rows[rows["status"] == "skipped"]
    assert len(skipped) == 3 * len(transfer.MODELS) and (skipped["reason"].str.len() > 20).all()

    claims = nb.checks()
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    working = {lever for (lever, _), c in cells.items() if c.outcome in transfer.WORKING}  # the others: nothing to check
    assert "compile" in working and {f"{lever}: every cell that says works passes its check" for lever in working} == {
        c for c in claims if c.endswith("every cell that says works passes its check")}
    assert "every cell's outcome follows from what it measured" in claims
    shown = nb.row("shown: Qwen-Image, First Block Cache on")
    assert not shown["extra"]["judged"] and "noise by design" in shown["extra"]["reason_not_judged"]
    assert "not measured" in nb.text() or "tiny model" in nb.text()
    # the TL;DR counts: the committed table's (read from the project's rows) and this run's, from the same cells
    assert f"TL;DR, {transfer.committed_counts(paths.RESULTS_DIR)}" in nb.text()
    assert f"this run: {transfer.counts_line(list(cells.values()))}" in nb.text()


@pytest.mark.parametrize("knob, value, message", [
    ("LEVERS", ["teleport"], "LEVERS contains"),
    ("COMPILER", "tensorrt", "COMPILER="),
    ("MODEL", "sd3", "MODEL="),
    ("WEIGHTS", "Qwen/Qwen-Image", "MODEL='all'"),
    ("SIZES", [100], "SIZES="),
    ("CACHE_STEPS", 0, "CACHE_STEPS="),
    ("TABLE_FILE", "table.txt", "TABLE_FILE="),
])
def test_bad_knobs_fail_fast(tmp_path, knob, value, message):
    with pytest.raises(params.ParameterError, match=message):
        run_setup(NB, tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
