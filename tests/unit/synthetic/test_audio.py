"""The sound-events set: grammar round trip, parser, acoustics, layout, determinism."""

from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest
import soundfile as sf

from mmtf.data.formats import read_clotho
from mmtf.data.formats.esc50 import COLUMNS
from mmtf.synthetic import audio as sa
from mmtf.synthetic.parallel import parallel_map

SR = 16000


def test_thousands_of_captions_parse_back_to_their_sequence():
    n = 0
    for i in range(1000):
        scene = sa.sample_scene(np.random.default_rng([7, i]))
        for caption in sa.make_captions(scene, np.random.default_rng([8, i])):
            assert sa.parse_caption(caption) == scene.sequence, caption
            n += 1
    assert n == 5000


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_template_and_phrase_parses(n):
    rng = np.random.default_rng(n)
    for tpl in sa.TEMPLATES[n]:
        for _ in range(30):
            events = tuple(sa.Event(*sa.EVENTS[int(k)], bool(rng.random() < .5), 0.0,
                                    float(rng.uniform(0.2, 1.2)))
                           for k in rng.integers(0, len(sa.EVENTS), n))
            text = tpl.format(**{k: sa.event_phrase(e, rng) for k, e in zip("ABC", events)})
            assert sa.parse_caption(text) == tuple((e.kind, e.attr) for e in events), text
    for (kind, attr), phrases in sa.PHRASES.items():
        for text, _ in phrases:
            assert sa.parse_caption(text) == ((kind, attr),)


def test_reversing_relations():
    high, white = ("tone", "high"), ("noise", "white")
    assert sa.parse_caption("A burst of white noise after a short high beep.") == (high, white)
    assert sa.parse_caption("a high beep followed by a burst of white noise") == (high, white)
    assert sa.parse_caption("A burst of white noise, preceded by a high tone") == (high, white)
    assert sa.parse_caption("a high beep before a burst of white noise") == (high, white)
    assert sa.parse_caption("After a high beep, a burst of white noise.") == (high, white)


def test_parser_ignores_case_hyphens_and_spacing():
    expected = (("tone", "high"), ("chirp", "falling"))
    for text in ("A HIGH-PITCHED BEEP , THEN A FALLING CHIRP .",
                 "a high - pitched beep,then a falling chirp",
                 "  a high pitched beep ,  then   a  falling chirp"):
        assert sa.parse_caption(text) == expected


@pytest.mark.parametrize("text", [
    "", "a dog barks", "a high beep followed by", "followed by a high beep",
    "a high beep while a low tone plays", "a beep", "after a high beep",
    "a high beep after a low tone after a rising chirp",   # reversal only with two events
    "a high beep, then a low tone, then slow clicks, then fast clicks",  # four events
    "a very loud high beep",
])
def test_unparsable_captions_give_none(text):
    assert sa.parse_caption(text) is None


def test_scenes_fit_their_clip():
    for i in range(300):
        scene = sa.sample_scene(np.random.default_rng(i), min_seconds=2, max_seconds=6)
        assert 2 <= scene.duration <= 6 + 1e-9 and 1 <= len(scene.events) <= 3
        assert 10 <= scene.snr_db <= 30
        end = 0.0
        for e in scene.events:
            assert e.start >= end - 1e-9 and e.duration > 0
            end = e.start + e.duration
        assert end <= scene.duration + 1e-9


def test_tiny_clips_shrink_events_to_fit():
    for i in range(100):
        scene = sa.sample_scene(np.random.default_rng(i), min_seconds=1, max_seconds=1.5)
        last = scene.events[-1]
        assert scene.duration <= 1.5 + 1e-9 and last.start + last.duration <= scene.duration + 1e-9


def _one(kind: str, attr: str, loud: bool = True, snr: float = 30.0, dur: float = 0.8):
    scene = sa.Scene((sa.Event(kind, attr, loud, 0.1, dur),), dur + 0.2, snr, 1.0)
    return sa.render(scene, SR, np.random.default_rng(0))[int(0.1 * SR):int((0.1 + dur) * SR)]


@pytest.mark.parametrize("attr,hz", sorted(sa.TONE_HZ.items()))
def test_tones_have_their_pitch(attr, hz):
    assert abs(_dominant_hz(_one("tone", attr)) / hz - 1) < 0.08


def _dominant_hz(x: np.ndarray) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * SR / len(x))


def test_chirps_sweep_in_their_direction():
    for attr, sign in (("rising", 1), ("falling", -1)):
        x = _one("chirp", attr)
        q = len(x) // 4
        first, last = _dominant_hz(x[:q]), _dominant_hz(x[-q:])
        assert sign * (last - first) > 1000


def test_white_and_pink_noise_differ_in_tilt():
    def high_over_low(x):
        p = np.abs(np.fft.rfft(x)) ** 2
        f = np.fft.rfftfreq(len(x), 1 / SR)
        return p[(f > 4000)].sum() / p[(f > 100) & (f < 1000)].sum()
    assert high_over_low(_one("noise", "white")) > 3.0      # flat: 4 kHz band vs 0.9 kHz band
    assert high_over_low(_one("noise", "pink")) < 1.0       # 1/f: most power at low frequency


def test_click_rates():
    for attr, (lo, hi) in (("slow", (4, 6)), ("fast", (16, 24))):
        x = _one("clicks", attr, dur=1.0)
        env = np.abs(x) > 0.2 * np.abs(x).max()
        onsets = np.flatnonzero(env[1:] & ~env[:-1])
        clicks = 1 + int((np.diff(onsets) > 0.01 * SR).sum())
        assert lo - 1 <= clicks <= hi + 1


def test_background_noise_sits_at_the_snr_below_the_quietest_event():
    scene = sa.Scene((sa.Event("tone", "middle", False, 0.5, 0.8),
                      sa.Event("noise", "white", True, 1.8, 0.5)), 2.8, 12.0, 0.5)
    x = sa.render(scene, SR, np.random.default_rng(1)).astype(np.float64)
    bg = x[int(0.05 * SR):int(0.45 * SR)]
    tone = x[int(0.6 * SR):int(1.2 * SR)]
    snr = 10 * np.log10(np.mean(tone**2) / np.mean(bg**2) - 1)  # (S + N) / N - 1 = S / N
    assert abs(snr - 12.0) < 1.5
    loud = x[int(1.9 * SR):int(2.2 * SR)]
    assert 10 * np.log10(np.mean(loud**2) / np.mean(tone**2)) == pytest.approx(sa.QUIET_DB, abs=1)
    assert np.abs(x).max() <= 1.0


def test_captions_are_five_distinct_and_mention_loudness_truthfully():
    for i in range(200):
        scene = sa.sample_scene(np.random.default_rng(i))
        caps = sa.make_captions(scene, np.random.default_rng(i))
        assert len(caps) == 5 and len(set(caps)) == 5
        if all(not e.loud for e in scene.events):
            assert not any(w in c.lower().split() for c in caps for w in ("loud", "strong"))
        if all(e.loud for e in scene.events):
            assert not any(w in c.lower().split() for c in caps
                           for w in ("quiet", "faint", "soft"))


def test_written_set_is_clotho_and_deterministic(tmp_path):
    kw = dict(num_train=4, num_val=2, num_test=2, min_seconds=1.0, max_seconds=2.0, seed=3)
    sa.write_caption_set(tmp_path / "a", **kw)
    sa.write_caption_set(tmp_path / "b", **kw)
    sa.write_caption_set(tmp_path / "c", **{**kw, "seed": 4})
    for name, count in (("development", 4), ("validation", 2), ("evaluation", 2)):
        csv_a = (tmp_path / "a" / f"clotho_captions_{name}.csv").read_text()
        assert csv_a.splitlines()[0] == "file_name,caption_1,caption_2,caption_3,caption_4,caption_5"
        assert csv_a == (tmp_path / "b" / f"clotho_captions_{name}.csv").read_text()
        wavs = sorted((tmp_path / "a" / name).glob("*.wav"))
        assert len(wavs) == count
        for w in wavs:
            assert w.read_bytes() == (tmp_path / "b" / name / w.name).read_bytes()
            info = sf.info(str(w))
            assert info.samplerate == SR and info.channels == 1 and 1.0 <= info.duration <= 2.0
    assert (tmp_path / "a" / "development").iterdir().__next__().read_bytes() != \
        (tmp_path / "c" / "development").iterdir().__next__().read_bytes()
    items = read_clotho(tmp_path / "a", "train", report=pytest.fail)
    for item in items:
        assert len(item.captions) == 5
        assert len({sa.parse_caption(c) for c in item.captions}) == 1
        assert sa.parse_caption(item.captions[0]) is not None


def test_label_set_is_esc50(tmp_path):
    sa.write_label_set(tmp_path, num_clips=10, min_seconds=1.0, max_seconds=1.5)
    with open(tmp_path / "meta" / "esc50.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and len(rows) == 10
    for i, row in enumerate(rows):
        fold, target = int(row["fold"]), int(row["target"])
        assert fold == i % 5 + 1 and row["category"] == sa.CLASS_NAMES[target]
        assert target == i % len(sa.EVENTS)  # balanced: every class present
        assert row["filename"] == f"{fold}-{i:05d}-A-{target}.wav"
        assert (tmp_path / "audio" / row["filename"]).is_file()


def test_pool_gives_the_same_clips_as_serial(tmp_path):
    kw = dict(min_seconds=1.0, max_seconds=1.5, min_events=1, max_events=3, snr_db=(10, 30))
    tasks = [(str(tmp_path / f"{w}_{i}.wav"), (0, 0, i), SR, kw, 5)
             for w, i in itertools.product(("s", "p"), range(4))]
    serial = parallel_map(sa._clip, tasks[:4], 1)
    pooled = parallel_map(sa._clip, tasks[4:], 2, min_tasks=1)
    assert [r[1:] for r in serial] == [r[1:] for r in pooled]
    for i in range(4):
        assert (tmp_path / f"s_{i}.wav").read_bytes() == (tmp_path / f"p_{i}.wav").read_bytes()


def test_generator_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"max_events \(4\)"):
        sa.write_caption_set(tmp_path, max_events=4)
    with pytest.raises(ValueError, match=r"min_seconds \(3\.0\) and max_seconds \(2\.0\)"):
        sa.write_caption_set(tmp_path, min_seconds=3.0, max_seconds=2.0)
