"""Notebook 07 on the smoke profile: syncs per loop by placement and begin index (modeled on a CPU); CUDA parts
skipped; bad knobs fail in the setup cell before anything is written."""

import pytest

from helpers import params
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

SETTINGS = [(p, b) for p in ("device", "cpu") for b in ("unset", "set")]


def test_scheduler_sync_rows(tmp_path):
    nb = run_notebook("07_scheduler_syncs", tmp_path)
    steps = nb.row("syncs: sigmas on device, begin_index unset")["steps"]
    assert steps == 2
    rows = {(p, b): nb.row(f"syncs: sigmas on {p}, begin_index {b}")["extra"] for p, b in SETTINGS}
    for (p, b), extra in rows.items():
        assert extra["placement"] == p and extra["syncs_counted"].startswith("modeled")
        assert extra["sync_warnings"] is None and extra["htod_memcpy"] is None and extra["dtoh_memcpy"] is None
        # one blocking copy per loop while setting the schedule, whatever the placement
        assert extra["setup_syncs"] == 1 and extra["blocking_copies"] == 1
        if b == "set":
            assert extra["step_syncs"] == 0 and extra["nonzero_per_step"] == 0
            assert extra["device_reads"] == 0 and extra["syncs_per_loop"] == 1
        else:  # index_for_timestep: nonzero() and .item() of the device timesteps on the first step
            assert extra["step_syncs"] == 2 and extra["device_reads"] == 2 and extra["syncs_per_loop"] == 3
            assert extra["nonzero_per_step"] == 1 / steps and extra["item_calls_per_step"] == 1 / steps
            assert sum(n for k, n in extra["syncs_by_source"].items() if "(index_for_timestep)" in k) == 2
        assert extra["syncs_per_step"] == extra["syncs_per_loop"] / steps
    for b in ("unset", "set"):  # Flux: the placement of the sigmas does not change the count
        assert rows[("device", b)]["syncs_per_loop"] == rows[("cpu", b)]["syncs_per_loop"]
    for p in ("device", "cpu"):  # the begin index does: it saves both reads
        assert rows[(p, "unset")]["syncs_per_loop"] - rows[(p, "set")]["syncs_per_loop"] == 2

    host_t = nb.row("syncs: sigmas and timesteps on cpu, begin_index set")["extra"]
    assert host_t["setup_syncs"] == 0 and host_t["step_syncs"] == host_t["blocking_copies"] == steps
    assert all("copy host to device in the steps" in k for k in host_t["syncs_by_source"])

    euler = {p: nb.row(f"euler step syncs: sigmas on {p}")["extra"] for p in ("device", "cpu")}
    for p, extra in euler.items():
        assert extra["item_calls_per_step"] == 2
        assert extra["step_syncs"] == (2 * steps if p == "device" else 0)
    # the claim: fewer syncs with the sigmas on the CPU (Euler), in the steps and over the whole loop
    assert euler["cpu"]["syncs_per_loop"] < euler["device"]["syncs_per_loop"]

    skipped = nb.row("cuda sync debug mode")
    assert skipped["status"] == "skipped" and "nothing to warn about" in skipped["reason"]
    for p, b in SETTINGS:
        row = nb.row(f"loop compiled: sigmas on {p}, begin_index {b}")
        assert row["status"] == "ok" and row["latency_median_s"] > 0 and len(row["latency_samples_s"]) == 3
        assert row["extra"]["syncs_per_loop"] == rows[(p, b)]["syncs_per_loop"]
    assert (nb.figures_dir / "cpu" / "07_scheduler_syncs_syncs_per_loop.png").stat().st_size > 1000
    piped = nb.row("pipeline call under the sync debug mode")
    assert piped["status"] == "skipped" and piped["extra"]["sync_warnings_by_line"] == {}
    # the copy of each step's timestep is named by the notebook's own loop, not by a helper
    assert all("notebook cell" in k and "(denoise)" in k for k in host_t["syncs_by_source"]), host_t
    text = nb.text()
    assert "Nothing to compare" in text and "Empty DataFrame" not in text
    assert "set_begin_index(0) saves 2 syncs per loop" in text
    # section 1 on a CPU quotes the warning a GPU run gives
    assert 'on a GPU, each sync is a UserWarning "called a synchronizing CUDA operation"' in text
    # section 2 lists the sources once, then says how the other settings differ, computed
    assert text.count("(modeled on a CPU):\n") == 1 and "sigmas on device, begin_index unset (modeled on a CPU):" in text
    assert ("the other settings, reads and copies by calling function against this list: sigmas on device, "
            "begin_index set: 2 fewer in index_for_timestep; sigmas on cpu, begin_index unset: 1 fewer in "
            "set_timesteps, 1 more in set_schedule; sigmas on cpu, begin_index set: 2 fewer in index_for_timestep, "
            "1 fewer in set_timesteps, 1 more in set_schedule") in text
    # Going deeper: no all-<NA> warnings column off CUDA, a legend for the two read columns, and no CPU timing
    # table that could be read as a sync's cost (the rows keep the timings)
    assert "sync-debug warnings (count)" not in text and "<NA>" not in text
    assert "host reads, any tensor: every .item(), bool() or nonzero() the profiler counted" in text
    assert "CPU: no device queue, so these 4 loops (" in text and "median loop (ms)" not in text
    # the Results table shows the sync counts the rows recorded
    assert "syncs per loop (modeled on a CPU)" in text
    claims = nb.checks()  # the Checks cell's table, every claim held (the cell raises otherwise)
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    assert {"sigmas on device: set_begin_index(0) saves exactly the two reads of index_for_timestep",
            "Flux, begin_index set: the placement of the sigmas does not change the count",
            ("sigmas on cpu, begin_index unset: one blocking copy while setting the schedule, the two reads of "
             "index_for_timestep in the steps"),
            "timesteps on the CPU: nothing read or copied up front, one blocking copy per step",
            "Euler, sigmas on device: two reads of the sigma per step, 4 syncs in the steps",
            "Euler: fewer syncs with the sigmas on the CPU, in the loop and in the steps",
            "one compiled graph, reused by every setting without recompiling"} <= set(claims)
    assert not any("sync debug mode confirms" in c for c in claims), "the debug-mode claim needs CUDA"
    # 17 claims of the notebook, plus the one the Checks cell adds for the shown image (helpers.gallery.claim)
    assert len(claims) == 18, sorted(claims)
    shown = nb.row("shown: one pipeline call")["extra"]
    assert shown["judged"] is True and [g["holds"] for g in shown["grid"]] == [True], shown
    assert claims["every image shown reads as its prompt's digit (a grid row: at least its floor)"]["holds"]


@pytest.mark.parametrize("knob, value, message", [
    ("PLACEMENTS", ["gpu"], r"PLACEMENTS contains \['gpu'\]; each entry must be one of: 'device', 'cpu'"),
    ("STEPS", 0, r"STEPS=0 must be a positive integer"),
    ("PROMPT", None, r"PROMPT=None is not allowed; use a non-empty string"),
])
def test_bad_knobs_fail_fast(tmp_path, knob, value, message):
    with pytest.raises(params.ParameterError, match=message):
        run_setup("07_scheduler_syncs", tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
