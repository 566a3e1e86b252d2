"""Corpus WER of an ``mmtf.evaluate`` predictions file against its first reference.

    python experiments/short_utterances_specaugment/wer.py <run>/eval/.../predictions.jsonl

Prints one JSON line: wer, substitutions, deletions, insertions, words, utterances,
sentence error rate.
"""

from __future__ import annotations

import json
import sys

import jiwer

from mmtf.perf.results import append_result


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    refs = [r["references"][0].lower().strip() for r in rows]
    hyps = [r["prediction"].lower().strip() or "<empty>" for r in rows]
    out = jiwer.process_words(refs, hyps)
    words = sum(len(r.split()) for r in refs)
    print(json.dumps(append_result(__file__, {"wer": round(out.wer, 4), "substitutions": out.substitutions,
                      "deletions": out.deletions, "insertions": out.insertions, "words": words,
                      "utterances": len(rows),
                      "sentence_error_rate": round(sum(r != h for r, h in zip(refs, hyps))
                                                   / len(rows), 4)})))


if __name__ == "__main__":
    main(sys.argv[1])
