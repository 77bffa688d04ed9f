"""Notebook 03 on the smoke profile: the recipe cell is what compiles, a cold compile of the denoiser, parity with
eager, the pipeline's first call and later calls compile nothing, eager timed in turn with the compiled denoiser,
a CUDA-graph mode recorded as skipped on a CPU with the true reason, and a bad MODES fails fast."""

import math

import pytest
import torch

from helpers import compile_tools, params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

NO_EMULATION = "default, no precision-cast emulation"


def test_torch_compile_rows(tmp_path):
    nb = run_notebook("03_torch_compile", tmp_path)
    eager_pipe, eager_step = nb.row("pipeline eager"), nb.row("denoiser step eager")
    assert eager_pipe["status"] == eager_step["status"] == "ok" and eager_pipe["profile"] == "smoke"
    dtype = eager_step["dtype"]
    assert dtype == params.resolve_dtype("auto", torch.device("cpu"))[0]
    step, whole = nb.row("denoiser step compiled (default)"), nb.row("pipeline compiled (default)")
    assert step["status"] == whole["status"] == "ok"
    # one full graph, compiled cold: inductor's cache was consulted and nothing hit
    assert step["extra"]["graphs_first_call"] >= 1 and step["graph_breaks"] == 0
    assert step["extra"]["cache_hits_first_call"] == 0 and step["extra"]["cache_misses_first_call"] >= 1
    # nothing compiled on the second and later calls
    assert step["recompiles"] == 0 and step["latency_median_s"] > 0
    assert step["extra"]["finite"] is True and math.isfinite(step["extra"]["rel_error"])
    # eager timed in turn with the compiled step, and the speedup derived from those samples
    x = step["extra"]
    assert len(x["eager_samples_s"]) == len(step["latency_samples_s"]) == 3
    assert x["speedup"] == pytest.approx(x["eager_latency_median_s"] / step["latency_median_s"])
    w = whole["extra"]
    assert len(w["eager_samples_s"]) == len(whole["latency_samples_s"])
    assert w["speedup"] == pytest.approx(w["eager_latency_median_s"] / whole["latency_median_s"])
    # the pipeline's own first call reuses the graph compiled on denoiser_inputs, and later calls compile nothing
    assert w["graphs_first_call"] == 0 and whole["recompiles"] == 0
    # parity with eager within the dtype's tolerance, with precision-cast emulation on
    assert x["emulate_precision_casts"] is True
    assert 0 <= x["rel_error"] <= x["tolerance"] == compile_tools.PARITY_TOLERANCE[dtype]
    plain = nb.row(f"denoiser step compiled ({NO_EMULATION})")
    plain_pipe = nb.row(f"pipeline compiled ({NO_EMULATION})")
    if dtype == "fp32":  # nothing to emulate: skipped with the reason, its pipeline row too
        assert plain["status"] == plain_pipe["status"] == "skipped" and "fp32" in plain["reason"]
        assert "not compared on this run (fp32)" in nb.text()
    else:  # the row compared with the published speedup: inductor's defaults, eager pipeline timed in turn
        assert plain["status"] == plain_pipe["status"] == "ok" and plain["extra"]["emulate_precision_casts"] is False
        assert f"{plain['extra']['rel_error']:.2e} without" in nb.text()
        p = plain_pipe["extra"]
        assert p["speedup"] == pytest.approx(p["eager_latency_median_s"] / plain_pipe["latency_median_s"])
        assert p["graphs_first_call"] == 0 and plain_pipe["recompiles"] == 0
    # a CUDA-graph mode on a CPU, its twin measured: skipped with the true reason, for both workloads
    for what in ("denoiser step", "pipeline"):
        skipped = nb.row(f"{what} compiled (reduce-overhead)")
        assert skipped["status"] == "skipped" and "runs but captures no CUDA graph" in skipped["reason"]
        assert "'default'" in skipped["reason"]
    # the recipe is a short code cell of its own, and the measuring loop runs it
    code = [c.source for c in nb.notebook.cells if c.cell_type == "code"]
    recipe = [c for c in code if "pipe.transformer.compile(fullgraph=True, mode=mode)" in c]
    assert len(recipe) == 1 and len(recipe[0].splitlines()) <= 7, recipe
    assert any("compile_denoiser(pipe, mode)" in c and "time_interleaved" in c for c in code)
    text = nb.text()
    # prose backed by printed values: the denoiser's share, words chosen from the measured speedups
    share = 2 * eager_step["latency_median_s"] / eager_pipe["latency_median_s"]
    assert f"take {compile_tools.share_word(min(share, 1.0))} of the pipeline's time" in text
    assert f"was {compile_tools.speed_phrase(x['speedup'], 'eager')} ({x['speedup']:.2f}x)" in text
    assert f"whole pipeline: {compile_tools.speed_phrase(w['speedup'], 'eager')} ({w['speedup']:.2f}x)" in text
    saved = w["eager_latency_median_s"] - whole["latency_median_s"]
    payback = (f"the compile pays for itself after {(step['compile_s'] - step['latency_median_s']) / saved:.0f} images"
               if saved > 0 else "the compile does not pay for itself on this run")
    assert payback in text
    assert 0 < x["fraction_of_peak"] < 1.5
    assert eager_step["extra"]["flops_per_step"] > 0
    assert (nb.figures_dir / "cpu" / "03_torch_compile_pipeline_latency.png").stat().st_size > 1000
    assert "not measured" in text


def test_bad_modes_fail_fast(tmp_path):
    message = (r"MODES contains \['fast'\]; each entry must be one of: 'default', 'reduce-overhead', "
               r"'max-autotune-no-cudagraphs', 'max-autotune'")
    with pytest.raises(params.ParameterError, match=message):
        run_setup("03_torch_compile", tmp_path, MODES=["fast"])
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
