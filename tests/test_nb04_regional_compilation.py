"""Notebook 04 on the smoke profile: cold full vs regional compile in fresh processes running the notebook's recipe
lines, steady speedups over eager timed in turn in one process, warm start from artifacts and from a cache
directory."""

import pytest

from helpers import compile_tools, params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook


def test_regional_compilation_rows(tmp_path):
    nb = run_notebook("04_regional_compilation", tmp_path)
    full, regional = nb.row("full compile (cold cache)"), nb.row("regional compile (cold cache)")
    warm, warm_dir = nb.row("regional compile (warm cache)"), nb.row("regional compile (warm cache dir)")
    for r in (full, regional, warm, warm_dir):
        x = r["extra"]
        assert r["status"] == "ok" and r["profile"] == "smoke"
        assert x["rel_error"] <= x["tolerance"] == compile_tools.PARITY_TOLERANCE[r["dtype"]], r["scenario"]
        assert r["recompiles"] == 0 and r["latency_median_s"] > 0
        # eager steady steps timed in the same process, and the speedup derived from them
        assert len(x["eager_samples_s"]) == len(r["latency_samples_s"]) and x["eager_latency_median_s"] > 0
        assert x["speedup_vs_eager"] == pytest.approx(x["eager_latency_median_s"] / r["latency_median_s"])
    assert full["extra"]["how"] == "full"
    assert regional["extra"]["how"] == warm["extra"]["how"] == warm_dir["extra"]["how"] == "regional"
    # the smoke model has Flux-1-Dev's depth (19 + 38 blocks), and regional cold compile beats the full one
    assert all(r["extra"]["blocks"] == [19, 38] for r in (full, regional, warm, warm_dir))
    assert regional["compile_s"] < full["compile_s"]
    # regional traces each block class once: fewer ops than the whole model
    assert regional["extra"]["ops_captured"] < full["extra"]["ops_captured"]
    # cold first calls find nothing in inductor's FX-graph / AOTAutograd caches; warm ones hit them
    for r in (full, regional):
        assert r["extra"]["first_call_cache_hits"] == 0 and r["extra"]["first_call_cache_misses"] > 0, r["scenario"]
    for r in (warm, warm_dir):
        assert r["extra"]["first_call_cache_hits"] > 0, r["scenario"]
    # steady step, profiled: one compiled region per step for the full compile, one per block for the regional
    # one, with one guard lookup each, and the code around the blocks runs eagerly only in the regional compile
    one = {how: nb.row(f"{how} step (one process)") for how in ("eager", "full", "regional")}
    for r in (full, one["full"]):
        fp = r["extra"]["step_profile"]
        assert fp["region_calls"] == fp["guard_calls"] == 1 and fp["eager_ops_outside"] == 0, fp
    for r in (regional, warm, warm_dir, one["regional"]):
        p = r["extra"]["step_profile"]
        assert p["region_calls"] == p["guard_calls"] == 57 and p["eager_ops_outside"] > 0, (r["scenario"], p)
        assert p["wall_s"] > p["graph_s"] > 0 and p["region_wrapper_s"] > 0 and p["guard_s"] > 0, p
    # eager, full and regional timed in turn in one process that compiled both ways from the cold runs' caches:
    # nothing compiled while timing, both warm (cache hits), both match eager, speedups from the same rounds
    n = len(one["eager"]["latency_samples_s"])
    for how in ("full", "regional"):
        r = one[how]
        x = r["extra"]
        assert r["status"] == "ok" and len(r["latency_samples_s"]) == n == 3 and x["graphs_while_timing"] == 0
        assert x["first_call_cache_hits"] > 0 and x["rel_error"] <= x["tolerance"], r["scenario"]
        assert x["speedup_vs_eager"] == pytest.approx(one["eager"]["latency_median_s"] / r["latency_median_s"])
    # one warm start loads the artifacts the cold regional run saved; on a CPU they do not hold the C++ kernels
    assert regional["extra"]["artifacts_saved_bytes"] > 0 and warm["extra"]["artifacts_loaded"] is True
    assert warm["extra"]["artifacts_load_s"] > 0
    assert regional["extra"]["kernel_files_built"] > 0 and warm["extra"]["kernel_files_built"] > 0
    # the other starts from a copy of the cold run's cache directory: no kernel built, and faster than cold
    assert warm_dir["extra"]["kernel_files_built"] == 0 and warm_dir["extra"]["artifacts_loaded"] is False
    assert warm_dir["compile_s"] < regional["compile_s"]
    check = nb.row("recompile limit check")
    assert check["extra"]["graphs"] == 3
    assert check["extra"]["limit_1"] == "limit hit", "the finding section 1 explains: recompile_limit=1 is hit"
    ratios = nb.row("regional vs full")["extra"]
    assert ratios["full_cold_over_regional_cold"] == pytest.approx(full["compile_s"] / regional["compile_s"])
    assert ratios["regional_over_full_steady_step"] == pytest.approx(
        one["regional"]["latency_median_s"] / one["full"]["latency_median_s"])
    assert ratios["full_speedup_vs_eager"] == pytest.approx(one["full"]["extra"]["speedup_vs_eager"])
    assert ratios["regional_speedup_vs_eager"] == pytest.approx(one["regional"]["extra"]["speedup_vs_eager"])
    for name in ("compile_latency", "steady_speedup"):
        assert (nb.figures_dir / "cpu" / f"04_regional_compilation_{name}.png").stat().st_size > 1000, name
    # the recipe is a short code cell of its own, and the children run its lines (recorded on their rows)
    code = [c.source for c in nb.notebook.cells if c.cell_type == "code"]
    recipe = [c for c in code if "RECIPES = {" in c]
    assert len(recipe) == 1 and len(recipe[0].splitlines()) <= 5, recipe
    for how, call in (("full", "compile"), ("regional", "compile_repeated_blocks")):
        assert f'"pipe.transformer.{call}(fullgraph=True)"' in recipe[0]
        assert one[how]["extra"]["recipe"] == f"pipe.transformer.{call}(fullgraph=True)"
    text = nb.text()
    assert "not measured" in text and "regional / full steady step:" in text and "largest part:" in text
    # the word printed for the comparison is the one the measured ratio gives
    phrase = compile_tools.speed_phrase(1 / ratios["regional_over_full_steady_step"], "the full one")
    assert f"so the regional step was {phrase} on this run" in text


@pytest.mark.parametrize(("knob", "value", "message"), [
    ("BLOCKS", [3], r"BLOCKS=\[3\]: a list \[double, single\]"),
    ("RECOMPILE_LIMIT", 0, r"RECOMPILE_LIMIT=\[0\] must be a non-empty list of positive integers"),
    ("EMULATE_PRECISION_CASTS", "yes", r"EMULATE_PRECISION_CASTS='yes' is not allowed; choose one of: True, False"),
])
def test_bad_knobs_fail_fast(tmp_path, knob, value, message):
    with pytest.raises(params.ParameterError, match=message):
        run_setup("04_regional_compilation", tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
