"""Notebook 10 on the smoke profile: hot-swaps of different ranks without recompiles, the negative control, bad files."""

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook


def test_lora_hotswap_rows(tmp_path):
    nb = run_notebook("10_lora_hotswap", tmp_path)
    rows = nb.rows
    assert set(rows["status"]) == {"ok"} and set(rows["profile"]) == {"smoke"}
    assert set(rows["run_id"]) == {rows["run_id"].iloc[0]}
    made = nb.row("adapters")["extra"]
    ranks, target = made["ranks"], made["target_rank"]
    assert len(set(ranks)) >= 3 and target == max(ranks) and made["layers"] > 0
    assert made["files"] == ["pytorch_lora_weights.safetensors"]

    swaps = rows[rows["scenario"].str.startswith("hotswap to rank")]
    swap_ranks = [e["rank"] for e in swaps["extra"]]
    assert len(swaps) >= 3 and len(set(swap_ranks)) >= 3, swap_ranks
    assert (swaps["recompiles"] == 0).all(), "a hot-swap recompiled"
    for extra in swaps["extra"]:
        assert 0 <= extra["parity"] <= extra["tolerance"], extra
        assert extra["swap_s"] > 0 and extra["diff_vs_base"] > 10 * extra["tolerance"]
    differ = nb.row("adapters differ")["extra"]
    tol = swaps["extra"].iloc[0]["tolerance"]
    assert differ["min_pairwise_diff"] > 10 * tol and differ["total_recompiles"] == 0
    assert nb.row("compile with first adapter")["extra"]["parity"] <= tol

    for what in ("rank above target", "untargeted layer"):
        bad = nb.row(f"bad file: {what}")
        assert bad["recompiles"] == 0 and bad["extra"]["output_unchanged"] is True
        assert bad["extra"]["error"], f"no error recorded for the bad file ({what})"
    assert "above target_rank" in nb.row("bad file: rank above target")["extra"]["error"]
    assert "add_k_proj" in nb.row("bad file: untargeted layer")["extra"]["error"]

    controls = rows[rows["scenario"].str.startswith("no hotswap")]
    assert len(controls) == 2 and (controls["recompiles"] > 0).all(), "the negative control did not recompile"

    for scenario in ("pipeline lora eager", "pipeline lora hotswap compiled", "pipeline lora compiled (no hotswap)"):
        timed = nb.row(scenario)
        assert timed["latency_median_s"] > 0 and len(timed["latency_samples_s"]) == 3
    assert (nb.figures_dir / "cpu" / "10_lora_hotswap_swap_latency.png").stat().st_size > 1000
    assert "not measured" in nb.text()
