"""Plot readability rules checked on the figures themselves (axes, ticks, styles, panels).

Run: pytest tests/test_report_plots.py
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from rove.report.plots import has_ruler_data, plot_ruler, ppl_figure, training_figure
from test_report import three_seed_results


def _runs() -> list[dict]:
    runs = three_seed_results()["runs"]
    for r in runs:  # a wide range: 64 .. 2048 at training length 128
        r["ppl"] = {"64": 10.0, "128": 8.0, "256": 12.0, "512": 20.0, "1024": 40.0, "2048": 90.0}
        r["ppl_scaled"] = {"yarn": {"256": 9.0, "512": 10.0, "1024": 12.0, "2048": 15.0}}
    return runs


def test_ppl_plot_log2_axis_labelled_with_lengths_and_train_length_marked() -> None:
    fig = ppl_figure(_runs())
    ax = fig.axes[0]
    try:
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["64", "128", "256", "512", "1024", "2048"]
        assert ax.xaxis.get_minor_locator().tick_values(64, 2048) == []
        ylabels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(ylabels) >= 4 and all("10^" not in y and "times" not in y for y in ylabels)
        # a vertical line at the training length, with its label
        assert any(list(line.get_xdata()) == [128, 128] for line in ax.get_lines())
        assert any("training length 128" in t.get_text() for t in ax.texts)
        # per curve: (colour, marker) identifies the method, line style the scaling
        curves = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        assert set(curves) == {"rope", "rove", "rope + yarn", "rove + yarn"}
        assert curves["rope"].get_marker() != curves["rove"].get_marker()
        assert curves["rope"].get_color() != curves["rove"].get_color()
        assert curves["rope"].get_linestyle() != curves["rope + yarn"].get_linestyle()
        # the scaled curve starts at the training length (joined to the plain value)
        assert list(curves["rove + yarn"].get_xdata()) == [128, 256, 512, 1024, 2048]
    finally:
        plt.close(fig)


def test_training_curves_distinct_styles_per_method() -> None:
    fig = training_figure(_runs())
    try:
        assert [ax.get_title() for ax in fig.axes] == ["training loss", "validation loss"]
        lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
        assert lines["rope"].get_linestyle() != lines["rove"].get_linestyle()
        assert lines["rope"].get_marker() != lines["rove"].get_marker()
    finally:
        plt.close(fig)


def test_ruler_plot_only_panels_with_data(tmp_path) -> None:
    runs = _runs()
    for r in runs:  # a second length where every cell failed: no panel for it
        r["ruler"]["none"]["vt"]["1024"] = {"nll": None, "accuracy": None, "error": "too long"}
    out = plot_ruler(runs, tmp_path / "ruler.png")
    assert out.stat().st_size > 1000
    for r in runs:
        r["ruler"] = {"none": {"vt": {"512": {"nll": None, "accuracy": None, "error": "x"}}}}
    assert not has_ruler_data(runs)
    with pytest.raises(ValueError, match="no RULER value"):
        plot_ruler(runs, tmp_path / "empty.png")


def test_position_loss_plot_uses_the_longest_common_length(tmp_path) -> None:
    from rove.report.plots import longest_position_length, plot_position_loss

    runs = _runs()
    assert longest_position_length(runs) is None  # no curves: no figure
    for r in runs:
        curve = {"buckets": [[0, 128], [128, 256]], "loss": [2.0, 3.0]}
        r["position_loss"] = {"none": {"256": curve, "512": curve}, "yarn": {"512": curve}}
    runs[0]["position_loss"]["none"].pop("512")  # one run lacks 512: 256 is common to all
    assert longest_position_length(runs) == 256
    assert plot_position_loss(runs, tmp_path / "pos.png").stat().st_size > 1000
