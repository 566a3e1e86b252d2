"""The learning-curve and sweep figures: panels, the data drawn, a valid PNG."""

from __future__ import annotations

import numpy as np
from PIL import Image

from mmtf.report import plot_learning_curves, summarize_sweep
from mmtf.report.plots import plot_sweep, smooth

from .fixtures import VAL_ACCURACY, csv_rows, make_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_one_panel_per_metric_family_loss_first_lr_last(tmp_path):
    run = make_run(tmp_path / "run", rows=csv_rows())
    fig = plot_learning_curves(run, tmp_path / "out" / "curves.png")
    # loss (train+val), event_accuracy (val+test), bleu (bleu_1, bleu_2), the learning rate;
    # test/meteor alone (one test point, no curve) gets no panel.
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "loss", "event_accuracy", "bleu", "learning rate"]
    png = (tmp_path / "out" / "curves.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    width, height = Image.open(tmp_path / "out" / "curves.png").size
    w_in, h_in = fig.get_size_inches()
    assert (width, height) == (round(w_in * fig.dpi), round(h_in * fig.dpi))


def test_panels_draw_the_logged_values(tmp_path):
    fig = plot_learning_curves(make_run(tmp_path / "run", rows=csv_rows()))
    accuracy = fig.axes[1]
    lines = {line.get_label(): line for line in accuracy.get_lines()}
    assert list(lines["val"].get_xdata()) == [9, 19, 29]
    assert list(lines["val"].get_ydata()) == VAL_ACCURACY
    assert list(lines["test"].get_ydata()) == [0.65]
    assert (lines["best"].get_xdata()[0], lines["best"].get_ydata()[0]) == (19, 0.70)
    lr = fig.axes[3]
    assert len(lr.get_lines()) == 1          # two param groups, one schedule: drawn once


def test_smoothing_is_tensorboards_debiased_moving_average():
    values = np.array([1.0, 2.0, 4.0])
    w = 0.5
    # By hand: ema_1 = 0.5, ema_2 = 1.25, ema_3 = 2.625; debias by 1 - w**i.
    expected = [0.5 / 0.5, 1.25 / 0.75, 2.625 / 0.875]
    np.testing.assert_allclose(smooth(values, w), expected)


def test_sweep_figure_has_one_panel_per_swept_parameter(tmp_path):
    sweep = tmp_path / "sweep"
    for job, (lr, depth, acc) in enumerate([(1e-4, 1, 0.5), (1e-3, 2, 0.9), (1e-2, 1, 0.7)]):
        make_run(sweep / str(job), rows=None, metrics={"val/event_accuracy": acc},
                 overrides=["experiment=audio_captioning", f"model.optimizer.lr={lr}",
                            f"model.decoder.depth={depth}"])
    fig = plot_sweep(summarize_sweep(sweep), tmp_path / "sweep.png")
    assert [ax.get_xlabel() for ax in fig.axes] == ["model.optimizer.lr", "model.decoder.depth"]
    assert fig.axes[0].get_xscale() == "log"     # 1e-4 .. 1e-2 spans two decades
    points = sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in fig.axes[0].get_lines())
    assert points == [(1e-4, 0.5), (1e-3, 0.9), (1e-2, 0.7)]
    assert (tmp_path / "sweep.png").read_bytes().startswith(PNG_MAGIC)


def test_sweep_figure_overlays_each_jobs_curve(tmp_path):
    sweep = tmp_path / "sweep"
    for job, lr in enumerate(["1e-3", "3e-3"]):
        make_run(sweep / str(job), rows=csv_rows(), metrics={"val/event_accuracy": 0.5 + job},
                 overrides=[f"model.optimizer.lr={lr}"])
    fig = plot_sweep(summarize_sweep(sweep))
    assert [ax.get_xlabel() for ax in fig.axes] == ["model.optimizer.lr", "step"]
    lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
    assert set(lines) == {"job 0: lr=1e-3", "job 1: lr=3e-3"}
    assert list(lines["job 0: lr=1e-3"].get_ydata()) == VAL_ACCURACY


def test_tensorboard_hparams_copy_of_a_metric_gets_no_panel():
    from mmtf.report.plots import group_panels

    point = [(9, 0.5)]
    scalars = {"val/event_accuracy": point, "hp/val/event_accuracy": point, "val/loss": point}
    assert group_panels(scalars, "val/event_accuracy") == {
        "loss": ["val/loss"], "event_accuracy": ["val/event_accuracy"]}
