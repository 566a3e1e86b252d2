"""Plot the learning curve of a training run from its CSV log.

    python experiments/plot_learning_curve.py outputs/audio_captioning/runs/<time> \
        --out experiments/audio_captioning_synth/learning_curve.png

Reads ``<run>/csv/metrics.csv`` (Lightning's CSVLogger) and draws the training/validation loss
and the validation caption metrics against the optimizer step. Prints the per-epoch validation
table and, last, one JSON object with the final validation and test metrics; ``--record
experiments/audio_captioning_synth`` also appends that object, with the run's own command and
commit from its ``run_info.json``, to the experiment's ``results.jsonl``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mmtf.perf.results import append_result  # noqa: E402

PANELS = (("loss", ("train/loss", "val/loss")),
          ("event-sequence accuracy", ("val/event_accuracy",)),
          ("CIDEr-D / BLEU-4", ("val/cider_d", "val/bleu_4")))


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Series name -> [(step, value)] from the run's CSV log."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        raise SystemExit(f"{path} not found; pass the run dir of a training run (logger=default "
                         f"or logger=csv).")
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key in ("step", "epoch") or value in ("", None):
                    continue
                v = float(value)
                if math.isfinite(v):
                    series[key].append((step, v))
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--record", type=Path, default=None,
                        help="experiment folder whose results.jsonl gets this run's metrics")
    args = parser.parse_args()
    series = read_metrics(args.run_dir)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    for ax, (title, keys) in zip(axes, PANELS):
        for key in keys:
            name = key if key in series else f"{key}_epoch"
            if name in series:
                steps, values = zip(*series[name])
                ax.plot(steps, values, marker="o" if key.startswith("val") else None,
                        markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = args.out or args.run_dir / "learning_curve.png"
    fig.savefig(out, dpi=120)
    val_keys = [k for k in ("val/loss", "val/event_accuracy", "val/cider_d", "val/bleu_4")
                if k in series]
    print("| step | " + " | ".join(val_keys) + " |")
    print("|---" * (len(val_keys) + 1) + "|")
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for key in val_keys:
        for step, value in series[key]:
            by_step[step][key] = value
    for step in sorted(by_step):
        cells = [f"{by_step[step].get(k, float('nan')):.4f}" for k in val_keys]
        print(f"| {step} | " + " | ".join(cells) + " |")
    final = {k: v[-1][1] for k, v in series.items() if k.startswith(("val/", "test/"))}
    print(f"saved {out}")
    print(json.dumps(final))
    if args.record is not None:
        info = args.run_dir / "run_info.json"
        start = json.loads(info.read_text())["starts"][-1] if info.is_file() else {}
        append_result(args.record, {"run_dir": str(args.run_dir), "run_command": start.get("command"),
                                    "run_commit": start.get("git", {}).get("mmtf", {}).get("commit"),
                                    **final})


if __name__ == "__main__":
    main()
