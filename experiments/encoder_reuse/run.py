"""Encoder reuse: a linear probe on the exported captioning encoder vs the same encoder trained
from scratch, same data, same budget.

    python experiments/encoder_reuse/run.py --run outputs/audio_captioning/runs/<time> \
        [--epochs 5] [--out experiments/encoder_reuse/results]

1. ``python -m mmtf.export`` writes the run's encoder (best checkpoint, else last.ckpt).
2. ``python -m mmtf.train experiment=audio_classification`` three times, each ``--epochs``
   epochs on the built-in sound-event classification set (ESC-50 layout, 9 classes):
   a linear probe on the frozen pretrained encoder, the pretrained encoder fine-tuned, and the
   same architecture from scratch.
Prints a table and, last, one JSON object with the test accuracies and macro-F1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from mmtf.perf.results import append_result


def best_checkpoint(run: Path) -> Path:
    ckpts = sorted((run / "checkpoints").glob("epoch_*.ckpt"))
    return ckpts[-1] if ckpts else run / "checkpoints" / "last.ckpt"


def cli(module: str, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", module, *args], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="an audio_captioning run dir")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("experiments/encoder_reuse/results"))
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    enc = args.out / "encoder"
    cli("mmtf.export", f"ckpt_path={best_checkpoint(args.run)}", "part=encoder", f"out={enc}",
        f"hydra.run.dir={args.out / 'export'}")
    common = ["experiment=audio_classification", f"trainer.max_epochs={args.epochs}",
              "callbacks.rich_progress_bar=null", *args.extra]
    variants = {   # key: (table label, overrides)
        "linear_probe": ("linear probe (frozen pretrained)",
                         [f"model.encoder.pretrained={enc.resolve()}", "model.encoder.freeze=true"]),
        "fine_tuned": ("fine-tuned pretrained", [f"model.encoder.pretrained={enc.resolve()}"]),
        "scratch": ("from scratch", []),
    }
    rows = {}
    for key, (name, extra) in variants.items():
        run_dir = args.out / key
        seconds = cli("mmtf.train", *common, *extra, f"hydra.run.dir={run_dir}")
        metrics = json.loads((run_dir / "metrics.json").read_text())
        rows[key] = {"label": name,"test_accuracy": metrics.get("test/accuracy"),
                      "test_macro_f1": metrics.get("test/macro_f1"),
                      "val_accuracy": metrics.get("val/accuracy"), "seconds": round(seconds)}
    print(f"\n| encoder ({args.epochs} epochs each) | test acc | test macro-F1 | val acc | wall s |")
    print("|---|---|---|---|---|")
    for r in rows.values():
        print(f"| {r['label']} | {r['test_accuracy']:.3f} | {r['test_macro_f1']:.3f} | "
              f"{r['val_accuracy']:.3f} | {r['seconds']} |")
    print(json.dumps(append_result(__file__, {"epochs": args.epochs, **rows})))


if __name__ == "__main__":
    main()
