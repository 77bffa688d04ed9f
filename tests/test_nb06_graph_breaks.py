"""Notebook 06 on the smoke profile: planted graph breaks found, fullgraph=True fails, fixes remove them."""

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook


def test_graph_break_rows(tmp_path):
    nb = run_notebook("06_graph_breaks", tmp_path)
    planted, fixed = nb.row("find breaks: planted"), nb.row("find breaks: fixed")
    assert planted["graph_breaks"] > 0 and planted["extra"]["explain_graphs"] > 1
    assert all(n > 0 for n in planted["extra"]["kinds_found"].values()), planted["extra"]["kinds_found"]
    assert len(planted["extra"]["kinds_found"]) == 4 and planted["extra"]["log_lines"] > 0
    assert fixed["graph_breaks"] == 0 and fixed["extra"]["explain_graphs"] == 1
    assert fixed["extra"]["counter_unimplemented"] == 0 and fixed["extra"]["log_lines"] == 0

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
    assert broken["compile_s"] > 0 and whole["compile_s"] > 0

    parity = nb.row("parity vs fp32")["extra"]
    assert parity["errors_vs_fp32"]["compiled, fixed"] <= parity["bound"]
    assert parity["errors_vs_fp32"]["compiled, planted breaks"] <= parity["bound"]
    assert set(nb.rows["run_id"]) == {planted["run_id"]}
    assert (nb.figures_dir / "cpu" / "06_graph_breaks_latency.png").stat().st_size > 1000
