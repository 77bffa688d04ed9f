"""Notebook 06 on the smoke profile: planted graph breaks found, fullgraph=True fails, fixes remove them."""

import pytest

from helpers import compile_tools, params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook


# make test compiles with aot_eager: the breaks, their reasons and their fixes are dynamo's, the same on any backend;
# make test-all also runs inductor, the default
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_graph_break_rows(tmp_path, backend):
    nb = run_notebook("06_graph_breaks", tmp_path, COMPILE_BACKEND=backend)
    for scenario in ("denoiser compiled, planted breaks (fullgraph=False)", "denoiser compiled, fixed (fullgraph=True)"):
        assert nb.row(scenario)["extra"]["backend"] == backend, scenario
    planted, fixed = nb.row("find breaks: planted"), nb.row("find breaks: fixed")
    found = planted["extra"]
    assert found["explain_breaks"] > 0 and found["counter_graph_breaks"] > 0 and found["explain_graphs"] > 1
    assert all(n > 0 for n in found["kinds_found"].values()), found["kinds_found"]
    assert len(found["kinds_found"]) == 4 and found["log_lines"] > 0
    # each count says what it counts: kinds_found is dynamo's counter entries per planted kind (both keys), the
    # same figures as Going deeper's table; explain's reasons per kind add up to explain's list, without the logger
    by_key = found["counts_by_kind_and_key"]
    assert found["kinds_found"] == {kind: sum(n for k, n in by_key.items() if k.startswith(f"{kind} / "))
                                    for kind in found["kinds_found"]}, (found["kinds_found"], by_key)
    explain_by_kind = found["explain_reasons_by_kind"]
    assert sum(explain_by_kind.values()) == found["explain_reasons"] and explain_by_kind["logger call in forward"] == 0
    # the find-breaks rows leave the table's one graph-break column to the two compiles (counting()'s figure)
    find_rows = nb.rows[nb.rows["scenario"].str.startswith("find breaks") | nb.rows["scenario"].str.startswith("return")]
    assert len(find_rows) == 4 and find_rows["graph_breaks"].isna().all(), find_rows[["scenario", "graph_breaks"]]
    # explain: breaks = graphs - 1, reasons only for graphs ending at a break; the counters count more than 4
    assert found["explain_breaks"] == found["explain_graphs"] - 1 > found["explain_reasons"] > 0
    assert found["counter_graph_breaks"] + found["counter_unimplemented"] > 4, "the counters count more than 4 lines"
    assert by_key.get("data-dependent branch / unimplemented", 0) >= 1
    assert "data-dependent branch / graph_break" not in by_key, "the branch is counted under unimplemented only"
    # the transformer's forward (a loop over blocks) is given up and run eagerly
    assert found["loop_entries"] >= 1 and any(f.startswith("forward (transformer_flux.py")
                                              for f in found["frames_given_up"]), found["frames_given_up"]
    # the two settings the break messages suggest remove their own breaks and leave the other two
    by_settings = nb.row("find breaks: after the two settings")["extra"]
    assert by_settings["kinds_found"][".item() in attention processor"] == 0
    assert by_settings["kinds_found"]["logger call in forward"] == 0
    assert by_settings["kinds_found"]["print in attention processor"] > 0
    assert by_settings["kinds_found"]["data-dependent branch"] > 0
    assert fixed["extra"]["explain_breaks"] == fixed["extra"]["counter_graph_breaks"] == 0
    assert fixed["extra"]["explain_graphs"] == 1
    assert fixed["extra"]["counter_unimplemented"] == 0 and fixed["extra"]["log_lines"] == 0
    assert fixed["extra"]["frames_given_up"] == []
    dataclass_out = nb.row("return_dict=True: fixed")["extra"]
    assert dataclass_out["output_is_dataclass"] is True and dataclass_out["output_type"] == "Transformer2DModelOutput"
    assert dataclass_out["explain_graphs"] == 1
    assert dataclass_out["explain_breaks"] == dataclass_out["counter_graph_breaks"] == 0

    fail, ok = nb.row("fullgraph=True: planted"), nb.row("fullgraph=True: fixed")
    assert fail["extra"]["fullgraph_ok"] is False and "Unsupported" in fail["extra"]["error_head"]
    assert ok["extra"]["fullgraph_ok"] is True and ok["extra"]["error_head"] == ""

    broken = nb.row("denoiser compiled, planted breaks (fullgraph=False)")
    whole = nb.row("denoiser compiled, fixed (fullgraph=True)")
    assert broken["extra"]["graphs"] > 1 and broken["graph_breaks"] > 0 and broken["recompiles"] == 0
    assert whole["extra"]["graphs"] == 1 and whole["graph_breaks"] == 0 and whole["recompiles"] == 0
    for scenario in ("denoiser eager", "denoiser compiled, planted breaks (fullgraph=False)",
                     "denoiser compiled, fixed (fullgraph=True)"):
        row = nb.row(scenario)
        assert row["status"] == "ok" and row["latency_median_s"] > 0 and len(row["latency_samples_s"]) == 3

    parity_row = nb.row("parity vs fp32")
    parity = parity_row["extra"]
    # the run's dtype: DTYPE="auto" is bf16 on a CPU with AVX512-BF16 or AMX (this machine), fp32 on one without
    tolerance = compile_tools.PARITY_TOLERANCE[parity_row["dtype"]]
    assert parity_row["status"] == "ok", "on a CPU the blockwise fp32 reference always runs"
    # relative L2 throughout; the bound is the triangle inequality's: err_eager + tolerance (1 + err_eager)
    err_eager = parity["errors_vs_fp32"]["eager"]
    assert parity["tolerance"] == tolerance and parity["bound"] == pytest.approx(err_eager + tolerance * (1 + err_eager))
    assert parity["errors_vs_fp32"]["compiled, fixed"] <= parity["bound"]
    assert parity["errors_vs_fp32"]["compiled, planted breaks"] <= parity["bound"]
    assert 0 < parity["fp32_upcast_bytes"]
    vs_eager = nb.row("parity vs eager")["extra"]
    assert vs_eager["tolerance"] == tolerance and all(e <= tolerance for e in vs_eager["l2_vs_eager"].values())
    assert "pipeline, fixed compiled transformer" not in set(nb.rows["scenario"]), "the gallery's row records it"
    assert set(nb.rows["run_id"]) == {planted["run_id"]}
    text = nb.text()
    assert "Nothing to compare" in text, "no published figure covers graph breaks"
    assert "not in explain's list: logger call in forward (its break ends no graph" in text
    assert "reasons in explain's list" in text and "dynamo's counter entries" in text
    graphs, entries = int(broken["extra"]["graphs"]), int(broken["graph_breaks"])
    assert f"{graphs} graphs, {entries} break entries in dynamo's counters" in text
    assert "graph breaks (counter entries, compiling call)" in text
    # the CPU's cost of the breaks, as measured: the two medians' difference, the graphs, the frames run eagerly;
    # only where the run tells the two steps apart (else the line before says they are not)
    found = nb.row("find breaks: planted")["extra"]
    assert "microseconds" not in text
    cost = (f"{found['explain_graphs']} graphs with Python between, {len(found['frames_given_up'])} frames run "
            "eagerly") in text and "with breaks minus without: " in text
    assert cost != ("the break-free compiled step and the compiled step with breaks are not told apart" in text)
    assert "one more compiled call (0 graphs compiled): the .item() processor got last_std = " in text
    claims = nb.checks()  # the Checks cell's table, every claim held (the cell raises otherwise)
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    assert {"planting the debug code leaves the eager output bit-identical",
            "dynamo's counters find every planted kind",
            "fullgraph=True raises on the planted model",
            "the two settings remove the .item() and logger breaks, and only those",
            "after the four fixes: one graph, no break, nothing under `unimplemented`",
            "fullgraph=True compiles the fixed model as one graph, and the timed calls recompile nothing",
            "pipe(prompt=...) runs on the compiled graph without compiling another",
            f"each compiled output is within the {parity_row['dtype']} tolerance of eager (relative L2)",
            "no compiled output is further from fp32 than eager + the tolerance allows (relative L2)",
            "the data-dependent branch is filed under `unimplemented` only",
            "the graph_breaks log gives at least one hint",
            "the captured .item() still reaches the processor in compiled calls"} <= set(claims)
    assert claims["pipe(prompt=...) runs on the compiled graph without compiling another"]["measured"] == "0"
    # 25 claims of the notebook, plus the one the Checks cell adds for the shown image (helpers.gallery.claim)
    assert len(claims) == 26, sorted(claims)
    shown = nb.row("shown: pipeline with the fixed, compiled transformer")["extra"]
    assert shown["judged"] is True and [g["holds"] for g in shown["grid"]] == [True], shown
    assert claims["every image shown reads as its prompt's digit (a grid row: at least its floor)"]["holds"]
    assert (nb.figures_dir / "cpu" / "06_graph_breaks_latency.png").stat().st_size > 1000


@pytest.mark.parametrize("knob, value, allowed", [
    ("LOG_LINES", 0, r"LOG_LINES=0 must be a positive integer"),
    ("MODEL", "sdxl", r"MODEL='sdxl' is not allowed; choose one of: 'flux-dev'"),
    ("PROMPT", "", r"PROMPT='' is not allowed; use a non-empty string"),
    ("COMPILE_BACKEND", "cudagraphs", r"COMPILE_BACKEND='cudagraphs' is not allowed; choose one of: 'inductor'"),
])
def test_bad_knob_fails_fast(tmp_path, knob, value, allowed):
    with pytest.raises(params.ParameterError, match=allowed):
        run_setup("06_graph_breaks", tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
