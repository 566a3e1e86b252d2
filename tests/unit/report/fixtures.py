"""Hand-written run dirs: the files `python -m mmtf.train` leaves, with values known by heart."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml

CSV_KEYS = ["epoch", "lr-AdamW/pg1", "lr-AdamW/pg2", "step", "train/loss", "val/bleu_1",
            "val/bleu_2", "val/event_accuracy", "val/loss", "test/event_accuracy", "test/meteor"]

# Three epochs of 10 steps: train/loss every 5 steps, validation at the end of each epoch,
# the test after fit (Lightning logs it with the epoch count after training).
VAL_ACCURACY = [0.20, 0.70, 0.50]          # best (max): 0.70 at epoch 1, step 19
VAL_LOSS = [3.0, 2.5, 2.7]                 # best (min): 2.5 at epoch 1, step 19
TRAIN_LOSS = {4: 4.0, 9: 3.5, 14: 3.1, 19: 2.8, 24: 2.6, 29: 2.5}


def csv_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for step, loss in TRAIN_LOSS.items():
        lr = 1e-3 * (step + 1) / 30
        rows.append({"step": step, "lr-AdamW/pg1": lr, "lr-AdamW/pg2": lr})
        rows.append({"step": step, "epoch": step // 10, "train/loss": loss})
        if step % 10 == 9:
            epoch = step // 10
            rows.append({"step": step, "epoch": epoch, "val/loss": VAL_LOSS[epoch],
                         "val/event_accuracy": VAL_ACCURACY[epoch],
                         "val/bleu_1": 0.1 * (epoch + 1), "val/bleu_2": 0.05 * (epoch + 1)})
    rows.append({"step": 30, "epoch": 3, "test/event_accuracy": 0.65, "test/meteor": 0.3})
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=CSV_KEYS)
        writer.writeheader()
        writer.writerows(rows)


def make_run(run_dir: Path, *, config: dict[str, Any] | None = None,
             overrides: list[str] | None = None, rows: list[dict[str, Any]] | None = None,
             metrics: dict[str, float] | None = None, log_lines: list[str] | None = None) -> Path:
    """A run dir: .hydra/*, config.yaml, csv/metrics.csv (``rows``; None: no CSV), metrics.json.

    Under a dir named ``sweep`` it is a job of a multirun (``sweep/multirun.yaml`` is written).
    """
    config = config if config is not None else {
        "task_name": "audio_captioning", "optimized_metric": "val/event_accuracy",
        "optimized_mode": "max", "data": {"batch_size": 16},
        "trainer": {"accumulate_grad_batches": 1, "devices": 1, "num_nodes": 1}}
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    (hydra_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (hydra_dir / "overrides.yaml").write_text(
        yaml.safe_dump(overrides if overrides is not None else ["experiment=audio_captioning"]))
    hydra_cfg = {"hydra": {"job": {"config_name": "train"}}}
    (hydra_dir / "hydra.yaml").write_text(yaml.safe_dump(hydra_cfg))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if rows is not None:
        write_csv(run_dir / "csv" / "metrics.csv", rows)
    if metrics is not None:
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if log_lines is not None:
        log_file = run_dir / f"{config.get('task_name', 'train')}.log"
        log_file.write_text("\n".join(log_lines) + "\n")
    if run_dir.parent.name == "sweep":       # a job of a multirun: Hydra writes multirun.yaml
        (run_dir.parent / "multirun.yaml").write_text("hydra: {mode: MULTIRUN}\n")
    return run_dir
