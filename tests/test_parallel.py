"""helpers.parallel: analytic volumes, the checks (each fails on a planted wrong value), the CPU shims, the byte
counter's arithmetic, and the scaling model."""

import os

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from helpers import parallel, paths
from helpers.params import ParameterError

# Flux-1-Dev at 1024x1024 with 512 text tokens in bf16
FULL = parallel.Geometry(batch=1, image_tokens=4096, text_tokens=512, heads=24, head_dim=128, layers=57,
                         out_channels=64, element_bytes=2)


def test_geometry_of_the_shipped_configs():
    full = parallel.profile_geometry("full", height=1024, width=1024, text_tokens=512, dtype=torch.bfloat16)
    assert full == FULL and full.tokens == 4608
    smoke = parallel.profile_geometry("smoke", height=128, width=128, text_tokens=32, dtype=torch.float32)
    assert (smoke.image_tokens, smoke.heads, smoke.head_dim, smoke.layers, smoke.element_bytes) == (64, 2, 16, 6, 4)


def test_analytic_volumes_by_hand():
    shard = 4608 // 4 * 24 * 128 * 2  # one rank's q (or k, or v, or output) at n = 4, bytes
    output = 3 * 4096 // 4 * 64 * 2
    assert parallel.analytic_bytes("ulysses", FULL, 4) == {"attention": 57 * 4 * shard * 3 // 4,
                                                           "output gather": output,
                                                           "total": 57 * 3 * shard + output}
    assert parallel.analytic_bytes("ring", FULL, 4)["attention"] == 57 * 2 * 3 * shard
    # at n = 2 the two strategies send the same; from n = 3 on, ring sends more and Ulysses' volume falls with n
    assert parallel.analytic_bytes("ulysses", FULL, 2) == parallel.analytic_bytes("ring", FULL, 2)
    ulysses = [parallel.analytic_bytes("ulysses", FULL, n)["total"] for n in (2, 4, 8)]
    ring = [parallel.analytic_bytes("ring", FULL, n)["total"] for n in (2, 4, 8)]
    assert ulysses == sorted(ulysses, reverse=True) and all(r > u for r, u in zip(ring[1:], ulysses[1:]))
    with pytest.raises(ValueError, match="allowed"):
        parallel.analytic_bytes("tree", FULL, 2)


def test_check_parity_and_bytes_fail_on_planted_values():
    assert parallel.check_parity(3e-7, "fp32") == 3e-7
    assert parallel.check_parity(1e-2, "bf16") == 1e-2  # bf16 rounding through the blocks passes
    for planted in (1e-3, float("nan")):  # a split that computes something else, or nothing
        with pytest.raises(AssertionError, match="above the fp32 tolerance"):
            parallel.check_parity(planted, "fp32")
    parallel.check_bytes(81920, 81920, "ulysses-2")
    with pytest.raises(AssertionError, match="counted 81,921"):
        parallel.check_bytes(81921, 81920, "ulysses-2")  # planted: one byte off


def test_degree_and_sequence_checks():
    assert parallel.check_degree(2, 2, "CPU cores") == 2
    with pytest.raises(ParameterError, match=r"DEGREE=4 is larger than the 2 GPUs available; choose an integer"):
        parallel.check_degree(4, 2, "GPUs")
    for bad in (1, True, 2.0, "2"):
        with pytest.raises(ParameterError, match="must be None or an integer >= 2"):
            parallel.check_degree(bad, 8, "GPUs")
    assert parallel.resolve_degree(None, "smoke", 2, "CPU cores")[0] == 2
    degree, why = parallel.resolve_degree(None, "full", 1, "GPUs")
    assert degree is None and "one GPU each" in why
    assert parallel.resolve_degree(None, "full", 4, "GPUs")[0] == 4
    parallel.check_divisible(FULL, 8, ["ulysses", "ring"])
    with pytest.raises(ParameterError, match="text tokens = 33 not divisible by 2"):
        parallel.check_divisible(parallel.Geometry(1, 64, 33, 2, 16, 6, 64, 4), 2, ["ring"])
    with pytest.raises(ParameterError, match="attention heads = 24"):
        parallel.check_divisible(FULL, 16, ["ulysses"])
    parallel.check_divisible(FULL, 16, ["ring"])  # ring does not split the heads


def test_cpu_lse_attention_returns_the_log_sum_exp():
    from diffusers.models import attention_dispatch

    q, k, v = (torch.randn(1, 8, 2, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))  # B, S, H, D
    original = attention_dispatch._native_attention_forward_op
    with pytest.raises(ValueError, match="return_lse"):
        original(None, q, k, v, return_lse=True, _save_ctx=False)
    with parallel.cpu_lse_attention() as what:
        out, lse = attention_dispatch._native_attention_forward_op(None, q, k, v, return_lse=True, _save_ctx=False)
    assert "return_lse" in what and attention_dispatch._native_attention_forward_op is original
    scores = torch.einsum("bshd,bthd->bhst", q, k) / 16**0.5
    assert torch.allclose(lse, scores.logsumexp(-1).transpose(1, 2), atol=1e-5)  # (B, S, H)
    expected = torch.einsum("bhst,bthd->bshd", scores.softmax(-1), v)
    assert torch.allclose(out, expected, atol=1e-5)


def test_device_count_shim_only_where_there_is_no_accelerator():
    real = torch.accelerator.device_count()
    with parallel.cpu_device_count_shim() as what:
        assert torch.accelerator.device_count() == max(real, 1)
    assert torch.accelerator.device_count() == real and bool(what) == (real == 0)


def test_counter_arithmetic(monkeypatch):
    monkeypatch.setattr(funcol, "all_to_all_single", lambda x, *a, **k: x)
    monkeypatch.setattr(funcol, "all_gather_tensor", lambda x, *a, **k: x)
    monkeypatch.setattr(dist, "all_gather", lambda *a, **k: None)
    monkeypatch.setattr(parallel, "_group_size", lambda group: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    x = torch.zeros(4, 10)  # 160 bytes in fp32
    with parallel.count_collectives() as count:
        funcol.all_to_all_single(x, None, None, "g")  # keeps 1/4, sends 120
        funcol.all_to_all_single(x, [1, 2, 1, 0], [1, 2, 1, 0], "g")  # rank 1 keeps 2 rows: sends 80
        funcol.all_gather_tensor(x, 0, "g")  # to 3 others: 480
        dist.all_gather([], x, group="g")  # 480
    assert count.sent == {"all_to_all_single": 200, "all_gather_tensor": 480, "all_gather": 480}
    assert count.calls == {"all_to_all_single": 2, "all_gather_tensor": 1, "all_gather": 1} and count.total == 1160
    assert funcol.all_to_all_single(x, None, None, "g") is x  # the originals are back after the block


def test_scaling_model():
    assert parallel.predicted_step_s(0.16, 450e9 * 0.002, 4) == pytest.approx(0.042)
    with pytest.raises(ValueError):
        parallel.predicted_step_s(0.0, 1, 2)
    table = parallel.scaling_table(0.16, FULL, ["ulysses", "ring"])
    assert list(table["GPUs"]) == [2, 2, 4, 4, 8, 8]
    at4 = table[table["GPUs"] == 4].set_index("strategy")
    assert at4.loc["ulysses", "xDiT published image (s)"] == 1.63 and at4.loc["ring", "xDiT published image (s)"] == 1.98
    assert at4.loc["ulysses", "predicted / published"] == pytest.approx(
        28 * parallel.predicted_step_s(0.16, parallel.analytic_bytes("ulysses", FULL, 4)["total"], 4) / 1.63)
    assert table[table["GPUs"] == 8]["xDiT published image (s)"].isna().all()
    with_rest = parallel.scaling_table(0.16, FULL, ["ulysses"], unsplit_s=0.3).set_index("GPUs")
    image = "predicted image (s): unsplit part + 28 steps"
    assert with_rest.loc[4, image] == pytest.approx(0.3 + 28 * with_rest.loc[4, "predicted step (ms)"] / 1e3)
    shown = parallel.scaling_shown(with_rest.reset_index(), 0.16, unsplit_s=0.3).set_index("GPUs")
    assert shown.loc[4, "predicted speedup (x)"] == pytest.approx((0.3 + 28 * 0.16) / with_rest.loc[4, image])
    assert shown.loc[4, "predicted speedup (x)"] < 0.16e3 / with_rest.loc[4, "predicted step (ms)"]  # what stays whole


def test_published_is_none_when_absent_unless_required():
    assert parallel.published(parallel.XDIT_SOURCE, parallel.xdit_scenario("ulysses", 4), required=True) == 1.63
    assert parallel.published(parallel.XDIT_SOURCE, parallel.xdit_scenario("ulysses", 8)) is None
    with pytest.raises(KeyError, match="has 0 rows"):
        parallel.published(parallel.XDIT_SOURCE, parallel.xdit_scenario("ulysses", 8), required=True)


def test_the_scaling_model_starts_from_a_flux_step_of_notebook_03(tmp_path):
    """An SDXL row of notebook 03 on an H100 is not Flux's single-GPU step; the unemulated compile is preferred."""
    from helpers import results
    base = {"hardware": "h100-80gb", "notebook": "03_torch_compile", "profile": "full", "status": "ok",
            "run_id": "r1"}
    path = tmp_path / "h100-80gb" / "03_torch_compile.jsonl"
    results.append_rows(path, [base | {"model": "sdxl", "scenario": "denoiser step compiled (default)",
                                       "latency_median_s": 0.05}])
    assert parallel.model_unsplit_s(tmp_path)[0] == 0.0  # an SDXL row only: the steps alone
    assert parallel.model_unsplit_s(tmp_path / "empty")[0] == 0.0  # no rows at all (a test's results folder)
    t1, source = parallel.model_step_s(tmp_path, pd.DataFrame())
    assert source.startswith("published, not measured"), source  # planted SDXL row: not taken
    results.append_rows(path, [base | {"model": "flux-dev", "scenario": s, "latency_median_s": v}
                               for s, v in (("denoiser step compiled (default)", 0.16),
                                            ("denoiser step compiled (default, no precision-cast emulation)", 0.15))])
    t1, source = parallel.model_step_s(tmp_path, pd.DataFrame())
    assert t1 == 0.15 and source.startswith("measured: notebook 03"), (t1, source)
    unsplit, why = parallel.model_unsplit_s(tmp_path)
    assert unsplit == 0.0 and why.startswith("not measured"), why  # no image rows yet: the steps alone, said so
    results.append_rows(path, [base | {"model": "flux-dev", "scenario": s, "latency_median_s": v}
                               for s, v in (("pipeline compiled (default)", 5.0),
                                            ("pipeline compiled (default, no precision-cast emulation)", 4.5))])
    unsplit, why = parallel.model_unsplit_s(tmp_path)  # the image of the same compile as t1's step
    assert unsplit == pytest.approx(4.5 - 28 * 0.15) and "4.50 s, less 28 of its 150.0 ms steps" in why, why


def test_cpu_shims_apply_both_stand_ins_and_undo_them():
    from diffusers.models import attention_dispatch

    original, real = attention_dispatch._native_attention_forward_op, torch.accelerator.device_count()
    with parallel.cpu_shims() as what:
        assert attention_dispatch._native_attention_forward_op is not original
        assert torch.accelerator.device_count() == max(real, 1)
    assert any("return_lse" in x for x in what) and any("device_count" in x for x in what) == (real == 0)
    assert attention_dispatch._native_attention_forward_op is original and torch.accelerator.device_count() == real


def test_torchrun_command_and_a_failing_launch(tmp_path):
    cmd = parallel.torchrun_command(2, "script.py", "{}")
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "script.py", "{}"]
    bad = tmp_path / "bad.py"
    bad.write_text("import sys; sys.exit(3)\n")
    with pytest.raises(RuntimeError, match="torchrun exited"):
        parallel.torchrun(1, str(bad), timeout_s=120)


def test_workers_keep_the_pythonpath_they_inherit(tmp_path, monkeypatch):
    """A GPU host puts its wheel bundle on PYTHONPATH: the torchrun workers must see it too (they once got only
    this project, and could not import diffusers there)."""
    site = tmp_path / "site"
    (site / "bundled_only_here").mkdir(parents=True)
    (site / "bundled_only_here" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert parallel.worker_pythonpath().split(os.pathsep) == [str(paths.ROOT), str(site)]
    script = tmp_path / "imports.py"
    script.write_text("import bundled_only_here, helpers\n")
    parallel.torchrun(1, str(script), timeout_s=120)  # raises if the worker cannot import either
    monkeypatch.delenv("PYTHONPATH")
    assert parallel.worker_pythonpath() == str(paths.ROOT)


def test_published_split_line():
    line = parallel.published_split_line("ulysses", 2, 0.02, 0.01, "cpu", "smoke")
    assert line == ("ulysses-2 speedup over one process: this run (cpu, smoke profile) 0.50x (tiny model: no "
                    "comparison); published: 1.60x (4.3 s -> 2.68 s per image on 2x H100 with torch.compile) "
                    f"({parallel.XDIT_SOURCE})")
    assert "no published figure" in parallel.published_split_line("ring", 8, None, 0.01, "cpu", "smoke")


def test_each_strategy_splits_a_copy_but_the_last_splits_the_model_itself():
    """13's worker on several 80 GB GPUs: a copy per strategy beside the pipeline's own denoiser ran Flux-1-Dev out of
    memory (31 GiB of pipeline + two 22 GiB copies); now one spare copy at most, none for the last strategy."""
    from helpers import parallel_worker

    model = torch.nn.Linear(4, 4)
    got = list(parallel_worker.split_copies(model, ["ulysses", "ring"]))
    assert [s for s, _ in got] == ["ulysses", "ring"]
    assert got[0][1] is not model and torch.equal(got[0][1].weight, model.weight) and got[1][1] is model
    assert next(parallel_worker.split_copies(model, ["ring"]))[1] is model


def test_a_launch_whose_port_was_taken_is_tried_once_more(monkeypatch):
    import subprocess

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        taken = "DistNetworkError: ... name: EADDRINUSE, message: address already in use"
        return subprocess.CompletedProcess(cmd, 1 if len(calls) == 1 else 0, "ok" if len(calls) > 1 else "", taken)

    monkeypatch.setattr(parallel.subprocess, "run", fake_run)
    assert parallel.torchrun(2, "-m", "x") == "ok" and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(parallel.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(
        cmd, 1, "", "ValueError: a real failure"))
    with pytest.raises(RuntimeError, match="a real failure"):
        parallel.torchrun(2, "-m", "x")
    assert len(calls) == 1  # a failure of the job itself is not retried
    assert parallel.port_taken("Address already in use") and not parallel.port_taken("ValueError")
