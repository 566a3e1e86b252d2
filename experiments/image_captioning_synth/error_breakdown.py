"""What a captioner's wrong captions get wrong, from an `mmtf.evaluate` run's predictions.

Parses each prediction and its first reference back to ``(layout, objects in reading order)``
(:func:`mmtf.synthetic.image.parse_caption`) and counts, by object count, right and wrong
images; each wrong multi-object caption is put in one class, checked in this order: unparsable,
row/column wrong, the right objects in the wrong order, an object named twice, a wrong object.

    python -m mmtf.evaluate ckpt_path=.../checkpoints/epoch_009.ckpt split=val
    python experiments/image_captioning_synth/error_breakdown.py outputs/eval/runs/<time>/predictions.jsonl

Prints a table and a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from mmtf.perf.device import quantity_table
from mmtf.perf.results import append_result
from mmtf.synthetic.image import parse_caption


def classify(prediction: str, reference: str) -> tuple[int, str]:
    """(objects in the image, "right" or the error class) of one caption."""
    truth, got = parse_caption(reference), parse_caption(prediction)
    count = len(truth[1])
    if got == truth:
        return count, "right"
    if got is None:
        return count, "unparsable"
    if got[0] != truth[0]:
        return count, "row/column"
    if sorted(got[1]) == sorted(truth[1]):
        return count, "wrong order"
    if len(set(got[1])) < len(got[1]):
        return count, "object named twice"
    return count, "wrong object"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("predictions", help="predictions.jsonl of an mmtf.evaluate run")
    args = parser.parse_args()
    by_count: Counter = Counter()
    errors: Counter = Counter()
    with open(args.predictions) as f:
        for line in f:
            row = json.loads(line)
            count, verdict = classify(row["prediction"], row["references"][0])
            by_count[(count, verdict == "right")] += 1
            if verdict != "right":
                errors[verdict] += 1
    rows = [(f"{n} object(s): right / wrong", f"{by_count[(n, True)]} / {by_count[(n, False)]}")
            for n in sorted({n for n, _ in by_count})]
    rows += [(f"wrong: {kind}", str(k)) for kind, k in errors.most_common()]
    print(quantity_table(rows))
    total = sum(by_count.values())
    print(json.dumps(append_result(__file__, {"accuracy": round(sum(v for (_, ok), v in by_count.items() if ok) / total, 4),
                      "right_wrong_by_objects": {str(n): [by_count[(n, True)], by_count[(n, False)]]
                                                 for n in sorted({n for n, _ in by_count})},
                      "errors": dict(errors)})))


if __name__ == "__main__":
    main()
