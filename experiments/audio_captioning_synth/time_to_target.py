"""Time to target of the default run in FLOPs and samples (which do not depend on the machine),
beside the wall time and the CPU it ran on: one training run per seed.

    python experiments/audio_captioning_synth/time_to_target.py                # seeds 12345 1 2
    python experiments/audio_captioning_synth/time_to_target.py --seeds 12345 \\
        --baseline-flops 15.0e12 -- trainer.max_epochs=16 model.optimizer.lr=3e-3

Each run is ``python -m mmtf.train experiment=audio_captioning seed=<s> <overrides>`` (with
``--rounding-probe``: ``python rounding_probe.py ...``, the same run with the power spectrum
rounded as re² + im²) in
``<out>/seed_<s>`` (its output in ``<out>/seed_<s>.log``); ``metrics.json`` gives the training
FLOPs and samples at the first validation that reached ``target.value`` (val event accuracy
0.95 in the experiment config; override ``target.*`` for another) and in total. Appends one
line per run to this folder's ``results.jsonl`` (``--record``; ``--no-record`` for none),
prints a table and, last, one JSON object: the runs and whether every seed reached the target
and the test accuracy floor. Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))              # mmtf from this checkout, also without installing

from mmtf.perf.results import append_result, run_perf_line  # noqa: E402


def run_seed(seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Train one seed; its result object (``error`` set when the run failed)."""
    run_dir = out / f"seed_{seed}"
    # --rounding-probe: the same run with the power spectrum rounded differently.
    entry = [str(HERE / "rounding_probe.py")] if args.rounding_probe else ["-m", "mmtf.train"]
    command = [sys.executable, *entry, f"experiment={args.experiment}",
               f"seed={seed}", f"hydra.run.dir={run_dir}", *args.overrides]
    log_path = out / f"seed_{seed}.log"
    start = time.perf_counter()
    with log_path.open("w") as log:
        status = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ.copy()).returncode
    wall = time.perf_counter() - start
    log_text = log_path.read_text(errors="replace")
    result: dict[str, Any] = {"seed": seed, "experiment": args.experiment,
                              "overrides": list(args.overrides),
                              "rounding_probe": args.rounding_probe, "run_dir": str(run_dir),
                              "wall_s": round(wall, 1), "perf": run_perf_line(log_text)}
    metrics_file = run_dir / "metrics.json"
    if status != 0 or not metrics_file.is_file():
        tail = "\n".join(log_text.splitlines()[-15:])
        print(f"seed {seed}: `{' '.join(command)}` exited with {status}; see {log_path}:\n{tail}",
              file=sys.stderr)
        return {**result, "error": f"exit status {status}"}
    metrics = json.loads(metrics_file.read_text())
    reached = metrics.get("target_reached") or {}
    result.update({
        "target": metrics.get("target"),
        "reached": bool(reached),
        "epoch_to_target": reached.get("epoch"), "step_to_target": reached.get("step"),
        "samples_to_target": reached.get("train_samples"),
        "flops_to_target": reached.get("train_flops"),
        "train_samples": metrics.get("train_samples"), "train_flops": metrics.get("train_flops"),
        "test/event_accuracy": metrics.get("test/event_accuracy"),
        "test/cider_d": metrics.get("test/cider_d"),
        "val/event_accuracy": metrics.get("val/event_accuracy"),
    })
    if args.baseline_flops and result["train_flops"]:
        result["flops_vs_baseline"] = round(result["train_flops"] / args.baseline_flops, 4)
    return result


def _num(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    return "—" if value is None else f"{value / scale:.{digits}f}"


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| seed | reached at (epoch, step) | samples to target | TFLOP to target | TFLOP "
            "total | test event acc. | test CIDEr-D | wall | CPU |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['seed']} | {r['error']} | | | | | | {r['wall_s']:.0f} s | |")
            continue
        at = (f"{r['epoch_to_target']}, {r['step_to_target']}" if r["reached"]
              else "not reached")
        cpu = (r["perf"] or "").split(";")[0]
        rows.append(f"| {r['seed']} | {at} | {r['samples_to_target'] or '—'} "
                    f"| {_num(r['flops_to_target'], 1e12)} | {_num(r['train_flops'], 1e12)} "
                    f"| {_num(r['test/event_accuracy'])} | {_num(r['test/cider_d'], digits=4)} "
                    f"| {r['wall_s']:.0f} s | `{cpu}` |")
    return "\n".join(rows)


def summary(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    done = [r for r in results if "error" not in r]
    accs = [r["test/event_accuracy"] for r in done if r["test/event_accuracy"] is not None]
    to_target = [r["flops_to_target"] for r in done if r["reached"]]
    totals = [r["train_flops"] for r in done if r["train_flops"] is not None]
    out: dict[str, Any] = {
        "experiment": args.experiment, "overrides": list(args.overrides),
        "rounding_probe": args.rounding_probe, "seeds": [r["seed"] for r in results], "failed": len(results) - len(done),
        "all_reached": bool(done) and len(to_target) == len(results),
        "max_flops_to_target": max(to_target) if to_target else None,
        "max_train_flops": max(totals) if totals else None,
        "min_test_event_accuracy": min(accs) if accs else None,
        "runs": results}
    if args.min_test_accuracy is not None:
        out["all_test_accuracy_met"] = (len(accs) == len(results)
                                        and min(accs) >= args.min_test_accuracy)
    if args.baseline_flops and totals:
        out["max_flops_vs_baseline"] = round(max(totals) / args.baseline_flops, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of mmtf.train")
    parser.add_argument("--seeds", type=int, nargs="+", default=[12345, 1, 2])
    parser.add_argument("--experiment", default="audio_captioning")
    parser.add_argument("--out", type=Path, default=None,
                        help="runs go to <out>/seed_<s> (default outputs/time_to_target/<time>)")
    parser.add_argument("--record", type=Path, default=HERE,
                        help="folder whose results.jsonl gets one line per run (default: here)")
    parser.add_argument("--no-record", dest="record", action="store_const", const=None)
    parser.add_argument("--baseline-flops", type=float, default=None,
                        help="training FLOPs of the recipe to compare with (adds *_vs_baseline)")
    parser.add_argument("--min-test-accuracy", type=float, default=0.95,
                        help="the test event accuracy every seed must reach (all_test_accuracy_met)")
    parser.add_argument("--rounding-probe", action="store_true",
                        help="train through rounding_probe.py: the power spectrum as re² + im², "
                             "a harmless rounding change a robust recipe must survive")
    args = parser.parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = (args.out or REPO / "outputs" / "time_to_target" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        result = run_seed(seed, args, out)
        if args.record is not None:
            append_result(args.record, result)
        results.append(result)
        print(table([result]).splitlines()[-1], flush=True)
    print()
    print(table(results))
    print(json.dumps(summary(results, args)))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
