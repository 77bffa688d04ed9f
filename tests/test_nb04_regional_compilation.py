"""Notebook 04 on the smoke profile: cold full vs regional compile in fresh processes, warm start from artifacts."""

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook


def test_regional_compilation_rows(tmp_path):
    nb = run_notebook("04_regional_compilation", tmp_path)
    full, regional = nb.row("full compile (cold cache)"), nb.row("regional compile (cold cache)")
    warm, warm_dir = nb.row("regional compile (warm cache)"), nb.row("regional compile (warm cache dir)")
    for r in (full, regional, warm, warm_dir):
        assert r["status"] == "ok" and r["profile"] == "smoke"
        assert r["extra"]["rel_error"] <= r["extra"]["tolerance"] == 3e-2, r["scenario"]
        assert r["recompiles"] == 0 and r["compile_s"] > r["latency_median_s"] > 0
        assert r["extra"]["process_wall_s"] > r["compile_s"]
    assert full["extra"]["how"] == "full"
    assert regional["extra"]["how"] == warm["extra"]["how"] == warm_dir["extra"]["how"] == "regional"
    # the smoke model has Flux-1-Dev's depth (19 + 38 blocks), and regional cold compile beats the full one
    assert all(r["extra"]["blocks"] == [19, 38] for r in (full, regional, warm, warm_dir))
    assert regional["compile_s"] < full["compile_s"]
    # regional traces each block class once: fewer ops than the whole model
    assert regional["extra"]["ops_captured"] < full["extra"]["ops_captured"]
    # one warm start loads the artifacts the cold regional run saved; on a CPU they do not hold the C++ kernels
    assert regional["extra"]["artifacts_saved_bytes"] > 0 and warm["extra"]["artifacts_loaded"] is True
    assert regional["extra"]["kernel_files_built"] > 0 and warm["extra"]["kernel_files_built"] > 0
    # the other starts from a copy of the cold run's cache directory: no kernel built, and faster than cold
    assert warm_dir["extra"]["kernel_files_built"] == 0 and warm_dir["extra"]["artifacts_loaded"] is False
    assert warm_dir["compile_s"] < regional["compile_s"]
    check = nb.row("recompile limit check")
    assert check["extra"]["recompile_limit"] == 2 and check["extra"]["graphs"] == 3
    ratios = nb.row("regional vs full")["extra"]
    assert ratios["full_cold_over_regional_cold"] == pytest.approx(full["compile_s"] / regional["compile_s"])
    assert (nb.figures_dir / "cpu" / "04_regional_compilation_compile_latency.png").stat().st_size > 1000
    assert "not measured" in nb.text()


def test_bad_blocks_fail_fast(tmp_path):
    with pytest.raises(Exception, match=r"BLOCKS=\[3\]: a list \[double, single\]"):
        run_notebook("04_regional_compilation", tmp_path, BLOCKS=[3])
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
