"""Notebook 07 on the smoke profile: host reads per step by placement and begin index; CUDA parts skipped."""

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook

SETTINGS = [(p, b) for p in ("device", "cpu") for b in ("unset", "set")]


def test_scheduler_sync_rows(tmp_path):
    nb = run_notebook("07_scheduler_syncs", tmp_path)
    steps = nb.row("syncs: sigmas on device, begin_index unset")["steps"]
    assert steps == 2
    rows = {(p, b): nb.row(f"syncs: sigmas on {p}, begin_index {b}")["extra"] for p, b in SETTINGS}
    for (p, b), extra in rows.items():
        assert extra["placement"] == p and extra["syncs_per_step"] == 0  # a CPU run has no device to sync with
        assert extra["dtoh_memcpy_per_step"] is None and extra["sync_warnings_per_step"] is None
        if b == "set":
            assert extra["scheduler_reads"] == 0 and extra["nonzero_per_step"] == 0
            assert extra["device_reads_per_step"] == 0
        else:
            assert extra["scheduler_reads"] == 2 and extra["nonzero_per_step"] == 1 / steps
            assert extra["item_calls_per_step"] >= 1 / steps
            assert any("index_for_timestep" in k for k in extra["reads_by_source"])
            assert extra["scheduler_device_reads"] == (2 if p == "device" else 0)
    for b in ("unset", "set"):  # the same code runs for both placements: the same host reads
        assert rows[("device", b)]["host_reads_per_step"] == rows[("cpu", b)]["host_reads_per_step"]
    assert rows[("device", "unset")]["host_reads_per_step"] >= rows[("device", "set")]["host_reads_per_step"] + 1
    # the claim: fewer syncs (reads of device-placed tensors) with the sigmas on the CPU
    assert rows[("cpu", "unset")]["device_reads_per_step"] < rows[("device", "unset")]["device_reads_per_step"]

    skipped = nb.row("cuda sync debug mode")
    assert skipped["status"] == "skipped" and "CUDA" in skipped["reason"]
    for p in ("device", "cpu"):
        euler = nb.row(f"euler step syncs: sigmas on {p}")["extra"]
        assert euler["item_calls_per_step"] == 2 and euler["syncs_per_step"] == 0
        assert euler["device_reads_per_step"] == (2 if p == "device" else 0)
    for p, b in SETTINGS:
        row = nb.row(f"loop compiled: sigmas on {p}, begin_index {b}")
        assert row["status"] == "ok" and row["latency_median_s"] > 0 and len(row["latency_samples_s"]) == 3
    assert (nb.figures_dir / "cpu" / "07_scheduler_syncs_device_reads_per_step.png").stat().st_size > 1000
