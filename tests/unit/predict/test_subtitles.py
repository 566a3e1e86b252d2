"""SRT and WebVTT documents of timed segments against hand-written files."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmtf.predict.subtitles import subtitles, timestamp

EXPECTED = Path(__file__).parent / "expected"
# Rounding to the millisecond (65.0405 -> .041 would be .040 by truncation), a blank text, and
# hours.
SEGMENTS = [{"start": 0.0, "end": 2.5, "text": " Hello there."},
            {"start": 2.5, "end": 65.0406, "text": "A second line "},
            {"start": 3723.004, "end": 3724.0, "text": ""}]


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_equal_hand_written_files(fmt):
    assert subtitles(SEGMENTS, fmt) == (EXPECTED / f"segments.{fmt}").read_text()


def test_timestamps_round_to_the_millisecond_and_carry_hours():
    assert timestamp(0.0) == "00:00:00,000"
    assert timestamp(59.9996) == "00:01:00,000"
    assert timestamp(3600 * 12 + 61.25, marker=".") == "12:01:01.250"
    assert timestamp(-0.01) == "00:00:00,000"
