"""Notebook 11 against temporary result folders: CPU rows only, then a synthetic full-profile GPU fixture.

Both row sets are TEST FIXTURES written into pytest's tmp_path (never into data/results): the CPU rows by the
project's own ResultWriter on a smoke run, the GPU rows as plain dicts with made-up values chosen to land
inside and outside the tolerance bands. The README is never rewritten: the notebook updates a temporary copy.
"""

import shutil

import pandas as pd
import pytest
import torch

from helpers import environment, params, paths, report, results
from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook
NB = "11_reproduction_report"


def _cpu_fixture(results_dir):
    """Smoke rows as the notebooks write them: one ok latency row and one skipped row."""
    card = environment.environment_card(torch.device("cpu"), torch.float32)
    run = params.resolve("00_setup_and_baseline", PROFILE="smoke", RESULTS_DIR=str(results_dir))
    results.ResultWriter(run, card).record("pipeline eager", compile_s=None)
    run8 = params.resolve("08_cpu_offload", PROFILE="smoke", RESULTS_DIR=str(results_dir))
    results.ResultWriter(run8, card).record("model cpu offload", status="skipped", reason="needs CUDA (fixture)")


def _gpu_fixture(results_dir):
    """TEST FIXTURE, synthetic: full-profile rows on a pretend 'h100-80gb' for notebooks 00, 03 and 10."""
    base = {"hardware": "h100-80gb", "profile": "full", "model": "flux-dev", "status": "ok", "reason": "",
            "dtype": "bf16", "run_id": "fixture-run", "latency_spread_s": 0.01, "peak_memory_bytes": None}
    rows = {
        "00_setup_and_baseline": [{"scenario": "pipeline eager", "latency_median_s": 6.9, "peak_memory_bytes": 34 * 2**30}],
        "03_torch_compile": [{"scenario": "pipeline eager", "latency_median_s": 6.9},
                             {"scenario": "pipeline compiled (default, no precision-cast emulation)",
                              "latency_median_s": 4.6, "extra": {"speedup": 6.9 / 4.6}}],
        "10_lora_hotswap": [{"scenario": "pipeline lora eager", "latency_median_s": 8.0},
                            {"scenario": "pipeline lora hotswap compiled", "latency_median_s": 4.4},
                            {"scenario": "pipeline lora compiled (no hotswap)", "latency_median_s": 8.0}],
    }
    for notebook, items in rows.items():
        results.append_rows(results_dir / "h100-80gb" / f"{notebook}.jsonl",
                            [base | {"notebook": notebook} | r for r in items])


def _readme_copy(tmp_path):
    copy = tmp_path / "README.md"
    shutil.copy(paths.ROOT / "README.md", copy)
    return copy


def test_report_on_cpu_rows_only(tmp_path):
    res = tmp_path / "results"
    _cpu_fixture(res)
    readme = _readme_copy(tmp_path)
    original = readme.read_text()
    real_readme = (paths.ROOT / "README.md").read_text()
    nb = run_notebook(NB, tmp_path, RESULTS_DIR=str(res), UPDATE_README=True, README_PATH=str(readme))
    row = nb.row("report")["extra"]
    assert row["hardwares"] == ["cpu"] and row["measured"] == 0 and row["factors"] == {}
    assert row["comparisons"] == len(report.comparisons()), "every comparison is listed for the CPU"
    assert all(v.startswith("not measured") for v in row["verdicts"].values()), row["verdicts"]
    assert row["skipped"] == 1 and row["readme_updated"] is True
    md = (res / "report.md").read_text()
    assert "needs CUDA (fixture)" in md and "not measured: smoke profile only" in md
    assert len(pd.read_csv(res / "report.csv")) == row["comparisons"]
    new = readme.read_text()
    start, end = original.index(report.README_START), original.index(report.README_END)
    assert new.startswith(original[:start]) and new.endswith(original[end:]), "text outside the markers changed"
    # the README's region: no table of unmeasured comparisons, one line counting them, the full report named
    region = new[new.index(report.README_START):new.index(report.README_END)]
    n = row["comparisons"]
    assert "### cpu" in region and f"{n} of {n} comparisons not measured here: " in region
    assert "smoke profile only (tiny models) (" in region and "no rows (" in region  # counted by reason
    assert "| comparison |" not in region and "report.md" in region and "needs CUDA" not in region
    assert (paths.ROOT / "README.md").read_text() == real_readme, "the test rewrote the real README"
    claims = nb.checks()
    assert all(c["holds"] for c in claims.values()) and {
        "every committed verdict outside its band has its cause in gaps.csv", "every published figure is compared or explained",
        "every skipped measurement has a reason"} <= set(claims)
    assert "no comparison has a measurement yet" in nb.text() and "no factor to plot" in nb.text()
    # the TL;DR: the project's committed rows counted per machine in the setup cell, whatever RESULTS_DIR reads
    committed = report.compare(results.read_rows(paths.RESULTS_DIR))
    for hw, group in committed.groupby("hardware"):
        assert f"TL;DR, {hw}: {report.verdict_line(group)}" in nb.text(), hw


def test_report_on_gpu_fixture(tmp_path):
    res = tmp_path / "results"
    _gpu_fixture(res)
    readme = _readme_copy(tmp_path)
    nb = run_notebook(NB, tmp_path, RESULTS_DIR=str(res), UPDATE_README=True, README_PATH=str(readme))
    row = nb.row("report")["extra"]
    assert row["hardwares"] == ["h100-80gb"] and row["readme_updated"] is True
    v, f = row["verdicts"], row["factors"]
    # 6.9 s vs 6.7 s published, same GPU class: an absolute comparison inside the 15% band.
    assert v["h100-80gb/eager-latency"] == "within ±15%" and f["h100-80gb/eager-latency"] == pytest.approx(6.9 / 6.7, abs=1e-3)
    # speedups: 6.9/4.6 = 1.50x vs 6.7/4.5 = 1.49x; LoRA 8.0/4.4 = 1.82x vs 7.891/5.085 = 1.55x.
    assert v["h100-80gb/compile-speedup"] == "within ±15%"
    assert f["h100-80gb/lora-hotswap-speedup"] == pytest.approx((8.0 / 4.4) / (7.891 / 5.085), abs=1e-3)
    # no speedup at all without hot-swap (8.0/8.0 = 1x vs 1.55x published): outside the band, on the bad side.
    assert v["h100-80gb/lora-compile-no-hotswap-speedup"] == "worse than published"
    # 34 GiB vs 33 GB read as GiB: within 10%.
    assert v["h100-80gb/eager-peak-memory"] == "within ±10%"
    # notebooks without rows stay unmeasured on that GPU too.
    assert any(k.startswith("h100-80gb/") and x == "not measured: no rows" for k, x in v.items())
    assert (nb.figures_dir / "h100-80gb" / f"{NB}_factors.png").stat().st_size > 1000
    # key latencies are plotted per machine and dtype (the fixture's rows are all bf16)
    assert (nb.figures_dir / "h100-80gb" / f"{NB}_key_latencies_bf16.png").stat().st_size > 1000
    assert "within ±15%" in (res / "report.md").read_text()
    # the README lists the measured comparisons only, and counts the rest in one line
    region = readme.read_text().split(report.README_START)[1].split(report.README_END)[0]
    listed = [line.split(" | ")[0].lstrip("| ") for line in region.splitlines() if line.startswith("| ")]
    assert {f.split("/")[1] for f in row["factors"]} <= set(listed) and "eager-latency" in listed
    assert "nf4-latency" not in listed and f"{len(row['factors'])} of {row['comparisons']} comparisons" in region
    # a figure measured on another GPU class than the published one (SGLang's H200 seconds, here on an H100) is
    # listed with its value and no factor; only the comparisons without a value are counted as unmeasured
    no_value = sum(x.startswith("not measured") for x in v.values())
    assert no_value < row["comparisons"] - len(row["factors"])
    assert f"{no_value} of {row['comparisons']} comparisons not measured here" in region
    assert "eager-latency-sglang" in listed and v["h100-80gb/eager-latency-sglang"].startswith("not compared")
    assert all(c["holds"] for c in nb.checks().values())


def test_brief_summary_lists_measured_comparisons_and_counts_the_rest():
    """Unit test of report.summary_markdown(brief=True) on planted compare() tables, no notebook run."""
    table = pd.DataFrame([
        {"hardware": "h100", "comparison": "a", "measured": "1.53x", "measured / published": 1.02,
         "verdict": "within ±15%"},
        {"hardware": "h100", "comparison": "b", "measured": "—", "measured / published": None,
         "verdict": "not measured: no rows"},
        {"hardware": "h100", "comparison": "c", "measured": "—", "measured / published": None,
         "verdict": "not measured: no rows"},
        {"hardware": "h100", "comparison": "d", "measured": "5.10 s", "measured / published": None,
         "verdict": "not compared: published on H200, measured on h100"},
        {"hardware": "cpu", "comparison": "a", "measured": "—", "measured / published": None,
         "verdict": "not measured: smoke profile only (tiny models)"}])
    assert report.not_measured_line(table[table["hardware"] == "h100"]) == (
        "2 of 4 comparisons not measured here: no rows.")
    assert report.not_measured_line(table[table["comparison"] == "a"].iloc[:1]) == ""
    text = report.summary_markdown(table, pd.DataFrame(), generated_by="t", brief=True, full_report="r.md")
    assert "| a | 1.53x | 1.02 | within ±15% |" in text and "| b |" not in text and "`r.md`" in text
    assert "| d | 5.10 s | — | not compared" in text  # measured on another GPU class: shown, not divided
    assert "1 of 4 comparisons with published figures measured and compared here; 1 more measured, not compared" in text
    assert "1 of 1 comparison not measured here: smoke profile only" in text
    assert report.BRIEF_GUIDE in text and report.READING_GUIDE not in text
    only_cpu = report.summary_markdown(table[table["hardware"] == "cpu"], pd.DataFrame(), generated_by="t",
                                       brief=True)
    assert report.BRIEF_GUIDE not in only_cpu and "| comparison |" not in only_cpu
    # the README's table keeps seven columns; notebook, band, note and the gap's cause stay in the full report
    wide = table.assign(notebook="00", source="s", published="1.50x", band="±15%", note="n", **{"compared on": "GPU",
                                                                                                "why the gap": "g"})
    header = next(ln for ln in report.summary_markdown(wide, pd.DataFrame(), generated_by="t", brief=True,
                                                       full_report="r.md").splitlines() if ln.startswith("| comp"))
    assert header == "| " + " | ".join(report.BRIEF_COLUMNS) + " |", header
    assert "| a | s | 1.50x | 1.53x | 1.02 | within ±15% | GPU |" in report.summary_markdown(
        wide, pd.DataFrame(), generated_by="t", brief=True, full_report="r.md")


def test_reasons_fold_by_kind_and_nothing_is_hidden():
    """Unit test of the short tables of sections 3 and 4 (report.reason_kind, report.by_reason), on planted reasons."""
    kinds = report.SKIP_KINDS
    assert report.reason_kind("Sage Attention backend 'sage' is not usable because of missing package", kinds) \
        == "attention backend: package or Hub download absent"
    assert report.reason_kind("context parallelism needs 2 or more GPUs; this machine has 1", kinds).startswith(
        "needs two or more GPUs")
    assert report.reason_kind("model offload moves weights ...; this machine has no CUDA GPU", kinds).startswith(
        "needs a CUDA GPU")
    assert report.reason_kind("RuntimeError: No GPU found. A GPU is needed for quantization.", kinds).startswith(
        "needs a CUDA GPU")  # bitsandbytes' words (16's NF4 cells), once a bare "RuntimeError" kind
    assert report.reason_kind("fp32: eager rounds to no narrower dtype, so the emulation changes no kernel", kinds) \
        .startswith("fp32: precision-cast emulation has no narrower dtype")
    # a reason no pattern knows is its own kind: its first clause, not a catch-all that hides it
    assert report.reason_kind("the offloaded pipeline did not run: TypeError: new() ...", kinds) == \
        "the offloaded pipeline did not run"
    assert report.reason_kind("needs 4 H100s; the lent machines have one", report.UNCOVERED_KINDS).startswith(
        "needs several GPUs")
    # a one-GPU baseline named with its multi-GPU table is not a figure that needs several GPUs
    assert report.reason_kind("xDiT's one-GPU baseline for its multi-GPU table", report.UNCOVERED_KINDS).startswith(
        "a one-GPU baseline")
    gaps = pd.DataFrame({"hardware": ["cpu"] * 4, "status": ["skipped", "skipped", "skipped", "failed"],
                         "notebook": ["14_x", "14_x", "02_y", "08_z"],
                         "reason": ["backend 'a' is not usable because of missing package",
                                    "downloads its kernel from the Hugging Face Hub at run time",
                                    "torch has no sdpa-cudnn kernel for cpu bfloat16", "it did not run: TypeError"]})
    folded = report.by_reason(gaps, "reason", kinds, "notebook", keys=("hardware", "status"))
    assert int(folded["count"].sum()) == len(gaps) and len(folded) == 3
    hub = folded[folded["why"].str.startswith("attention backend")].iloc[0]
    assert hub["count"] == 2 and hub["notebook"] == "14 ×2"
    # the notebook's claim that the folded tables count every row can fail: a row without a hardware is not counted
    planted = gaps.assign(hardware=["cpu", None, "cpu", "cpu"])
    assert int(report.by_reason(planted, "reason", kinds, "notebook", keys=("hardware", "status"))["count"].sum()) \
        == len(gaps) - 1


def test_verdict_line_counts_the_verdicts_of_one_machine():
    table = pd.DataFrame([
        {"comparison": "a", "measured": "1.5x", "measured / published": 1.02, "verdict": "within ±15%"},
        {"comparison": "b", "measured": "1.1x", "measured / published": 0.7, "verdict": "worse than published"},
        {"comparison": "c", "measured": "5.1 s", "measured / published": None,
         "verdict": "not compared: published on H100, measured on h200"},
        {"comparison": "d", "measured": "—", "measured / published": None, "verdict": "not measured: no rows"}])
    assert report.verdict_line(table) == (
        "2 of 4 comparisons compared: 1 within their band, 1 worse than published; 1 not compared: published on H100, "
        "measured on h200; 1 of 4 comparisons not measured here: no rows.")
    assert report.verdict_line(table.iloc[3:]) == "1 of 1 comparison not measured here: no rows."  # no "0 compared"
