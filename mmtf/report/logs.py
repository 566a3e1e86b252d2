"""Reading a training run's files: config, overrides, scalar logs, final metrics, times.

A run dir holds ``.hydra/``, ``config.yaml``, ``metrics.json``, the job log and the scalar logs
(``**/metrics.csv``, ``**/events.out.tfevents.*``); a multirun dir holds ``multirun.yaml`` and one
run dir per job. Scalars are ``{key: {step: value}}`` per *segment* (one process writing one
file), merged in write order by :func:`merge_segments`."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from mmtf.errors import UserError

Segment = dict[str, dict[int, float]]          # key -> step -> value
Series = list[tuple[int, float]]                # (step, value), sorted by step

RUN_HINT = ("pass run_dir=outputs/<task>/runs/<time> (a dir written by python -m mmtf.train) or "
            "a multirun dir outputs/<task>/multiruns/<time>")
REPORT_DIR = "report"             # <run_dir>/report: where mmtf.report writes by default
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


@dataclass
class Timing:
    """How long a run took and how fast it trained.

    Attributes:
        wall_s, source: seconds from the first to the last entry of ``source`` (None if
            unknown), and where they come from, in words.
        steps_per_s, throughput_source: optimizer steps per second of training, and whence.
    """

    wall_s: float | None = None
    source: str = "unknown"
    steps_per_s: float | None = None
    throughput_source: str = "unknown"


@dataclass
class RunLogs:
    """Everything :func:`load_run` reads from one run dir.

    Attributes:
        config: the run's resolved config (``config.yaml``, else ``.hydra/config.yaml``).
        overrides, config_name: the command-line overrides and the root config (``train``).
        scalars: ``{key: [(step, value), ...]}`` over all segments, sorted by step.
        final_metrics: the numbers of ``metrics.json`` (``{}`` when the run has not finished).
        sources: the log files read, in merge order.
        resumed_at: the first training step of each start after the first (a resumed run).
        timing: :class:`Timing`.
    """

    run_dir: Path
    config: dict[str, Any]
    overrides: list[str]
    config_name: str
    scalars: dict[str, Series]
    final_metrics: dict[str, float]
    sources: list[Path] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)

    @property
    def optimized_metric(self) -> str | None:
        return self.config.get("optimized_metric")

    @property
    def optimized_mode(self) -> str:
        return self.config.get("optimized_mode") or "min"


def is_run_dir(path: Path) -> bool:
    """A dir with a Hydra job config: written by ``python -m mmtf.train``."""
    return (path / ".hydra" / "config.yaml").is_file()


def is_multirun_dir(path: Path) -> bool:
    """A Hydra sweep dir: ``multirun.yaml`` (written by every launcher) beside the job dirs."""
    return (path / "multirun.yaml").is_file()


def job_dirs(path: Path) -> list[Path]:
    """The job dirs of a multirun dir (``0``, ``1``, ... in numeric order); [] if none."""
    jobs = [p for p in path.iterdir() if p.is_dir() and is_run_dir(p)] if path.is_dir() else []
    return sorted(jobs, key=_natural_key)


def check_dir(path: str | Path) -> Path:
    """``path`` as a ``Path`` if it is a run dir or a multirun dir, else a :class:`UserError`."""
    path = Path(path).expanduser()
    if not path.is_dir():
        state = "is a file" if path.exists() else "does not exist"
        raise UserError(f"run_dir {path} {state}; {RUN_HINT}.")
    if not is_run_dir(path) and not is_multirun_dir(path):
        raise UserError(f"run_dir {path} is neither a run dir (no .hydra/config.yaml) nor a "
                        f"multirun dir (no multirun.yaml); {RUN_HINT}.")
    return path


def load_run(run_dir: str | Path, *, require_logs: bool = True) -> RunLogs:
    """Read one run dir written by ``python -m mmtf.train``.

    Raises:
        UserError: ``run_dir`` is not a run dir, or holds no logs while ``require_logs``.
    """
    run_dir = check_dir(run_dir)
    if not is_run_dir(run_dir):
        raise UserError(f"run_dir {run_dir} is a multirun dir (it holds job dirs); read one job "
                        f"with load_run('{run_dir}/<job>') or the sweep with "
                        f"summarize_sweep('{run_dir}').")
    hydra_dir = run_dir / ".hydra"
    config_file = run_dir / "config.yaml"
    config = _read_yaml(config_file if config_file.is_file() else hydra_dir / "config.yaml") or {}
    overrides = _read_yaml(hydra_dir / "overrides.yaml") or []
    hydra_cfg = (_read_yaml(hydra_dir / "hydra.yaml") or {}).get("hydra", {})
    config_name = (hydra_cfg.get("job") or {}).get("config_name") or "train"

    tb_files = sorted(run_dir.rglob("events.out.tfevents.*"), key=_tb_created)
    csv_files = sorted(run_dir.rglob("metrics.csv"), key=_natural_key)
    tb_segments = [read_tensorboard(f) for f in tb_files]
    csv_segments = [seg for f in csv_files for seg in read_csv(f)]
    if require_logs and not any(tb_segments) and not csv_segments:
        raise UserError(f"run_dir {run_dir} holds no training logs (no **/metrics.csv and no "
                        f"TensorBoard events); train with logger=default (CSV + TensorBoard) or "
                        f"logger=csv to get learning curves.")
    # TensorBoard first: Lightning's CSVLogger deletes metrics.csv when a run resumes into the
    # same version dir, while the event files of every start stay; the CSV wins where both hold
    # a step. Why: see docs/design/run-reports.md
    segments = [{k: {s: v for s, v, _ in pts} for k, pts in seg.items()} for seg in tb_segments]
    scalars = merge_segments([*segments, *csv_segments])
    metrics_file = run_dir / "metrics.json"
    final = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    task_name = config.get("task_name") or "train"
    # Each start of the run writes new event files and a new CSV segment (when its CSV survives).
    starts = max(_first_train_steps(segments), _first_train_steps(csv_segments), key=len)
    return RunLogs(run_dir=run_dir, config=config, overrides=list(overrides),
                   config_name=config_name, scalars=scalars,
                   final_metrics={k: float(v) for k, v in final.items()
                                  if isinstance(v, (int, float))},
                   sources=[*tb_files, *csv_files], resumed_at=starts[1:],
                   timing=measure_time(run_dir / f"{task_name}.log", tb_segments, scalars))


def read_csv(path: Path) -> list[Segment]:
    """One CSVLogger file as segments: a new segment starts where the step goes back.

    The step column of one start only grows; where it falls, a later start (a resume from an
    earlier checkpoint) appended to the file."""
    segments: list[Segment] = [{}]
    last_step = -1
    with path.open(newline="") as file:
        for row in csv.DictReader(file):
            if not row.get("step"):
                continue
            step = int(float(row["step"]))
            if step < last_step:
                segments.append({})
            last_step = step
            for key, text in row.items():
                if key != "step" and text not in ("", None):
                    segments[-1].setdefault(key, {})[step] = float(text)
    return [s for s in segments if s]


def read_tensorboard(path: Path) -> dict[str, list[tuple[int, float, float]]]:
    """The scalars of one TensorBoard event file: ``{tag: [(step, value, wall_time), ...]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def merge_segments(segments: Iterable[Segment]) -> dict[str, Series]:
    """Concatenate segments written one after another into one series per key.

    A later segment replaces, per key, the earlier points from its own first step of that key
    on: after a resume from a checkpoint at step s, the points an interrupted run logged past s
    belong to training that was thrown away. Points of other keys (an earlier validation) stay."""
    merged: dict[str, dict[int, float]] = {}
    for segment in segments:
        for key, points in segment.items():
            if not points:
                continue
            first = min(points)
            kept = {s: v for s, v in merged.get(key, {}).items() if s < first}
            merged[key] = {**kept, **points}
    return {key: sorted(points.items()) for key, points in sorted(merged.items())}


def measure_time(log_file: Path, tb_segments: list[dict[str, list[tuple[int, float, float]]]],
                 scalars: dict[str, Series]) -> Timing:
    """Wall time from the job log's timestamps; steps/s from TensorBoard's event times.

    Falls back to file modification times for the wall time, and to the logged step range over
    the wall time for the throughput; ``Timing.source``/``throughput_source`` say which."""
    timing = Timing()
    stamps = _log_times(log_file) if log_file.is_file() else []
    if len(stamps) >= 2:
        timing.wall_s = stamps[-1] - stamps[0]
        timing.source = f"first to last line of {log_file.name}"
    else:
        run_dir = log_file.parent
        times = [p.stat().st_mtime for p in run_dir.rglob("*")
                 if p.is_file() and p.relative_to(run_dir).parts[0] != REPORT_DIR]
        if len(times) >= 2:
            timing.wall_s = max(times) - min(times)
            timing.source = "oldest to newest file modification time in the run dir"
    steps = seconds = 0.0
    for segment in tb_segments:           # each start separately: the pause between is not training
        points = segment.get("train/loss", [])
        if len(points) >= 2:
            steps += points[-1][0] - points[0][0]
            seconds += points[-1][2] - points[0][2]
    if seconds > 0:
        timing.steps_per_s = steps / seconds
        timing.throughput_source = ("TensorBoard event times of train/loss: training with "
                                    "validation, without start-up and testing")
    elif timing.wall_s and scalars.get("train/loss"):
        series = scalars["train/loss"]
        timing.steps_per_s = (series[-1][0] - series[0][0] + 1) / timing.wall_s
        timing.throughput_source = ("the logs hold no times per step: the logged step range "
                                    "over the whole wall time, start-up and testing included")
    return timing


def _first_train_steps(segments: list[Segment]) -> list[int]:
    return [min(seg["train/loss"]) for seg in segments if seg.get("train/loss")]


def _log_times(path: Path) -> list[float]:
    stamps = []
    with path.open(errors="replace") as file:
        for line in file:
            match = _LOG_TIME.match(line)
            if match:
                when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
                stamps.append(when.timestamp() + int(match.group(2)) / 1000)
    return stamps


def _read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _natural_key(path: Path) -> list[Any]:
    """``version_10`` after ``version_2``; ``2`` after ``1``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _tb_created(path: Path) -> tuple[float, list[Any]]:
    """Event files are named ``events.out.tfevents.<unix time>.<host>.<pid>.<n>``."""
    parts = path.name.split(".")
    created = float(parts[3]) if len(parts) > 3 and parts[3].isdigit() else math.inf
    return created, _natural_key(path)
