"""Notebook 03 on the smoke profile: the visible compile line is what compiles, a cold first call, the pipeline's own
first call (its image shown) and later calls compile nothing, eager timed in turn with the compiled denoiser, each
mode compiled with eager's roundings held to the dtype's tolerance, a CUDA-graph mode recorded as skipped on a CPU
with the true reason, fail_on_recompile refusing a new resolution, the learner-facing labels and the committed H200
figure in the lesson, every claim in the Checks cell, and bad knobs fail fast."""

import pytest
import torch

from helpers import compile_tools, measure, params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

MAIN = "default, no precision-cast emulation"  # section 2: inductor's defaults, the row the comparisons read
SHOWN = {MAIN: "compiled, inductor defaults", "default": "compiled, eager roundings emulated"}  # what the learner reads


def test_torch_compile_rows(tmp_path):
    nb = run_notebook("03_torch_compile", tmp_path)
    eager_pipe, eager_step = nb.row("pipeline eager"), nb.row("denoiser step eager")
    assert eager_pipe["status"] == eager_step["status"] == "ok" and eager_pipe["profile"] == "smoke"
    dtype = eager_step["dtype"]
    assert dtype == params.resolve_dtype("auto", torch.device("cpu"))[0]
    assert eager_step["extra"]["flops_per_step"] > 0
    step, whole = nb.row(f"denoiser step compiled ({MAIN})"), nb.row(f"pipeline compiled ({MAIN})")
    assert step["status"] == whole["status"] == "ok"
    x, w = step["extra"], whole["extra"]
    assert x["emulate_precision_casts"] is False and x["mode"] == "default"
    # one full graph, compiled cold: inductor's cache was consulted and nothing hit
    assert x["graphs_first_call"] >= 1 and step["graph_breaks"] == 0
    assert x["cache_hits_first_call"] == 0 and x["cache_misses_first_call"] >= 1
    # the pipeline's own first call reuses the graph, and nothing compiles on later calls
    assert w["graphs_first_call"] == 0 and step["recompiles"] == whole["recompiles"] == 0
    assert x["finite"] is True and 0 <= x["rel_error"] and x["tolerance"] == compile_tools.PARITY_TOLERANCE[dtype]
    # eager is timed in turn with the compiled step and pipeline (the same samples as the eager rows)
    assert x["eager_samples_s"] == eager_step["latency_samples_s"] and len(step["latency_samples_s"]) == 3
    assert w["eager_samples_s"] == eager_pipe["latency_samples_s"]
    assert x["speedup"] == pytest.approx(x["eager_latency_median_s"] / step["latency_median_s"])
    assert w["speedup"] == pytest.approx(w["eager_latency_median_s"] / whole["latency_median_s"])
    assert 0 < x["fraction_of_peak"] < 1.5
    emulated = nb.row("denoiser step compiled (default)")
    if dtype == "fp32":  # nothing to emulate: section 2's compile is held to the tolerance itself
        assert emulated["status"] == nb.row("pipeline compiled (default)")["status"] == "skipped"
        assert "fp32" in emulated["reason"] and x["rel_error"] <= x["tolerance"]
    else:  # compiled again with eager's roundings: parity within the dtype's tolerance, same mechanics
        e = emulated["extra"]
        assert emulated["status"] == "ok" and e["emulate_precision_casts"] is True
        assert e["rel_error"] <= e["tolerance"] and e["cache_hits_first_call"] == 0 and emulated["recompiles"] == 0
        assert nb.row("pipeline compiled (default)")["extra"]["graphs_first_call"] == 0
        assert f"{x['rel_error']:.2e} with inductor's defaults, {e['rel_error']:.2e} with eager's roundings" in nb.text()
    # a CUDA-graph mode on a CPU, its twin measured: skipped with the true reason, for both workloads
    for what in ("denoiser step", "pipeline"):
        skipped = nb.row(f"{what} compiled (reduce-overhead)")
        assert skipped["status"] == "skipped" and "runs but captures no CUDA graph" in skipped["reason"]
        assert "'default'" in skipped["reason"]
    # the lesson in view: the load, the compile line, the pipe() call, the recompile check, the mode loop
    code = [c.source for c in nb.notebook.cells if c.cell_type == "code"]
    assert any("Pipeline.from_pretrained(run.weights" in c and "random_components(" in c for c in code)
    recipe = [c for c in code if "pipe.transformer.compile(fullgraph=True)" in c]
    assert len(recipe) == 1 and len(recipe[0].splitlines()) <= 4, recipe
    assert any("image = pipe(prompt=PROMPT" in c and "s.show(" in c for c in code)
    # inference_mode only where the compiled graph needs it: the pipeline's call after the step compiled under it
    assert sum("torch.inference_mode()" in c for c in code) == 1
    for title in ("eager", "eager and compiled"):  # the trained smoke model's images, judged as the prompt's digit
        shown = nb.row(f"shown: {title}")
        assert shown["extra"]["judged"] and all(g["holds"] for g in shown["extra"]["grid"]), shown["extra"]
    assert any("torch._dynamo.config.patch(error_on_recompile=True)" in c and 'set_stance("force_eager"' in c
               for c in code)
    assert any("net.compile(fullgraph=True, mode=mode)" in c and "emulate_precision_casts=True" in c for c in code)
    assert not any("assert " in c for c in code), "claims go to the Checks cell"
    text = nb.text()
    # printed values match the rows: the words follow the measured speedups, the share and the published line
    share = min(1.0, 2 * eager_step["latency_median_s"] / eager_pipe["latency_median_s"])
    assert f"take {compile_tools.share_word(share)} of the eager image" in text
    assert f"{compile_tools.speed_phrase(x['speedup'], 'eager')} ({x['speedup']:.2f}x)" in text
    assert f"whole pipeline: {compile_tools.speed_phrase(w['speedup'], 'eager')} ({w['speedup']:.2f}x)" in text
    assert (f"compiled over eager, whole image: this run (cpu, smoke profile) {measure.human_speedup(w['speedup'])} "
            "(tiny model: no comparison)") in text
    deeper = next(i for i, c in enumerate(nb.notebook.cells) if c.source.startswith("## Going deeper"))
    lesson = "\n".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", ""))
                       for c in nb.notebook.cells[:deeper] for o in c.get("outputs", []))
    # on smoke no payback count is printed (a tiny model's milliseconds say nothing), only why not, in Going deeper
    assert "pays for itself" not in text and "payback not computed on the smoke profile" in text
    assert "payback not computed" not in lesson
    # the learner reads the compiles by what they are; the stored row names stay (the comparisons read them)
    assert SHOWN[MAIN] in lesson and "compiled (default" not in lesson
    assert "committed GPU run on h200, full profile" in lesson, "the committed H200 figure is shown in the lesson"
    # the TL;DR line: the project's committed H200 speedup beside the published one (report.headline)
    assert any(ln.startswith("TL;DR, compiled over eager, whole image: published: ") and " on h200 " in ln and "measured by this project: " in ln
               for ln in lesson.splitlines())
    # fail_on_recompile refused a step at half the resolution, naming the failed guard (Going deeper)
    assert "Detected recompile when torch.compile stance is 'fail_on_recompile'" in text
    claims = nb.checks()
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    main = SHOWN[MAIN]
    expected = {f"{main}: the first call compiled whole graphs, cold (no break, no cache hit)",
                f"{main}: the pipeline's first call compiled nothing", f"{main}: later calls compiled nothing",
                f"{main}: the compiled output is finite",
                "the compiled step stays within the measured matmul peak (+ noise margin)",
                "fail_on_recompile refuses a step at a new resolution, naming the guard",
                "every image shown reads as its prompt's digit (a grid row: at least its floor)"}
    expected.add(f"{main}: matches eager (relative L2 error)" if dtype == "fp32" else
                 f"{SHOWN['default']}: matches eager (relative L2 error)")
    assert expected <= set(claims), sorted(set(claims))
    assert (nb.figures_dir / "cpu" / "03_torch_compile_pipeline_latency.png").stat().st_size > 1000
    assert "not measured" in text


def test_bad_modes_fail_fast(tmp_path):
    message = (r"MODES contains \['fast'\]; each entry must be one of: 'default', 'reduce-overhead', "
               r"'max-autotune-no-cudagraphs', 'max-autotune'")
    with pytest.raises(params.ParameterError, match=message):
        run_setup("03_torch_compile", tmp_path, MODES=["fast"])
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"


@pytest.mark.parametrize("prompt", ["", 7])
def test_bad_prompt_fails_fast(tmp_path, prompt):
    with pytest.raises(params.ParameterError, match="PROMPT=.*non-empty string"):
        run_setup("03_torch_compile", tmp_path, PROMPT=prompt)
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
