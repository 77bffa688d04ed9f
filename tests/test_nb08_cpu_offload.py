"""Notebook 08 on the smoke profile: offload hooks, parity, and skipped GPU measurements with reasons."""

import math

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook

MODES = ("model", "sequential", "group_block", "group_leaf")


def test_offload_rows(tmp_path):
    nb = run_notebook("08_cpu_offload", tmp_path)
    rows = nb.rows
    assert set(rows["run_id"]) == {rows["run_id"].iloc[0]} and (rows["profile"] == "smoke").all()

    base = nb.row("no offload eager")
    assert base["status"] == "ok" and base["latency_median_s"] > 0 and base["peak_memory_bytes"] > 0
    sizes = nb.row("component weights")["extra"]
    assert sizes["largest_component"] in sizes["component_bytes"]

    for mode in MODES:
        hooks_row = nb.row(f"{mode} offload: hooks")
        extra, hooks = hooks_row["extra"], hooks_row["extra"]["hooks"]
        assert hooks_row["status"] == "ok" and extra["onload_device"] == "cpu"
        assert set(hooks) == {"vae", "text_encoder", "text_encoder_2", "transformer"}
        assert "accelerator" in extra["default_call_error"]
        if mode == "model":
            assert all(h["accelerate_hook_types"] == ["CpuOffload"] and h["accelerate_hooks"] == 1
                       for h in hooks.values())
        if mode == "sequential":
            assert all(h["accelerate_hooks"] > 1 and h["parameter_devices"] == ["meta"] for h in hooks.values())
        if mode.startswith("group"):
            assert all(h["group_offload_hooks"] > 0 for h in hooks.values())
            assert "stream" in extra["stream_error"] and extra["use_stream"] is False
        if mode != "sequential":
            assert extra["run_error"] == "" and extra["drift_vs_no_offload"] == 0.0
        # every GPU measurement is skipped on the CPU, with the reason
        for variant in ("eager", "regional compile"):
            row = nb.row(f"{mode} offload {variant}")
            assert row["status"] == "skipped" and "no CUDA GPU" in row["reason"]
            assert pd_isna(row["latency_median_s"]) and pd_isna(row["peak_memory_bytes"])

    compiled = nb.row("no offload regional compile")
    assert compiled["status"] == "skipped" and "CUDA GPU" in compiled["reason"]
    assert "offload ratios" not in set(rows["scenario"])  # no GPU, no ratios: nothing is invented
    assert (rows[rows["status"] != "ok"]["reason"].str.len() > 20).all()
    assert (nb.figures_dir / "cpu" / "08_cpu_offload_hooks_per_mode.png").stat().st_size > 1000
    assert "not measured" in nb.text()


def pd_isna(value) -> bool:
    """True for None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))
