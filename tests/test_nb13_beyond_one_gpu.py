"""Notebook 13 on the smoke profile: the notebook's own torchrun script draws the image split over 2 gloo processes,
and one more launch splits the tiny Flux denoiser (Ulysses-2, ring-2) with the script's split_transformer: parity with
the single process, counted bytes equal to the analytic volume; bad knobs fail in the setup cell."""

import pytest

from helpers import compile_tools, parallel, params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook


def test_split_step_rows(tmp_path):
    nb = run_notebook("13_beyond_one_gpu", tmp_path)
    single = nb.row(parallel.SINGLE_SCENARIO)
    assert single["status"] == "ok" and single["extra"]["degree"] == 1 and len(single["latency_samples_s"]) == 3
    for strategy in ("ulysses", "ring"):
        row = nb.row(f"denoiser step: {strategy}-2")
        x = row["extra"]
        assert row["status"] == "ok" and row["latency_median_s"] > 0 and x["world_size"] == 2 and x["backend"] == "gloo"
        # parity: the split output is the single-process output up to float rounding
        assert 0 <= x["rel_error"] <= compile_tools.PARITY_TOLERANCE[row["dtype"]]
        # bytes counted from the collectives equal the analytic volume, recomputed here from the row's shape
        g = parallel.Geometry(batch=1, image_tokens=x["image_tokens"], text_tokens=x["text_tokens"], heads=x["heads"],
                              head_dim=x["head_dim"], layers=x["attention_layers"], out_channels=x["out_channels"],
                              element_bytes=x["element_bytes"])
        assert (g.image_tokens, g.text_tokens, g.heads, g.layers) == (64, 32, 2, 6)
        assert x["bytes_sent_per_step"] == parallel.analytic_bytes(strategy, g, 2)["total"] > 0
        layers = g.layers
        if strategy == "ulysses":  # q, k, v and the output per attention layer, plus the output gather
            assert x["calls_by_collective"] == {"all_to_all_single": 4 * layers, "all_gather_tensor": 1}
        else:  # k and v per layer, plus the output gather
            assert x["calls_by_collective"] == {"all_gather_tensor": layers + 1}
            assert any("return_lse" in s for s in x["shims"])
        assert any("device_count" in s for s in x["shims"])
    model = nb.row("scaling model: ulysses-4 H100")["extra"]
    assert model["predicted_step_s"] > 0 and model["t1_source"].startswith(("published", "measured"))
    # the script written by %%writefile ran under torchrun and drew the single-process image (same seed, same pixels
    # up to rounding)
    drawn = nb.row("image: ulysses-2 vs single process")["extra"]
    assert drawn["identical"] or drawn["psnr_db"] > 30, drawn
    claims = nb.checks()  # the Checks cell's table, every claim held (the cell raises otherwise)
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    for strategy in ("ulysses", "ring"):
        assert {f"{strategy}-2 ran on 2 ranks at the planned shape",
                f"{strategy}-2: the split output matches the single-process one (rel. L2)",
                f"{strategy}-2: bytes counted from the collectives = on paper"} <= set(claims)
    assert "at 4 GPUs the model favours Ulysses, which sends less (predicted step, ms)" in claims
    # both images go through s.show, labelled, judged as the prompt's digit: the single-process one, then the pair
    assert nb.row("shown: one process")["extra"]["judged"] is True
    pair = nb.row("shown: whole vs split")["extra"]
    assert pair["judged"] and [g["label"] for g in pair["grid"]] == ["one process", "ulysses-2"], pair
    assert all(g["holds"] and g["share"] == 1.0 for g in pair["grid"]), pair
    assert "every image shown reads as its prompt's digit (a grid row: at least its floor)" in claims
    text = nb.text()
    assert text.count("tiny model: no comparison") == 2 and "xDiT flux performance doc" in text
    assert "Nothing to compare" in text
    assert (nb.figures_dir / "cpu" / "13_beyond_one_gpu_step_latency.png").stat().st_size > 1000


@pytest.mark.parametrize("knob, value, message", [
    ("DEGREE", 64, r"DEGREE=64 is larger than the \d+ CPU cores \(one gloo process each\) available; choose"),
    ("TEXT_TOKENS", 33, r"does not split over DEGREE=2 ranks: text tokens = 33 not divisible by 2"),
    ("PROMPT", "", r"PROMPT='' is not allowed; use a non-empty string"),
])
def test_bad_knobs_fail_fast(tmp_path, knob, value, message):
    with pytest.raises(params.ParameterError, match=message):
        run_setup("13_beyond_one_gpu", tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"


def test_split_fields_summary_and_scaling_rows(tmp_path):
    """Unit test of what the notebook reads back (parallel.split_fields, split_summary) and records (record_scaling)."""
    import pandas as pd
    import torch

    from helpers import environment, results

    measured = pd.DataFrame([
        {"scenario": "denoiser step: ulysses-2", "status": "ok", "latency_median_s": 0.04,
         "extra": {"rel_error": 0.0, "bytes_sent_per_step": 40960, "calls_by_collective": {"a": 24, "b": 1}}},
        {"scenario": "denoiser step: ring-2", "status": "failed", "latency_median_s": None, "extra": {}}])
    x = parallel.split_fields(measured, "ulysses", 2)
    assert x["latency_median_s"] == 0.04 and x["bytes_sent_per_step"] == 40960
    assert parallel.split_fields(measured, "ring", 2) == {}, "a failed row gives no fields: its claims fail"
    summary = parallel.split_summary(x, 40960)
    assert summary["collective calls per step"] == 25 and summary["step (ms)"] == pytest.approx(40.0)
    assert parallel.split_summary({}, 1)["step (ms)"] is None
    full = parallel.profile_geometry("full", height=1024, width=1024, text_tokens=512, dtype=torch.bfloat16)
    table = parallel.scaling_table(0.16, full, ["ulysses", "ring"])
    shown = parallel.scaling_shown(table, 0.16)
    assert "predicted / published" not in shown and shown["xDiT published speedup (x)"].iloc[0] == pytest.approx(
        4.30 / 2.68)
    run = params.resolve("13_beyond_one_gpu", PROFILE="smoke", RESULTS_DIR=str(tmp_path))
    writer = results.ResultWriter(run, environment.environment_card(torch.device("cpu"), torch.float32))
    parallel.record_scaling(writer, table, 0.16, "planted", full)
    assert [r.scenario for r in writer.rows][:2] == ["scaling model: ulysses-2 H100", "scaling model: ring-2 H100"]
    assert len(writer.rows) == len(table) and writer.rows[2].extra["sent_per_rank_per_step_bytes"] == \
        parallel.analytic_bytes("ulysses", full, 4)["total"]
    assert parallel.rows_of_run(tmp_path, "cpu", run.notebook, writer.run_id).shape[0] == len(table)
