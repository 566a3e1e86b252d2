"""Event overlap on the built-in synthetic set: scenes recovered from file names agree with
the references written beside them; phrases, pairing and the chance rate by hand."""

from __future__ import annotations

import csv

import pytest

from mmtf.decoders.align import WordSpan
from mmtf.errors import UserError
from mmtf.inspect.synthetic import (
    OverlapReport,
    chance_overlap,
    clip_scene,
    named_events,
    set_params,
)
from mmtf.synthetic import ensure_synthetic
from mmtf.synthetic.audio import Event, Scene, parse_caption


def test_scenes_recovered_from_file_names_match_the_written_captions(tmp_path):
    root = ensure_synthetic(tmp_path / "set", "audio_captions", num_train=2, num_val=4,
                            num_test=2, min_seconds=1.0, max_seconds=2.0, num_workers=0)
    params = set_params(root)
    for folder in ("development", "validation", "evaluation"):
        with open(root / f"clotho_captions_{folder}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert rows
        for row in rows:
            scene = clip_scene(root / folder / row["file_name"], params)
            captions = [v for k, v in row.items() if k.startswith("caption_")]
            assert {parse_caption(c) for c in captions} == {scene.sequence}
            assert all(e.start >= 0 and e.start + e.duration <= scene.duration + 1e-9
                       for e in scene.events)


def test_a_folder_without_the_marker_is_refused(tmp_path):
    with pytest.raises(UserError, match="not a built-in synthetic audio set; point data_root"):
        set_params(tmp_path)


def spans_of(words: list[tuple[str, float, float]]) -> list[WordSpan]:
    return [WordSpan(w, s, e, (i,)) for i, (w, s, e) in enumerate(words)]


def test_named_events_cover_the_words_of_each_phrase():
    spans = spans_of([("A", 0.0, 0.2), ("loud", 0.2, 0.5), ("high-pitched", 0.5, 0.9),
                      ("beep", 0.9, 1.1), ("followed", 1.1, 1.3), ("by", 1.3, 1.4),
                      ("a", 1.4, 1.5), ("series", 1.5, 1.8), ("of", 1.8, 1.9),
                      ("slow", 1.9, 2.2), ("clicks.", 2.2, 2.6)])
    assert named_events(spans) == [(("tone", "high"), 0.5, 1.1), (("clicks", "slow"), 1.5, 2.6)]


def test_chance_overlap_by_hand():
    # a 1 s span in a 5 s clip: starts uniform in [0, 4]; it overlaps [2, 3] for starts in (1, 3)
    assert chance_overlap(1.0, 5.0, 2.0, 3.0) == pytest.approx(0.5)
    assert chance_overlap(1.0, 5.0, 0.0, 0.5) == pytest.approx(0.125)     # starts in [0, 0.5)
    assert chance_overlap(5.0, 5.0, 2.0, 3.0) == 1.0


def test_report_pairs_phrases_with_events_and_counts_hits():
    scene = Scene(events=(Event("tone", "high", True, 1.0, 0.5),
                          Event("clicks", "slow", False, 3.0, 1.0)),
                  duration=5.0, snr_db=20.0, noise_exponent=0.0)
    spans = spans_of([("high", 1.2, 1.3), ("tone", 1.3, 1.4), ("then", 1.4, 2.0),
                      ("slow", 0.0, 0.2), ("clicks", 0.2, 0.5), ("and", 0.5, 0.6),
                      ("pink", 0.6, 0.7), ("noise", 0.7, 0.8), ("burst", 0.8, 0.9)])
    report = OverlapReport()
    report.add(scene, spans)
    assert dict(report.named) == {"high tone": 1, "slow clicks": 1}
    assert dict(report.hits) == {"high tone": 1, "slow clicks": 0}
    assert report.absent == 1 and report.rate == 0.5
    assert "| high tone | 1 | 1 | 1.00 |" in report.table()
    assert "| **all** | 2 | 1 | 0.50 |" in report.table()
