"""A multirun (``python -m mmtf.train -m ...``) as one table: jobs, their overrides, the metric.

A sweep dir ``outputs/<task>/multiruns/<time>`` holds one run dir per job (``0``, ``1``, ...).
The swept parameters are the overrides whose value differs between jobs (grid sweeps and Optuna
alike); the overrides every job shares are listed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mmtf.errors import UserError
from mmtf.report.logs import RUN_HINT, Series, check_dir, is_run_dir, job_dirs, load_run
from mmtf.report.summary import format_value, metric_mode


@dataclass
class Job:
    """One job of a sweep.

    Attributes:
        name, run_dir: the job dir's name (Hydra's job number) and path.
        overrides: the job's command-line overrides, ``{key: value as written}``.
        params: the swept overrides' values, parsed as YAML (``1e-3`` -> 0.001).
        metric: the job's final value of the sweep's metric (``metrics.json``; None: unfinished).
        best: the best value of the metric over the job's validation curve (None: no curve).
        test: the job's ``test/`` value of the same metric (None: not tested).
        curve: the metric over training, ``[(step, value), ...]`` (empty: no logs).
    """

    name: str
    run_dir: Path
    overrides: dict[str, str]
    params: dict[str, Any] = field(default_factory=dict)
    metric: float | None = None
    best: float | None = None
    test: float | None = None
    curve: Series = field(default_factory=list)


@dataclass
class SweepSummary:
    """What :func:`summarize_sweep` finds; jobs sorted best first, unfinished jobs last."""

    sweep_dir: Path
    task: str
    metric: str
    mode: Literal["min", "max"]
    jobs: list[Job]
    swept: list[str]
    common: dict[str, str]

    @property
    def test_metric(self) -> str:
        """The ``test/`` twin of the metric (``val/cider_d`` -> ``test/cider_d``)."""
        return "test/" + self.metric.split("/", 1)[-1]

    def to_markdown(self, image: str | None = None) -> str:
        """The sweep table as Markdown; ``image``: a metric-vs-parameter PNG to embed."""
        better = "higher" if self.mode == "max" else "lower"
        lines = [f"# Sweep report: {self.task} / {self.sweep_dir.name}", "",
                 f"- sweep dir: `{self.sweep_dir}`",
                 f"- {len(self.jobs)} jobs, sorted by `{self.metric}` ({better} is better; the "
                 f"final value in each job's metrics.json, the value the sweeper saw)"]
        if self.common:
            shared = " ".join(f"{k}={v}" for k, v in self.common.items())
            lines.append(f"- shared by every job: `{shared}`")
        if image:
            lines += ["", f"![metric against each swept parameter]({image})"]
        tested = any(job.test is not None for job in self.jobs)
        header = ["rank", "job", *[f"`{p}`" for p in self.swept], f"`{self.metric}`",
                  "best on val curve", *([f"`{self.test_metric}`"] if tested else [])]
        align = ["---:", "---:", *["---"] * len(self.swept), "---:", "---:", *["---:"] * tested]
        lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
        for rank, job in enumerate(self.jobs, 1):
            cells = [str(rank) if job.metric is not None else "—", job.name,
                     *[f"`{job.overrides.get(p, '(default)')}`" for p in self.swept],
                     format_value(job.metric) if job.metric is not None else "not finished",
                     format_value(job.best) if job.best is not None else "",
                     *([format_value(job.test) if job.test is not None else ""] if tested else [])]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def summarize_sweep(sweep_dir: str | Path, *, metric: str | None = None,
                    mode: Literal["min", "max"] | None = None) -> SweepSummary:
    """Summarize a multirun dir: every job with its overrides and metric, best first.

    Args:
        sweep_dir: ``outputs/<task>/multiruns/<time>``.
        metric: the metric to sort by (default: the jobs' ``optimized_metric``).
        mode: ``min`` or ``max`` (default: :func:`mmtf.report.summary.metric_mode`).

    Raises:
        UserError: ``sweep_dir`` is not a multirun dir, or no job names a metric.
    """
    sweep_dir = check_dir(sweep_dir)
    if is_run_dir(sweep_dir):
        raise UserError(f"run_dir {sweep_dir} is a single run, not a multirun dir; summarize it "
                        f"with summarize('{sweep_dir}'), or {RUN_HINT}.")
    dirs = job_dirs(sweep_dir)
    if not dirs:
        raise UserError(f"multirun dir {sweep_dir} holds no job dirs yet (<job>/.hydra/"
                        f"config.yaml); report it once its first job has started.")
    runs = [load_run(d, require_logs=False) for d in dirs]
    first = runs[0].config
    metric = metric or first.get("optimized_metric")
    if not metric:
        raise UserError(f"the jobs of {sweep_dir} name no optimized_metric; pass metric=<a key "
                        f"of their metrics.json>, e.g. metric=val/loss.")
    mode = mode or metric_mode(metric, first.get("optimized_metric"), first.get("optimized_mode"))
    jobs = []
    for run in runs:
        overrides = dict(_split_override(o) for o in run.overrides)
        curve = run.scalars.get(metric, [])
        values = [v for _, v in curve]
        best = (max(values) if mode == "max" else min(values)) if values else None
        test = run.final_metrics.get("test/" + metric.split("/", 1)[-1])
        jobs.append(Job(name=run.run_dir.name, run_dir=run.run_dir, overrides=overrides,
                        metric=run.final_metrics.get(metric), best=best,
                        test=test if test is not None and metric.startswith("val/") else None,
                        curve=curve))
    swept, common = split_overrides([job.overrides for job in jobs])
    for job in jobs:
        job.params = {p: _parse(job.overrides[p]) for p in swept if p in job.overrides}
    sign = -1 if mode == "max" else 1
    jobs.sort(key=lambda j: (j.metric is None, sign * j.metric if j.metric is not None else 0))
    return SweepSummary(sweep_dir=sweep_dir, task=first.get("task_name", "train"), metric=metric,
                        mode=mode, jobs=jobs, swept=swept, common=common)


def split_overrides(per_job: list[dict[str, str]]) -> tuple[list[str], dict[str, str]]:
    """(swept keys in first-seen order, {key: value} shared by every job)."""
    keys = list(dict.fromkeys(k for job in per_job for k in job))
    swept = [k for k in keys if len({job.get(k) for job in per_job}) > 1]
    common = {k: per_job[0][k] for k in keys if k not in swept}
    return swept, common


def _split_override(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return key, value


def _parse(value: str) -> Any:
    """An override's value as YAML would read it; the text itself when that fails."""
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if isinstance(parsed, str):
        try:
            return float(parsed)       # YAML 1.1 reads "1e-3" (no dot) as a string
        except ValueError:
            return parsed
    return parsed

