"""Event-sequence accuracy of the synthetic sets, against hand-checked captions."""

from __future__ import annotations

import pytest

from mmtf.metrics import event_sequence_accuracy
from mmtf.synthetic.audio import parse_caption as audio_parser
from mmtf.synthetic.image import parse_caption as image_parser


def test_event_sequence_accuracy_counts_exact_matches():
    refs = [["A high beep followed by a burst of white noise.",
             "A burst of white noise after a high tone."],
            ["Slow clicks."],
            ["A rising chirp, then a low tone."],
            ["A falling chirp."]]
    preds = ["a high-pitched beep, then a burst of white noise",   # same sequence: right
             "some slow ticking",                                   # right
             "a low tone, then a rising chirp",                     # order swapped: wrong
             "a falling chirp then"]                                # unparsable: wrong
    assert event_sequence_accuracy(preds, refs, audio_parser) == 0.5
    assert event_sequence_accuracy([], [], audio_parser) == 0.0


def test_event_sequence_accuracy_on_images():
    refs = [["A small red circle to the left of a big blue box."]]
    assert event_sequence_accuracy(["a big blue square to the right of a small red disc"], refs,
                                   image_parser) == 1.0
    assert event_sequence_accuracy(["a big blue square to the left of a small red disc"], refs,
                                   image_parser) == 0.0


def test_event_sequence_accuracy_errors():
    with pytest.raises(ValueError, match="2 predictions but 1 reference lists"):
        event_sequence_accuracy(["a", "b"], [["x"]], audio_parser)
    with pytest.raises(ValueError, match="no reference of item 0 parses"):
        event_sequence_accuracy(["a high beep"], [["a dog barks"]], audio_parser)
