"""Experiment trackers: the whole config in every logger, a CSV that survives resumes, one
W&B / MLflow run per run dir.

:func:`flat_config` / :func:`log_config` (the resolved config, override spelling, to every
logger), :class:`AppendingCSVLogger` (a resume appends to ``metrics.csv``),
:func:`continue_tracker_runs` / :func:`record_tracker_runs` (tracker run ids in
``<run_dir>/.mmtf/tracker_runs.json``). Why: docs/design/trackers-and-run-records.md"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

TRACKER_RUNS_FILE = Path(".mmtf") / "tracker_runs.json"
# TensorBoard's HParams tab compares runs by this scalar: the run's optimized_metric.
HPARAMS_METRIC_PREFIX = "hp/"


def flat_config(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config flattened to dotted keys.

    Lists of plain values (``tags``, ``snr_db``) stay one value, shown as ``"[a, b]"``; lists
    holding mappings (transforms) are indexed: ``data.transforms.train.0._target_``.
    """
    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    flat: dict[str, Any] = {}

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                visit(value, f"{prefix}.{key}" if prefix else str(key))
        elif isinstance(node, list) and any(isinstance(v, (Mapping, list)) for v in node):
            for i, value in enumerate(node):
                visit(value, f"{prefix}.{i}")
        elif isinstance(node, list):
            flat[prefix] = "[" + ", ".join(str(v) for v in node) + "]"
        else:
            flat[prefix] = node

    visit(tree, "")
    return flat


def log_config(loggers: Iterable[Logger], cfg: DictConfig) -> None:
    """Give every logger the flattened config; TensorBoard also gets its HParams metric."""
    flat = flat_config(cfg)
    hp_metric = HPARAMS_METRIC_PREFIX + str(cfg.get("optimized_metric") or "val/loss")
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            # Without a metric TensorBoard writes no HParams summary; NaN until the run ends.
            logger.log_hyperparams(flat, metrics={hp_metric: float("nan")})
        elif isinstance(logger, MLFlowLogger):
            # MLflow params are write-once: a resumed run keeps those of its first start
            # (ckpt_path, max_epochs of a resume are in run_info.json) and adds new keys.
            logged = logger.experiment.get_run(logger.run_id).data.params
            logger.log_hyperparams({k: v for k, v in flat.items() if k not in logged})
        else:
            logger.log_hyperparams(flat)


def log_final_metric(loggers: Iterable[Logger], cfg: DictConfig, value: float | None,
                     step: int) -> None:
    """The run's ``optimized_metric`` value into TensorBoard's HParams metric."""
    if value is None:
        return
    hp_metric = HPARAMS_METRIC_PREFIX + str(cfg.get("optimized_metric") or "val/loss")
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_metrics({hp_metric: value}, step=step)
            logger.save()


class AppendingCSVLogger(CSVLogger):
    """CSVLogger whose ``metrics.csv`` keeps the rows of earlier processes in the same dir.

    Lightning's writer deletes an existing ``metrics.csv`` when it is created. This logger
    reads the file first, puts it back right after, and continues with its header, so a resumed
    run (same run dir, ``version: ""``) appends. New columns rewrite the file with the union
    header, as Lightning does within one process.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.earlier_rows_restored = False

    @property
    def experiment(self) -> Any:
        if self.earlier_rows_restored:
            return super().experiment
        self.earlier_rows_restored = True
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        earlier = path.read_text(encoding="utf-8") if path.is_file() else ""
        writer = super().experiment
        if earlier.strip() and isinstance(writer, ExperimentWriter):
            path.write_text(earlier, encoding="utf-8")
            writer.metrics_keys = next(csv.reader(io.StringIO(earlier)), [])
        return writer


def _tracker_kind(target: str) -> str | None:
    name = target.rsplit(".", 1)[-1]
    return {"WandbLogger": "wandb", "MLFlowLogger": "mlflow"}.get(name)


def read_tracker_runs(run_dir: Path) -> dict[str, str]:
    """``{"wandb": id, "mlflow": run_id}`` stored in ``run_dir`` (empty when none)."""
    path = run_dir / TRACKER_RUNS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_tracker_runs(run_dir: Path, runs: Mapping[str, str]) -> None:
    path = run_dir / TRACKER_RUNS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(runs), indent=2) + "\n")


def continue_tracker_runs(logger_cfg: DictConfig | None, run_dir: Path) -> None:
    """Point the W&B / MLflow logger configs at this run dir's tracker run (in place).

    W&B: ``id`` = the stored id (a new one on the first start, stored at once) and
    ``resume="allow"``. MLflow: ``run_id`` = the stored id once :func:`record_tracker_runs`
    has stored one. Values the user set explicitly are kept.
    """
    if not logger_cfg or rank_zero_only.rank != 0:
        return                    # other ranks' tracker loggers log nothing; rank 0 owns the file
    runs = read_tracker_runs(run_dir)
    changed = False
    for entry in logger_cfg.values():
        if not isinstance(entry, DictConfig) or "_target_" not in entry:
            continue
        kind = _tracker_kind(str(entry["_target_"]))
        with open_dict(entry):
            if kind == "wandb":
                if not entry.get("id"):
                    if "wandb" not in runs:
                        runs["wandb"] = uuid.uuid4().hex[:12]
                        changed = True
                    entry.id = runs["wandb"]
                if not entry.get("resume"):
                    entry.resume = "allow"
            elif kind == "mlflow" and not entry.get("run_id") and runs.get("mlflow"):
                entry.run_id = runs["mlflow"]
    if changed:
        write_tracker_runs(run_dir, runs)


def record_tracker_runs(loggers: Iterable[Logger], run_dir: Path) -> None:
    """Store the MLflow run id of this run (rank 0, after the loggers exist)."""
    runs = read_tracker_runs(run_dir)
    for logger in loggers:
        if isinstance(logger, MLFlowLogger) and runs.get("mlflow") != logger.run_id:
            runs["mlflow"] = logger.run_id
            write_tracker_runs(run_dir, runs)
