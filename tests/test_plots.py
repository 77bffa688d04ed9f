"""Unit tests of helpers.plots: every plot has a title, both axis labels and a unit on its value axis."""

import matplotlib

matplotlib.use("Agg")

import pytest

from helpers import plots


def test_bars_and_lines_carry_title_labels_and_unit():
    fig = plots.bars(["a", "b"], [1.0, 2.0], title="T", xlabel="setting", ylabel="latency (s)")
    ax = fig.axes[0]
    assert ax.get_title() == "T" and ax.get_xlabel() == "setting" and ax.get_ylabel() == "latency (s)"
    fig = plots.lines([1, 2], {"x": [1.0, 2.0]}, title="T", xlabel="resolution (px)", ylabel="peak memory (GiB)")
    assert fig.axes[0].get_xlabel() == "resolution (px)"


@pytest.mark.parametrize("kwargs, match", [
    ({"title": "", "xlabel": "x", "ylabel": "latency (s)"}, "missing: title"),
    ({"title": "T", "xlabel": "", "ylabel": "latency (s)"}, "missing: xlabel"),
    ({"title": "T", "xlabel": "x", "ylabel": "latency"}, "names no unit"),
])
def test_a_plot_without_labels_or_unit_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plots.bars(["a"], [1.0], **kwargs)


def test_save_image_writes_a_png(tmp_path):
    from PIL import Image

    from helpers import params, plots

    run = params.resolve("00_x", PROFILE="smoke", FIGURES_DIR=str(tmp_path))
    path = plots.save_image(Image.new("RGB", (8, 4), "white"), run, "cpu", "grid")
    assert path == tmp_path / "cpu" / "00_x_grid.png" and Image.open(path).size == (8, 4)


def test_long_labels_turn_the_bars_sideways_with_every_label_inside_the_figure():
    """A label longer than LONG_LABEL reads level on a sideways chart, wrapped, and nothing is cut at the edge."""
    labels = ["eager", "compiled (default, no precision-cast emulation)", "compiled (default)"]
    fig = plots.bars(labels, [5.07, 3.87, 4.28], title="Whole pipeline latency", xlabel="setting",
                     ylabel="seconds per image (median)")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "seconds per image (median)" and ax.get_ylabel() == "setting"
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert [t.replace("\n", " ") for t in ticks] == labels and max(len(x) for t in ticks for x in t.split("\n")) \
        <= plots.WRAP
    fig.canvas.draw()
    box = fig.bbox
    for text in ax.get_yticklabels() + [ax.title, ax.xaxis.label, ax.yaxis.label]:
        inner = text.get_window_extent()
        assert inner.x0 >= box.x0 - 1 and inner.x1 <= box.x1 + 1 and inner.y0 >= box.y0 - 1 \
            and inner.y1 <= box.y1 + 1, f"{text.get_text()!r} is cut at the figure's edge"
    # short labels stay upright
    upright = plots.bars(["a", "b"], [1.0, 2.0], title="T", xlabel="setting", ylabel="latency (s)").axes[0]
    assert [t.get_text() for t in upright.get_xticklabels()] == ["a", "b"]


def test_the_smoke_caveat_names_the_device_and_is_empty_on_the_full_profile():
    from dataclasses import replace

    import torch

    from helpers import params

    run = params.resolve("03_torch_compile", PROFILE="smoke")
    assert plots.smoke_caveat(run) == "; smoke: a tiny model on a CPU, not the full-size workload"
    assert "on a GPU" in plots.smoke_caveat(replace(run, device=torch.device("cuda")), "\n")
    assert plots.smoke_caveat(replace(run, profile="full")) == ""


def test_a_log_axis_reads_as_plain_numbers_with_a_tick_at_each_point():
    fig = plots.lines([128, 256, 512], {"a": [0.004, 0.006, 0.013]}, title="t", xlabel="x (px)", ylabel="y (s)",
                      logy=True)
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
    assert "0.01" in labels and "0.004" in labels and not any("10^" in s or "times" in s for s in labels), labels
    assert list(ax.get_xticks()) == [128, 256, 512]
