"""Notebook 03 on the smoke profile: cold compile of the denoiser, parity with eager, the pipeline's first call
and later calls compile nothing, a CUDA-graph mode recorded as skipped on a CPU, and a bad MODES fails fast."""

import math

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook

NO_EMULATION = "default, no precision-cast emulation"


def test_torch_compile_rows(tmp_path):
    nb = run_notebook("03_torch_compile", tmp_path)
    eager_pipe, eager_step = nb.row("pipeline eager"), nb.row("denoiser step eager")
    assert eager_pipe["status"] == eager_step["status"] == "ok" and eager_pipe["profile"] == "smoke"
    step, whole = nb.row("denoiser step compiled (default)"), nb.row("pipeline compiled (default)")
    plain = nb.row(f"denoiser step compiled ({NO_EMULATION})")
    assert step["status"] == whole["status"] == plain["status"] == "ok"
    for row in (step, plain):
        # one full graph, compiled cold: inductor's cache was consulted and nothing hit
        assert row["extra"]["graphs_first_call"] >= 1 and row["graph_breaks"] == 0
        assert row["extra"]["cache_hits_first_call"] == 0 and row["extra"]["cache_misses_first_call"] >= 1
        # nothing compiled on the second and later calls; the first call includes compilation
        assert row["recompiles"] == 0
        assert row["compile_s"] > row["latency_median_s"] > 0
        assert row["extra"]["finite"] is True and math.isfinite(row["extra"]["rel_error"])
        assert row["extra"]["speedup"] == pytest.approx(eager_step["latency_median_s"] / row["latency_median_s"])
    # the pipeline's own first call reuses the graph compiled on denoiser_inputs, and later calls compile nothing
    assert whole["extra"]["graphs_first_call"] == 0 and whole["recompiles"] == 0
    # parity with eager within the bf16 tolerance, with precision-cast emulation on
    assert step["extra"]["emulate_precision_casts"] is True and plain["extra"]["emulate_precision_casts"] is False
    assert 0 <= step["extra"]["rel_error"] <= step["extra"]["tolerance"] == 3e-2
    # no emulation: measured and printed, no pipeline row (its compile is only the parity comparison)
    assert plain["extra"]["rel_error"] >= 0
    assert f"{plain['extra']['rel_error']:.2e} without" in nb.text()
    assert (nb.rows["scenario"] == f"pipeline compiled ({NO_EMULATION})").sum() == 0
    # a CUDA-graph mode on a CPU: skipped with the reason, for both workloads
    for what in ("denoiser step", "pipeline"):
        skipped = nb.row(f"{what} compiled (reduce-overhead)")
        assert skipped["status"] == "skipped" and "CUDA" in skipped["reason"]
    # speedups are recorded consistently with the medians (no direction asserted on a CPU)
    assert whole["extra"]["speedup"] == pytest.approx(eager_pipe["latency_median_s"] / whole["latency_median_s"])
    assert 0 < step["extra"]["fraction_of_peak"] < 1.5
    assert step["extra"]["flops_per_step"] == eager_step["extra"]["flops_per_step"] > 0
    assert (nb.figures_dir / "cpu" / "03_torch_compile_pipeline_latency.png").stat().st_size > 1000
    assert "not measured" in nb.text()


@pytest.mark.parametrize(("modes", "message"), [
    (["fast"], (r"MODES contains \['fast'\]; each entry must be one of: 'default', 'reduce-overhead', "
                r"'max-autotune-no-cudagraphs', 'max-autotune'")),
    (["reduce-overhead"], r"none can run on cpu; add 'default' or 'max-autotune-no-cudagraphs'"),
])
def test_bad_modes_fail_fast(tmp_path, modes, message):
    with pytest.raises(Exception, match=message):
        run_notebook("03_torch_compile", tmp_path, MODES=modes)
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
