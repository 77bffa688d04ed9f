"""Notebook 02 on the smoke profile: naive attention vs forced SDPA backends over resolutions."""

import pytest

from helpers import params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

RES = (128, 256, 512)
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}


# tokens of the largest self-attention per resolution: Flux joins 32 text tokens to (res/16)^2 image tokens;
# SDXL's first attention level sits at half the latent's side, res/16
TOKENS = {"flux-dev": lambda res: 32 + (res // 16) ** 2, "sdxl": lambda res: (res // 16) ** 2}


@pytest.mark.parametrize("model", ["flux-dev", "sdxl"])
def test_attention_rows(tmp_path, model):
    nb = run_notebook("02_attention_sdpa", tmp_path, MODEL=model)
    rows = nb.rows
    assert set(rows["profile"]) == {"smoke"} and set(rows["model"]) == {model}
    assert set(rows["run_id"]) == {rows["run_id"].iloc[0]}
    dtype = rows["dtype"].iloc[0]  # DTYPE="auto": bf16 where native, else fp32
    for res in RES:
        for impl in ("naive", "sdpa-math", "sdpa-flash"):  # what a CPU runs
            step, only = nb.row(f"step {impl} @{res}"), nb.row(f"attention only {impl} @{res}")
            assert step["status"] == only["status"] == "ok", (impl, res)
            assert step["height"] == step["width"] == res
            assert step["latency_median_s"] > 0 and only["latency_median_s"] > 0
            assert len(step["latency_samples_s"]) == 3 and step["memory_kind"] == "cpu_allocated_during_call"
            agree = step["extra"]["rel_l2_vs_math"]
            assert step["extra"]["finite"] and 0 <= agree <= TOLERANCE[dtype], (impl, res, agree)
            if impl == "sdpa-math":
                assert agree == 0
            # the naive processor really ran, once per attention call of the step, and only for "naive"
            assert step["extra"]["naive_calls"] == (step["extra"]["attention_calls"] if impl == "naive" else 0)
        for impl in ("sdpa-efficient", "sdpa-cudnn"):  # CUDA-only kernels
            for what in ("step", "attention only"):
                row = nb.row(f"{what} {impl} @{res}")
                assert row["status"] == "skipped" and "cpu" in row["reason"], row["reason"]
    # the score matrix of the largest self-attention grows with the square of the tokens
    geo = {res: nb.row(f"step naive @{res}")["extra"] for res in RES}
    for res in RES:
        assert geo[res]["tokens"] == TOKENS[model](res)
        b, h, n, _ = geo[res]["largest_call"]
        assert geo[res]["score_matrix_bytes"] == b * h * n * n * ITEMSIZE[dtype]
    assert geo[512]["score_matrix_bytes"] / geo[128]["score_matrix_bytes"] == (geo[512]["tokens"] / geo[128]["tokens"]) ** 2
    # measured memory of the attention alone: naive holds a whole score matrix and grows faster than the tokens;
    # flash needs less (on a CPU: bytes allocated during the call, from the profiler)
    extra = {(impl, res): nb.row(f"attention only {impl} @{res}")["extra"]["extra_bytes"]
             for impl in ("naive", "sdpa-flash") for res in RES}
    assert extra[("naive", 512)] >= geo[512]["score_matrix_bytes"]
    assert extra[("naive", 512)] / extra[("naive", 128)] > geo[512]["tokens"] / geo[128]["tokens"]
    assert extra[("sdpa-flash", 512)] < extra[("naive", 512)]
    for name in ("naive", "sdpa"):
        row = nb.row(f"pipeline {name}")
        assert row["status"] == "ok" and row["latency_median_s"] > 0 and row["peak_memory_bytes"] > 0
    # batch sweep: every batch ran on a CPU (no out-of-memory), naive never below SDPA's peak memory
    for b in (1, 2, 4, 8):
        naive, sdpa = nb.row(f"batch naive x{b}"), nb.row(f"batch sdpa x{b}")
        assert naive["status"] == sdpa["status"] == "ok" and naive["extra"]["batch_size"] == b
        assert naive["peak_memory_bytes"] >= sdpa["peak_memory_bytes"] > 0
    # fp32 and fp16: naive and SDPA timed in each format
    for fmt in ("fp32", "fp16"):
        for impl in ("naive", "sdpa"):
            row = nb.row(f"dtype {fmt} step {impl}")
            assert row["status"] == "ok" and row["latency_median_s"] > 0 and row["extra"]["format"] == fmt
    for fig in ("latency_vs_resolution", "memory_vs_resolution"):
        assert (nb.figures_dir / "cpu" / f"02_attention_sdpa_{fig}.png").stat().st_size > 1000
    assert "not measured" in nb.text()


def test_implementations_without_reference_fail_fast(tmp_path):
    with pytest.raises(params.ParameterError, match="must include 'sdpa-math'"):
        run_setup("02_attention_sdpa", tmp_path, IMPLEMENTATIONS=["naive"])
    with pytest.raises(params.ParameterError, match="divisible by 16"):
        run_setup("02_attention_sdpa", tmp_path, RESOLUTIONS=[100])
    with pytest.raises(params.ParameterError, match="BATCHES"):
        run_setup("02_attention_sdpa", tmp_path, BATCHES=[0, 2])
    with pytest.raises(params.ParameterError, match="SDPA_DTYPES"):
        run_setup("02_attention_sdpa", tmp_path, SDPA_DTYPES=["fp8"])
    assert not (tmp_path / "results").exists()
