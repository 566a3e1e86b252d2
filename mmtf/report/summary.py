"""One run's summary: best metrics, config diff against the experiment's defaults, time.

:func:`summarize` reads a run dir (:func:`mmtf.report.logs.load_run`) and returns a
:class:`RunSummary`; ``RunSummary.to_markdown()`` is the ``summary.md`` that
``python -m mmtf.report`` writes.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmtf.report.logs import RunLogs, Series, load_run
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.parts import upgrade_config

# Keys that say where files go, not how the model trains: never part of the config diff.
_PATH_ROOTS = ("paths",)
_PATH_INTERPOLATIONS = ("${paths.", "${hydra:", "${now:")


class _Absent:
    """The value of a config key that one side of a diff lacks."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()
# Metrics where lower is better; any other metric is better higher (BLEU, CIDEr-D, accuracy).
LOWER_IS_BETTER = re.compile(r"(^|_)(loss|wer|cer|error|perplexity|ppl)($|_)")


@dataclass
class Best:
    """The best value of one logged metric (``key``: ``val/cider_d``), the step and epoch
    (None if the logs hold none) it was logged at, and the ``last`` value logged."""

    key: str
    mode: Literal["min", "max"]
    value: float
    step: int
    epoch: int | None
    last: float


@dataclass
class ConfigChange:
    """A config value that differs from the experiment's default (:data:`ABSENT`: no such key)."""

    key: str
    default: Any
    value: Any


@dataclass
class RunSummary:
    """What :func:`summarize` finds; :meth:`to_markdown` renders it.

    Attributes:
        best: the best value of each validation/test metric, optimized metric first.
        changes: the config keys that differ from the experiment's defaults.
        experiment: the ``experiment=`` override (None: the root config's defaults).
    """

    logs: RunLogs
    best: list[Best]
    changes: list[ConfigChange]
    experiment: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def optimized(self) -> Best | None:
        """The best value of the run's ``optimized_metric`` (None if not logged)."""
        return next((b for b in self.best if b.key == self.logs.optimized_metric), None)

    def to_markdown(self, image: str | None = None) -> str:
        """The summary as Markdown; ``image``: a learning-curves PNG path to embed."""
        logs, opt = self.logs, self.optimized
        experiment = self.experiment or f"(none: conf/{logs.config_name}.yaml)"
        lines = [f"# Run report: {logs.config.get('task_name', 'run')} / {logs.run_dir.name}", "",
                 f"- run dir: `{logs.run_dir}`", f"- experiment: `{experiment}`"]
        if opt is not None:
            where = f"epoch {opt.epoch}, " if opt.epoch is not None else ""
            lines.append(f"- best `{opt.key}` ({opt.mode}): **{format_value(opt.value)}** "
                         f"({where}step {opt.step})")
        lines.append(f"- command: `python -m mmtf.train {' '.join(logs.overrides)}`")
        lines += _sample_lines(logs.run_dir)
        lines += ["", *_time_lines(logs), _sources_line(logs), *[f"- {n}" for n in self.notes]]
        if image:
            lines += ["", f"![learning curves]({image})"]
        return "\n".join([*lines, *self._metric_tables(), *error_tables(logs.run_dir),
                          *self._diff_table()]) + "\n"

    def _metric_tables(self) -> list[str]:
        lines = []
        if self.best:
            lines += ["", "## Best metrics", "", "| metric | better | best | epoch | step | last |",
                      "|---|---|---:|---:|---:|---:|"]
            lines += [f"| `{b.key}` | {'higher' if b.mode == 'max' else 'lower'} "
                      f"| {format_value(b.value)} | {'' if b.epoch is None else b.epoch} "
                      f"| {b.step} | {format_value(b.last)} |" for b in self.best]
        final = {k: v for k, v in self.logs.final_metrics.items() if k.startswith("test/")}
        if final:
            lines += ["", "## Test metrics (metrics.json)", "", "| metric | value |", "|---|---:|"]
            lines += [f"| `{k}` | {format_value(v)} |" for k, v in final.items()]
        return lines

    def _diff_table(self) -> list[str]:
        title = (f"## Config vs. the defaults of `experiment={self.experiment}`"
                 if self.experiment else "## Config vs. the root config's defaults")
        if not self.changes:
            return ["", title, "", "No changes (paths and output dirs are not compared)."]
        return ["", title, "", "| key | default | this run |", "|---|---|---|",
                *[f"| `{c.key}` | {_cell(c.default)} | {_cell(c.value)} |" for c in self.changes]]


def summarize(run_dir: str | Path, *, metric: str | None = None,
              mode: Literal["min", "max"] | None = None) -> RunSummary:
    """Summarize one run dir written by ``python -m mmtf.train``.

    Args:
        metric, mode: the metric to call "optimized" and ``min`` | ``max`` for it (defaults:
            the run's ``optimized_metric``, :func:`metric_mode`).

    Raises:
        UserError: ``run_dir`` is not a run dir or holds no logs.
    """
    logs = load_run(run_dir)
    if metric is not None or mode is not None:
        metric = metric or logs.optimized_metric
        mode = mode or metric_mode(metric or "", logs.optimized_metric, logs.optimized_mode)
        logs.config = {**logs.config, "optimized_metric": metric, "optimized_mode": mode}
    experiment = experiment_of(logs.overrides)
    notes = []
    try:
        default, raw_default = compose_defaults(logs.config_name, experiment)
        changes = config_diff(default, logs.config, raw_default=raw_default)
    except (HydraException, OmegaConfBaseException) as err:   # a run from another conf/ tree
        changes = []
        notes.append(f"config diff skipped: the experiment's defaults do not compose ({err})")
    if logs.resumed_at:
        steps = ", ".join(str(s) for s in logs.resumed_at)
        notes.append(f"resumed: a new start logs from step {steps} on (dotted lines in the plot)")
    return RunSummary(logs=logs, best=best_metrics(logs), changes=changes, experiment=experiment,
                      notes=notes)


def experiment_of(overrides: list[str]) -> str | None:
    """The value of the last ``experiment=`` override (``+experiment=`` too), or None."""
    values = [o.split("=", 1)[1] for o in overrides
              if o.split("=", 1)[0].lstrip("+") == "experiment" and "=" in o]
    return values[-1] if values else None


def compose_defaults(config_name: str, experiment: str | None) -> tuple[dict, dict]:
    """The experiment alone, composed from mmtf's ``conf/``: (resolved, unresolved) dicts."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [f"experiment={experiment}"] if experiment else []
    if GlobalHydra.instance().is_initialized():      # inside a @hydra.main app (the CLI)
        cfg = compose(config_name, overrides=overrides)
    else:
        with initialize_config_dir(CONF_DIR, version_base="1.3"):
            cfg = compose(config_name, overrides=overrides)
    raw = OmegaConf.to_container(cfg, resolve=False)
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False), raw


def config_diff(default: dict, config: dict, *,
                raw_default: dict | None = None) -> list[ConfigChange]:
    """The dotted keys whose values differ between ``default`` and ``config`` (both resolved).

    A subtree replaced by a value (``callbacks.rich_progress_bar=null``) is one change. Keys
    under ``paths`` and keys whose default interpolates ``${paths.*}``, ``${hydra:...}`` or
    ``${now:...}`` in ``raw_default`` (the unresolved defaults: output dirs, data roots) are
    not compared."""
    changes: list[ConfigChange] = []

    def walk(default: Any, value: Any, raw_default: Any, key: str) -> None:
        if key.split(".")[0] in _PATH_ROOTS:
            return
        if isinstance(raw_default, str) and any(p in raw_default for p in _PATH_INTERPOLATIONS):
            return
        if isinstance(default, dict) and isinstance(value, dict):
            for k in sorted(set(default) | set(value), key=str):
                walk(default.get(k, ABSENT), value.get(k, ABSENT),
                     raw_default.get(k) if isinstance(raw_default, dict) else None,
                     f"{key}.{k}" if key else str(k))
        elif default != value:
            changes.append(ConfigChange(key=key, default=default, value=value))

    walk(default, config, raw_default or {}, "")
    return changes


def best_metrics(logs: RunLogs) -> list[Best]:
    """The best value of every ``val/*`` metric, the optimized metric first."""
    best = []
    epochs = dict(logs.scalars.get("epoch", []))
    for key, series in logs.scalars.items():
        if not key.startswith("val/") or not series:
            continue
        mode = metric_mode(key, logs.optimized_metric, logs.optimized_mode)
        step, value = _best_point(series, mode)
        epoch = epochs.get(step)
        best.append(Best(key=key, mode=mode, value=value, step=step,
                         epoch=None if epoch is None else int(epoch), last=series[-1][1]))
    best.sort(key=lambda b: (b.key != logs.optimized_metric, b.key))
    return best


def metric_mode(key: str, optimized_metric: str | None,
                optimized_mode: str | None) -> Literal["min", "max"]:
    """``max`` or ``min``: the run's ``optimized_mode`` for its optimized metric (and its
    ``test/`` twin), else ``min`` for losses and error rates, ``max`` for the rest."""
    name = key.split("/", 1)[-1]
    if optimized_metric and name == optimized_metric.split("/", 1)[-1]:
        return "max" if optimized_mode == "max" else "min"
    return "min" if LOWER_IS_BETTER.search(name) else "max"


def _best_point(series: Series, mode: str) -> tuple[int, float]:
    """The best (step, value), NaN skipped; ties go to the earliest step."""
    points = [p for p in series if not math.isnan(p[1])] or series
    best_step, best_value = points[0]
    for step, value in points[1:]:
        if (value > best_value) if mode == "max" else (value < best_value):
            best_step, best_value = step, value
    return best_step, best_value


def format_value(value: float) -> str:
    """A metric value for a table: 4 decimals."""
    return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"


def _cell(value: Any) -> str:
    if value is ABSENT:
        return "(absent)"
    text = _flow(value)
    return f"`{text if len(text) <= 60 else text[:57] + '...'}`".replace("|", "\\|")


def _flow(value: Any) -> str:
    """A value as one line of YAML flow style."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return "null" if value is None else str(value)


def _sample_lines(run_dir: Path) -> list[str]:
    """The newest reference-vs-prediction table of each split (``samples/<split>_epoch...md``)."""
    return [f"- last {split} captions: `{path.relative_to(run_dir)}`"
            for split, path in _newest_per_split(run_dir / "samples", "md")]


def _newest_per_split(folder: Path, suffix: str) -> list[tuple[str, Path]]:
    """``(split, newest <split>_epoch*.<suffix> file)``, val first."""
    newest: dict[str, Path] = {}
    for path in sorted(folder.glob(f"*_epoch*.{suffix}")):   # zero-padded: sorts in time
        newest[path.name.split("_epoch", 1)[0]] = path
    return sorted(newest.items(), key=lambda item: item[0] != "val")


def error_tables(run_dir: Path, worst: int = 10) -> list[str]:
    """Speech recognition: per split, the totals of the newest per-utterance errors table
    (``errors/<split>_epoch...csv``, written with WER / CER) and its ``worst`` utterances."""
    lines: list[str] = []
    for split, path in _newest_per_split(run_dir / "errors", "csv"):
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        totals = {k: sum(int(r[k]) for r in rows)
                  for k in ("substitutions", "deletions", "insertions", "hits")}
        lines += ["", f"## Per-utterance errors, {split} (`{path.relative_to(run_dir)}`)", "",
                  f"{len(rows)} utterances: {totals['substitutions']} substitutions, "
                  f"{totals['deletions']} deletions, {totals['insertions']} insertions, "
                  f"{totals['hits']} hits. Worst first:", "",
                  "| id | WER | S | D | I | reference | hypothesis |",
                  "|---|---:|---:|---:|---:|---|---|"]
        lines += [f"| {r['id']} | {float(r['wer']):.3f} | {r['substitutions']} | "
                  f"{r['deletions']} | {r['insertions']} | {_text_cell(r['reference'])} | "
                  f"{_text_cell(r['hypothesis'])} |" for r in rows[:worst]]
    return lines


def _text_cell(text: str) -> str:
    return (text if len(text) <= 80 else text[:77] + "...").replace("|", "\\|")


def _sources_line(logs: RunLogs) -> str:
    csvs = [f"`{p.relative_to(logs.run_dir)}`" for p in logs.sources if p.name == "metrics.csv"]
    events = sum(p.name.startswith("events.out.tfevents") for p in logs.sources)
    return f"- logs read: {', '.join([*csvs, f'{events} TensorBoard event file(s)'])}"


def _time_lines(logs: RunLogs) -> list[str]:
    t = logs.timing
    lines = []
    if t.wall_s is not None:
        lines.append(f"- wall time: **{format_duration(t.wall_s)}** ({t.source})")
    if t.steps_per_s is not None:
        per_step = _samples_per_step(logs.config)
        samples = f", ≈ {t.steps_per_s * per_step:.1f} samples/s at {per_step} samples per " \
                  f"step" if per_step else ""
        lines.append(f"- throughput: **{t.steps_per_s:.2f} steps/s**{samples} "
                     f"({t.throughput_source})")
    return lines


def _samples_per_step(config: dict) -> int | None:
    """data.batches.batch_size x accumulate_grad_batches x devices x num_nodes, when all are
    ints (an older run's flat data.batch_size is mapped)."""
    trainer = config.get("trainer") or {}
    data = upgrade_config(config.get("data") or {})
    factors = [(data.get("batches") or {}).get("batch_size", data.get("batch_size")),
               trainer.get("accumulate_grad_batches", 1), trainer.get("devices", 1),
               trainer.get("num_nodes", 1)]
    if not all(isinstance(f, int) and not isinstance(f, bool) for f in factors):
        return None
    return math.prod(factors)


def format_duration(seconds: float) -> str:
    """``1h 02m 03s`` / ``2m 03s``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"
