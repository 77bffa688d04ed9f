"""Notebook 05 on the smoke profile: a resolution change recompiles a static compile, dynamic compiles do not."""

import pytest

from tests.nbrun import run_notebook

pytestmark = pytest.mark.notebook


def test_dynamic_shapes_rows(tmp_path):
    nb = run_notebook("05_dynamic_shapes", tmp_path)
    resolutions = [128, 96, 64]
    static = {r: nb.row(f"default compile @ {r}") for r in resolutions}
    assert static[128]["extra"]["graphs"] == 1
    assert static[96]["recompiles"] >= 1, "the negative control: a new resolution recompiles"
    for r in resolutions[1:]:
        assert nb.row(f"dynamic=True @ {r}")["recompiles"] == 0
    dyn, marked = nb.row("dynamic kernels step"), nb.row("mark_dynamic kernels step")
    assert dyn["recompiles"] == 0 and marked["recompiles"] == 0
    assert len(dyn["extra"]["resolutions"]) >= 3 and dyn["compile_s"] > dyn["latency_median_s"] > 0
    stat = nb.row("static kernels step")
    cost = nb.row("dynamic vs static")["extra"]
    assert cost["dynamic_over_static"] == pytest.approx(dyn["latency_median_s"] / stat["latency_median_s"])
    assert (nb.figures_dir / "cpu" / "05_dynamic_shapes_static_vs_dynamic.png").stat().st_size > 1000
