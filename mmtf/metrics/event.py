"""Event-sequence accuracy: exact match of the event sequence a caption describes.

The built-in synthetic sets describe a known sequence of events (sounds, shapes); each set's
parser (``mmtf.synthetic.audio.parse_caption``, ``mmtf.synthetic.image.parse_caption``, found by
the set's name with ``mmtf.synthetic.caption_parser``) turns a caption back into that sequence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any


def event_sequence_accuracy(predictions: Sequence[str], references: Sequence[Sequence[str]],
                            parser: Callable[[str], Any]) -> float:
    """Share of predictions whose parsed sequence equals the references' parsed sequence.

    Args:
        references: all reference captions per item (they all parse to the same sequence).
        parser: caption -> sequence (None when the caption does not parse).

    Returns:
        Accuracy in [0, 1]; an unparsable prediction counts as wrong; 0.0 for no items.

    Raises:
        ValueError: the lists differ in length, or no reference of an item parses (wrong parser
            for this dataset).
    """
    if len(predictions) != len(references):
        raise ValueError(f"event_sequence_accuracy: {len(predictions)} predictions but "
                         f"{len(references)} reference lists; pass one of each per item.")
    if not predictions:
        return 0.0
    correct = 0
    for i, (pred, refs) in enumerate(zip(predictions, references)):
        parsed = Counter(p for p in map(parser, refs) if p is not None)
        if not parsed:
            raise ValueError(f"event_sequence_accuracy: no reference of item {i} parses "
                             f"({list(refs)[:2]}...); is {getattr(parser, '__module__', parser)}"
                             f" the parser of this dataset?")
        target = parsed.most_common(1)[0][0]
        correct += parser(pred) == target
    return correct / len(predictions)
