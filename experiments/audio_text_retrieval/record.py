"""Append a finished retrieval run (and optionally its zero-shot scoring) to results.jsonl.

    python experiments/audio_text_retrieval/record.py outputs/audio_text_retrieval/runs/<time> \
        [--zero-shot outputs/zero_shot/runs/<time>] [--wall-s 412] [--note "..."]

Records the run's command (its Hydra overrides), test metrics of both directions with their
chance levels, the training cost (``train_flops``, ``train_samples``, ``target_reached``), the
per-epoch validation text -> media mAP@10 and R@10 (its csv log), and the zero-shot accuracy.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import yaml

from mmtf.perf.results import append_result


def val_curve(run: Path, media: str) -> list[dict[str, float]]:
    """Each validated epoch's text -> media mAP@10 and R@10, from the run's csv log."""
    rows: list[dict[str, float]] = []
    for path in sorted(run.glob("csv/**/metrics.csv")) + sorted(run.glob("csv/metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                value = row.get(f"val/text_to_{media}/mAP@10")
                if value:
                    rows.append({"epoch": int(row["epoch"]), "mAP@10": round(float(value), 4),
                                 "R@10": round(float(row[f"val/text_to_{media}/R@10"]), 4)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the mmtf.train run dir")
    parser.add_argument("--zero-shot", type=Path, default=None, help="a mmtf.zero_shot run dir")
    parser.add_argument("--wall-s", type=float, default=None, help="the run's wall time")
    parser.add_argument("--note", default=None)
    args = parser.parse_args()
    metrics = json.loads((args.run / "metrics.json").read_text())
    media = "image" if any("text_to_image" in k for k in metrics) else "audio"
    overrides = yaml.safe_load((args.run / ".hydra" / "overrides.yaml").read_text()) \
        if (args.run / ".hydra" / "overrides.yaml").is_file() else None
    result: dict[str, Any] = {
        "run_dir": str(args.run), "run_command": "python -m mmtf.train " + " ".join(overrides or []),
        **{k: round(v, 4) for k, v in metrics.items()
           if k.startswith("test/") and isinstance(v, float)},
        "train_flops": metrics.get("train_flops"), "train_samples": metrics.get("train_samples"),
        "target_reached": metrics.get("target_reached"), "val_curve": val_curve(args.run, media)}
    if args.zero_shot is not None:
        zs = json.loads((args.zero_shot / "metrics.json").read_text())
        result["zero_shot"] = {k: v for k, v in zs.items() if not k.endswith("per_class")}
    if args.wall_s is not None:
        result["wall_s"] = args.wall_s
    if args.note:
        result["note"] = args.note
    print(json.dumps(append_result(Path(__file__).parent, result)))


if __name__ == "__main__":
    main()
