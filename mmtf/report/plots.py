"""Learning curves of one run and metric-vs-parameter plots of a sweep, as matplotlib figures.

Headless: plain ``matplotlib.figure.Figure`` objects, never pyplot's (no display or global
backend touched; a notebook still shows them), rendered with Agg and returned for inspection.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from mmtf.report.logs import RunLogs, Series, load_run
from mmtf.report.summary import best_metrics, format_duration

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from mmtf.report.sweep import SweepSummary

SPLIT_COLORS = {"train": "#1f77b4", "val": "#ff7f0e", "test": "#d62728"}
MEMBER_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")
BEST_COLOR = "#2ca02c"
LR_TITLE = "learning rate"
DPI = 130


def plot_learning_curves(run: str | Path | RunLogs, path: str | Path | None = None, *,
                         smoothing: float = 0.6) -> Figure:
    """One figure of a run's curves: one panel per metric family, the learning rate last.

    A family is a metric across splits and its numbered variants (``val/bleu_1..4``). Training
    curves are raw (faint) and smoothed as TensorBoard does; test results are stars; the
    ``optimized_metric`` panel comes second and rings its best value; dotted lines mark resumes.

    Args:
        run: a run dir, or what :func:`mmtf.report.load_run` returned for one.
        path: where to save the PNG (None: do not save).
        smoothing: 0 (raw) to < 1 (smoother) for the training curves.

    ``figure.axes`` holds one panel per family (spare grid cells removed).
    """
    logs = run if isinstance(run, RunLogs) else load_run(run)
    panels = group_panels(logs.scalars, logs.optimized_metric)
    if not panels:
        panels = {"(nothing logged)": []}
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.2 * ncols, 3.6 * nrows + 0.5), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    ends = epoch_ends(logs.scalars)
    steps = [s for key, series in logs.scalars.items() if key != "epoch" for s, _ in series]
    pad = 0.02 * (max(steps) - min(steps) + 1) if steps else 0
    for i, (ax, (title, keys)) in enumerate(zip(axes, panels.items())):
        if steps:                       # one step range in every panel: they line up
            ax.set_xlim(min(steps) - pad, max(steps) + pad)
        _draw_panel(ax, title, keys, logs, smoothing)
        if i < ncols:                   # the top row
            _epoch_axis(ax, ends)
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    fig.suptitle(_title(logs), fontsize=12)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    return fig


def group_panels(scalars: dict[str, Series], optimized_metric: str | None) -> dict[str, list[str]]:
    """``{panel title: [keys]}``: loss first, the optimized metric's family next, lr last.

    A family logged only at test time (one point, e.g. METEOR) gets no panel: the summary's
    test table holds it."""
    families: dict[str, list[str]] = {}
    lr: list[str] = []
    for key in scalars:
        if key == "epoch" or key.startswith("hp/"):
            continue              # hp/<metric>: TensorBoard's HParams copy of a plotted metric
        if key.startswith("lr-"):
            lr.append(key)
            continue
        families.setdefault(family_of(key), []).append(key)
    families = {f: keys for f, keys in families.items()
                if any(_split_of(k) != "test" for k in keys)}
    first = ["loss", family_of(optimized_metric) if optimized_metric else ""]
    order = sorted(families, key=lambda f: (f not in first, first.index(f) if f in first else 0, f))
    panels = {f: families[f] for f in order}
    if lr:
        panels[LR_TITLE] = lr
    return panels


def family_of(key: str) -> str:
    """``val/bleu_4`` -> ``bleu``; ``train/loss_step`` -> ``loss``; ``grad_norm`` -> itself."""
    name = key.split("/", 1)[1] if _split_of(key) else key
    name = re.sub(r"_(step|epoch)$", "", name)
    return re.sub(r"_\d+$", "", name)


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start."""
    out = np.empty(len(values))
    last = 0.0
    for i, v in enumerate(values):
        last = last * weight + (1 - weight) * v
        out[i] = last / (1 - weight ** (i + 1))
    return out


def _split_of(key: str) -> str | None:
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return prefix if prefix in SPLIT_COLORS else None


def _draw_panel(ax: Axes, title: str, keys: list[str], logs: RunLogs, smoothing: float) -> None:
    ax.set_title(title, fontsize=11, loc="left", fontweight="bold")
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    members = sorted({k.split("/", 1)[-1] for k in keys})
    many = len(members) > 1
    if title == LR_TITLE:
        keys = _distinct_lr(keys, logs.scalars)
    tested = False
    for key in sorted(keys, key=_draw_order):
        series = logs.scalars[key]
        steps = np.array([s for s, _ in series])
        values = np.array([v for _, v in series])
        split = _split_of(key)
        member = key.split("/", 1)[-1]
        color = (MEMBER_COLORS[members.index(member) % len(MEMBER_COLORS)] if many and split
                 else SPLIT_COLORS.get(split or "", "#444444"))
        label = (member if many and split == "val" else key if many or not split else split)
        if title == LR_TITLE:
            label = key.split("/", 1)[0] if len(keys) == 1 else key
        if split == "test":                 # the last test only: a resumed run may test twice
            steps, values = steps[-1:], values[-1:]
            label = None if many and tested else ("test" if many else label)
            tested = True
            ax.plot(steps, values, "*", color=color, markersize=11, markeredgecolor="black",
                    markeredgewidth=0.5, label=label, zorder=4)
        elif split == "train" and len(values) > 20 and smoothing > 0:
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, smooth(values, smoothing), color=color, linewidth=1.6, label=label)
        elif split == "val" or len(values) <= 3:
            ax.plot(steps, values, "o-", color=color, markersize=3.5, linewidth=1.3, label=label)
        else:
            ax.plot(steps, values, color=color, linewidth=1.4, label=label)
    if title == LR_TITLE:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3), useMathText=True)
    _ring_best(ax, keys, logs)
    for step in logs.resumed_at:
        ax.axvline(step, color="#888888", linestyle=":", linewidth=1.2, zorder=1)
        if title == "loss":
            ax.annotate("resumed", (step, 1), xycoords=("data", "axes fraction"),
                        xytext=(3, -3), textcoords="offset points", ha="left", va="top",
                        fontsize=7, color="#666666")
    ax.legend(fontsize=8, frameon=False, loc="best")


def _draw_order(key: str) -> tuple[int, str]:
    return ({"train": 0, "val": 1, "test": 2}.get(_split_of(key) or "", 3), key)


def _distinct_lr(keys: list[str], scalars: dict[str, Series]) -> list[str]:
    """One key per distinct learning-rate curve (param groups on one schedule draw once)."""
    distinct: list[str] = []
    for key in sorted(keys):
        if all(scalars[key] != scalars[k] for k in distinct):
            distinct.append(key)
    return distinct


def _ring_best(ax: Axes, keys: list[str], logs: RunLogs) -> None:
    """Ring the best validation value of the optimized metric and write it beside."""
    key = logs.optimized_metric
    if key not in keys or not logs.scalars.get(key):
        return
    best = next(b for b in best_metrics(logs) if b.key == key)
    ax.plot([best.step], [best.value], "o", markersize=13, markerfacecolor="none",
            markeredgecolor=BEST_COLOR, markeredgewidth=2, zorder=5, label="best")
    where = f"epoch {best.epoch}" if best.epoch is not None else f"step {best.step}"
    lo, hi = ax.get_xlim()
    inward = -1 if best.step > (lo + hi) / 2 else 1       # write towards the middle
    up = 1 if best.mode == "min" else -1                  # away from the curve's extreme
    ax.annotate(f"best {best.value:.4g}\n{where}", (best.step, best.value),
                xytext=(12 * inward, 8 * up), textcoords="offset points",
                ha="left" if inward > 0 else "right", va="bottom" if up > 0 else "top",
                fontsize=8, color=BEST_COLOR, fontweight="bold", zorder=6,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none",
                      "alpha": 0.85})


def epoch_ends(scalars: dict[str, Series]) -> dict[int, int]:
    """``{epoch: its last step}`` from the training and validation logs (test rows excluded:
    Lightning logs them with the epoch count after the last epoch)."""
    steps = {s for key, series in scalars.items() if _split_of(key) in ("train", "val")
             for s, _ in series}
    ends: dict[int, int] = {}
    for step, epoch in scalars.get("epoch", []):
        if step in steps:
            ends[int(epoch)] = max(step, ends.get(int(epoch), step))
    return ends


def _epoch_axis(ax: Axes, ends: dict[int, int]) -> None:
    """A top axis in Lightning's 0-based epochs: tick ``e`` where epoch ``e`` ended."""
    if len(ends) < 2:
        return
    xp = np.array([float(ends[e]) for e in sorted(ends)])
    fp = np.array([float(e) for e in sorted(ends)])
    if np.any(np.diff(xp) <= 0):
        return

    def to_epoch(steps: np.ndarray) -> np.ndarray:        # linear beyond both ends
        slope = (fp[-1] - fp[0]) / (xp[-1] - xp[0])
        inside = np.interp(steps, xp, fp)
        return np.where(steps < xp[0], fp[0] + (steps - xp[0]) * slope,
                        np.where(steps > xp[-1], fp[-1] + (steps - xp[-1]) * slope, inside))

    def to_step(epochs: np.ndarray) -> np.ndarray:
        slope = (xp[-1] - xp[0]) / (fp[-1] - fp[0])
        inside = np.interp(epochs, fp, xp)
        return np.where(epochs < fp[0], xp[0] + (epochs - fp[0]) * slope,
                        np.where(epochs > fp[-1], xp[-1] + (epochs - fp[-1]) * slope, inside))

    top = ax.secondary_xaxis("top", functions=(to_epoch, to_step))
    top.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    top.tick_params(labelsize=7, colors="#666666", length=2, pad=1)
    top.set_xlabel("epoch", fontsize=7, color="#666666", labelpad=1)


def _title(logs: RunLogs) -> str:
    parts = [str(logs.config.get("task_name", "run")), logs.run_dir.name]
    best = next((b for b in best_metrics(logs) if b.key == logs.optimized_metric), None)
    if best is not None:
        where = f" (epoch {best.epoch})" if best.epoch is not None else ""
        parts.append(f"best {best.key} = {best.value:.4g}{where}")
    if logs.timing.wall_s is not None:
        parts.append(f"wall time {format_duration(logs.timing.wall_s)}")
    return "   ·   ".join(parts)


def plot_sweep(sweep: SweepSummary, path: str | Path | None = None) -> Figure:
    """The sweep's metric against each swept parameter, then the metric's curve of every job.

    One panel per swept parameter (jobs as numbered points, the best a green star; a log axis
    for numbers spanning more than a decade), then each job's validation curve of the metric.

    ``sweep``: what :func:`mmtf.report.summarize_sweep` returned; ``path``: where to save the
    PNG (None: do not save). With nothing varying, the parameter panel is empty."""
    params = sweep.swept or ["(no parameter varies between jobs)"]
    curves = [job for job in sweep.jobs if len(job.curve) > 1]
    n = len(params) + bool(curves)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(max(4.8 * ncols, 6.4), 3.8 * nrows + 0.7), dpi=DPI,
                 layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    scored = [job for job in sweep.jobs if job.metric is not None]
    best = scored[0] if scored else None
    better = "higher" if sweep.mode == "max" else "lower"
    for ax, param in zip(axes, params):
        ax.grid(True, alpha=0.3)
        ax.set_xlabel(param)
        ax.set_ylabel(f"{sweep.metric} ({better} is better)", fontsize=9)
        xs = [job.params.get(param) for job in scored]
        positions, labels = _positions(xs)
        for job, x in zip(scored, positions):
            star = job is best
            ax.plot([x], [job.metric], "*" if star else "o", markersize=15 if star else 7,
                    color=BEST_COLOR if star else SPLIT_COLORS["val"], markeredgecolor="black",
                    markeredgewidth=0.5, zorder=3)
            ax.annotate(f"job {job.name}" + (" (best)" if star else ""), (x, job.metric),
                        xytext=(8, 5), textcoords="offset points", fontsize=8,
                        color=BEST_COLOR if star else "#555555")
        ax.margins(x=0.12, y=0.12)
        if labels is not None:
            ax.set_xticks(range(len(labels)), labels)
            ax.set_xlim(-0.5, len(labels) - 0.5)
        else:
            if _log_scale(xs):
                ax.set_xscale("log")
            values = sorted(set(xs))
            if len(values) <= 8:          # a grid: tick exactly the values tried
                ax.set_xticks(values, [f"{v:g}" for v in values])
                ax.minorticks_off()
    if curves:
        ax = axes[len(params)]
        ax.set_title(f"{sweep.metric} during training", fontsize=10, loc="left")
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("step")
        for i, job in enumerate(curves):
            setting = ", ".join(f"{k.rsplit('.', 1)[-1]}={job.overrides[k]}"
                                for k in sweep.swept if k in job.overrides)
            ax.plot([s for s, _ in job.curve], [v for _, v in job.curve], "o-", markersize=3,
                    linewidth=2.2 if job is best else 1.2,
                    color=MEMBER_COLORS[i % len(MEMBER_COLORS)],
                    label=f"job {job.name}: {setting}" if setting else f"job {job.name}")
        ax.legend(fontsize=7, frameon=False, loc="best")
    for ax in axes[n:]:
        fig.delaxes(ax)
    title = f"{sweep.task}  ·  sweep {sweep.sweep_dir.name}  ·  {len(sweep.jobs)} jobs"
    if best is not None:
        title += f"\nbest: job {best.name}, {sweep.metric} = {best.metric:.4g}"
    fig.suptitle(title, fontsize=11)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    return fig


def _positions(values: list[Any]) -> tuple[list[Any], list[str] | None]:
    """Numeric values as they are; anything else as category positions with tick labels."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return values, None
    labels = sorted({str(v) for v in values})
    return [labels.index(str(v)) for v in values], labels


def _log_scale(values: list[Any]) -> bool:
    numbers = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return len(numbers) == len(values) > 1 and max(numbers) / min(numbers) >= 10

