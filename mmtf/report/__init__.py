"""Run reports: learning curves and a Markdown summary from a training run's logs.

``python -m mmtf.report run_dir=<run or multirun dir>`` writes into ``<run_dir>/report/``
``learning_curves.png`` and ``summary.md`` (best and test metrics, time, throughput, config keys
that differ from the experiment's defaults); for a multirun, one table of all jobs and
``sweep.png``. From Python: ``summarize(run_dir)``, ``plot_learning_curves(summary.logs, path)``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from mmtf.report.logs import REPORT_DIR, RunLogs, Timing, check_dir, is_run_dir, load_run
from mmtf.report.plots import plot_learning_curves, plot_sweep
from mmtf.report.summary import RunSummary, config_diff, summarize
from mmtf.report.sweep import SweepSummary, summarize_sweep

__all__ = ["RunLogs", "RunSummary", "SweepSummary", "Timing", "config_diff", "load_run",
           "plot_learning_curves", "plot_sweep", "summarize", "summarize_sweep", "write_report"]


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, *,
                 metric: str | None = None, mode: Literal["min", "max"] | None = None,
                 smoothing: float = 0.6) -> list[Path]:
    """Write the report of a run dir or a multirun dir; return the files written.

    Args:
        run_dir: ``outputs/<task>/runs/<time>`` or ``outputs/<task>/multiruns/<time>``.
        out_dir: where to write (default: ``<run_dir>/report``).
        metric, mode: the metric to rank by and ``min`` | ``max`` (defaults: the run's
            ``optimized_metric``, :func:`mmtf.report.summary.metric_mode`).
        smoothing: TensorBoard-style smoothing of the training curves, 0 to < 1.

    Raises:
        UserError: ``run_dir`` is neither, or a single run holds no logs.
    """
    run_dir = check_dir(run_dir)
    out = Path(out_dir).expanduser() if out_dir else run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    if is_run_dir(run_dir):
        summary = summarize(run_dir, metric=metric, mode=mode)
        image = out / "learning_curves.png"
        plot_learning_curves(summary.logs, image, smoothing=smoothing)
        text = summary.to_markdown(image=image.name)
    else:
        sweep = summarize_sweep(run_dir, metric=metric, mode=mode)
        image = out / "sweep.png"
        plot_sweep(sweep, image)
        text = sweep.to_markdown(image=image.name)
    markdown = out / "summary.md"
    markdown.write_text(text)
    return [image, markdown]
