"""Audio question answering in two stages, as SLAM-AAC and SALMONN build theirs: an encoder that
already hears the events, frozen, behind the projector of the prefix LLM.

    python experiments/audio_qa_llm/two_stage.py                 # seed 12345, all three stages
    python experiments/audio_qa_llm/two_stage.py --captioner-run outputs/.../captioner
    python experiments/audio_qa_llm/two_stage.py -- trainer.max_epochs=21

1. ``python -m mmtf.train experiment=audio_captioning seed=<s>`` (the default captioner,
   ``<out>/captioner``; skipped with ``--captioner-run``, which names an existing run);
2. ``python -m mmtf.export ckpt_path=<its best checkpoint> part=encoder out=<out>/encoder``;
3. ``python -m mmtf.train experiment=audio_qa_llm seed=<s> model.encoder.pretrained=<out>/encoder
   model.encoder.freeze=true <overrides>`` (``<out>/qa``).

Each stage's output goes to ``<out>/<stage>.log``. Appends one line to this folder's
``results.jsonl`` (``--no-record``: none), prints the stages, the test scores per question
type and the test confusion, and, last, one JSON object. Exit status 1 when a stage failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))              # mmtf from this checkout, also without installing

from mmtf.perf.results import append_result, run_perf_line  # noqa: E402

QUESTION_TYPES = ("count", "presence", "order", "absence")
# mmtf.metrics.aqa.confusion_table's rows: a type's header, a right letter's counts, the shares.
CONFUSION_ROW = re.compile(r"^(\w+: right \\ chosen|\s+[A-Z] |\s+share )")


class StageFailed(RuntimeError):
    pass


def run_stage(name: str, command: list[str], out: Path) -> float:
    """Run one stage with its output in ``<out>/<name>.log``; its wall time in seconds."""
    log_path = out / f"{name}.log"
    print(f"[{name}] {' '.join(command)}", flush=True)
    start = time.perf_counter()
    with log_path.open("w") as log:
        status = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ.copy()).returncode
    wall = time.perf_counter() - start
    if status != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise StageFailed(f"stage {name}: exit status {status} after {wall:.0f} s; see "
                          f"{log_path}:\n{tail}")
    return wall


def best_checkpoint(run_dir: Path) -> Path:
    """The monitored top-1 checkpoint (``checkpoints/epoch_NNN.ckpt``) of a training run."""
    found = sorted((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    if len(found) != 1:
        raise StageFailed(f"{run_dir}/checkpoints holds {len(found)} epoch_*.ckpt files, not "
                          f"the one best checkpoint of model_checkpoint (save_top_k=1); name "
                          f"the captioner run with --captioner-run <run dir>.")
    return found[0]


def confusion_in_log(log_text: str) -> str | None:
    """The test split's confusion table as the run printed it (``test confusion ...``)."""
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if "test confusion" in line:
            table = []
            for row in lines[i + 1:]:
                if not CONFUSION_ROW.match(row):
                    break
                table.append(row)
            return "\n".join(table)
    return None


def _num(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of stage 3 (audio_qa_llm)")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--captioner-run", type=Path, default=None,
                        help="an existing experiment=audio_captioning run dir (skips stage 1)")
    parser.add_argument("--captioner-overrides", nargs="*", default=[],
                        help="Hydra overrides of stage 1 (audio_captioning)")
    parser.add_argument("--out", type=Path, default=None,
                        help="stages go to <out>/<stage> (default outputs/audio_qa_two_stage/<time>)")
    parser.add_argument("--record", type=Path, default=HERE,
                        help="folder whose results.jsonl gets the run's line (default: here)")
    parser.add_argument("--no-record", dest="record", action="store_const", const=None)
    args = parser.parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = (args.out or REPO / "outputs" / "audio_qa_two_stage" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = [sys.executable, "-m"]
    walls: dict[str, float] = {}
    try:
        captioner = args.captioner_run.resolve() if args.captioner_run else out / "captioner"
        if args.captioner_run is None:
            walls["captioner"] = run_stage("captioner", [
                *python, "mmtf.train", "experiment=audio_captioning", f"seed={args.seed}",
                f"hydra.run.dir={captioner}", *args.captioner_overrides], out)
        checkpoint = best_checkpoint(captioner)
        encoder = out / "encoder"
        walls["export"] = run_stage("export", [
            *python, "mmtf.export", f"ckpt_path={checkpoint}", "part=encoder",
            f"out={encoder}"], out)
        qa = out / "qa"
        walls["qa"] = run_stage("qa", [
            *python, "mmtf.train", "experiment=audio_qa_llm", f"seed={args.seed}",
            f"model.encoder.pretrained={encoder}", "model.encoder.freeze=true",
            f"hydra.run.dir={qa}", *args.overrides], out)
    except StageFailed as failure:
        print(failure, file=sys.stderr)
        print(json.dumps({"error": str(failure).splitlines()[0], "walls_s": walls}))
        return 1

    captioner_metrics = json.loads((captioner / "metrics.json").read_text())
    qa_metrics = json.loads((qa / "metrics.json").read_text())
    qa_log = (out / "qa.log").read_text(errors="replace")
    result: dict[str, Any] = {
        "seed": args.seed, "overrides": list(args.overrides),
        "captioner_overrides": list(args.captioner_overrides), "out": str(out),
        "captioner_checkpoint": str(checkpoint), "wall_s": {k: round(v, 1) for k, v in walls.items()},
        "perf": run_perf_line(qa_log),
        "captioner/test/event_accuracy": captioner_metrics.get("test/event_accuracy"),
        "captioner/test/cider_d": captioner_metrics.get("test/cider_d"),
        "captioner/train_flops": captioner_metrics.get("train_flops"),
        "train_flops": qa_metrics.get("train_flops"),
        "train_samples": qa_metrics.get("train_samples"),
        **{k: v for k, v in qa_metrics.items() if k.startswith(("test/", "val/"))},
        "test_confusion": confusion_in_log(qa_log)}
    if args.record is not None:
        append_result(args.record, result)

    print()
    print("| stage | wall | result |\n|---|---:|---|")
    if "captioner" in walls:
        print(f"| captioner | {walls['captioner']:.0f} s | test event acc. "
              f"{_num(result['captioner/test/event_accuracy'])}, CIDEr-D "
              f"{_num(result['captioner/test/cider_d'], 4)} |")
    print(f"| export | {walls['export']:.0f} s | {encoder} |")
    print(f"| qa | {walls['qa']:.0f} s | test mean acc. {_num(qa_metrics.get('test/mean_accuracy'))}"
          f" (chance 0.25) |")
    print()
    print("| question type | mean acc. | as written | strict |\n|---|---:|---:|---:|")
    for kind in ("", *QUESTION_TYPES):
        prefix = f"test/{kind}/" if kind else "test/"
        print(f"| {kind or 'all'} | {_num(qa_metrics.get(prefix + 'mean_accuracy'))} "
              f"| {_num(qa_metrics.get(prefix + 'accuracy'))} "
              f"| {_num(qa_metrics.get(prefix + 'strict_accuracy'))} |")
    print()
    print(result["test_confusion"] or "(no test confusion in the log)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
