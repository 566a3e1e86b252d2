"""Built-in sound events -> captions set, written in the Clotho v2 layout (and ESC-50 for labels).

Each clip (2-6 s, 16 kHz by default) holds 1-3 events over coloured background noise. Nine
classes that look different in a log-mel spectrogram:

=================  ==========================================================================
tone low/mid/high  a sine at ~300 / ~900 / ~2700 Hz (±7 %): one horizontal line, 3 bands apart
chirp rising/fall  a log sweep 400 -> 3200 Hz (or back) in 0.4-0.9 s: a diagonal line
noise white/pink   a Gaussian burst, flat or 1/f spectrum: a filled block, bright or dark top
clicks slow/fast   4 ms broadband clicks at 4-6 /s or 16-24 /s: vertical stripes
=================  ==========================================================================

Events are loud or quiet and short / medium / long. 5 captions per clip from a paraphrase
grammar; :func:`parse_caption` recovers the ordered ``(kind, attribute)`` event sequence that
event-sequence accuracy scores (every generated caption parses back to its clip's sequence).

Shapes: s samples at ``sample_rate``."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from mmtf.data.audio import colored_noise
from mmtf.data.formats.clotho import SPLIT_NAMES, write_clotho_csv
from mmtf.data.formats.esc50 import write_esc50_csv
from mmtf.errors import UserError
from mmtf.synthetic.parallel import parallel_map

VERSION = 2
EVENTS: tuple[tuple[str, str], ...] = (
    ("tone", "low"), ("tone", "middle"), ("tone", "high"),
    ("chirp", "rising"), ("chirp", "falling"),
    ("noise", "white"), ("noise", "pink"),
    ("clicks", "slow"), ("clicks", "fast"),
)
CLASS_NAMES: tuple[str, ...] = tuple(f"{attr}_{kind}" for kind, attr in EVENTS)
DURATIONS = {"tone": (0.25, 0.8), "chirp": (0.4, 0.9), "noise": (0.25, 0.8), "clicks": (0.6, 1.2)}
TONE_HZ = {"low": 300.0, "middle": 900.0, "high": 2700.0}
LOUD_RMS, QUIET_DB = 0.2, 14.0
GAP_SECONDS = (0.15, 0.8)
EDGE_SECONDS = 0.05

EventSequence = tuple[tuple[str, str], ...]


# ----------------------------------------------------------------------------- scenes
@dataclass(frozen=True)
class Event:
    """One sound event: what it is, how loud, when and how long."""

    kind: str
    attr: str
    loud: bool
    start: float
    duration: float

    @property
    def length(self) -> str:
        """``short`` | ``medium`` | ``long``: the duration's third of its kind's range."""
        lo, hi = DURATIONS[self.kind]
        third = (hi - lo) / 3
        return "short" if self.duration < lo + third else "long" if self.duration > hi - third \
            else "medium"


@dataclass(frozen=True)
class Scene:
    """A whole clip: events in time order, length and background."""

    events: tuple[Event, ...]
    duration: float
    snr_db: float
    noise_exponent: float

    @property
    def sequence(self) -> EventSequence:
        """What the captions express: ``(kind, attr)`` per event, in order."""
        return tuple((e.kind, e.attr) for e in self.events)


def sample_scene(rng: np.random.Generator, *, min_seconds: float = 2.0, max_seconds: float = 6.0,
                 min_events: int = 1, max_events: int = 3,
                 snr_db: Sequence[float] = (10.0, 30.0), first: int | None = None) -> Scene:
    """Draw one scene: 1-3 events with gaps, fitted into a clip of min..max seconds.

    Events longer than the clip allows (tiny test clips) are shrunk proportionally. ``first``
    fixes the class (index into :data:`EVENTS`) of the first event (balanced label sets)."""
    n = int(rng.integers(min_events, max_events + 1))
    classes = [EVENTS[int(k)] for k in rng.integers(0, len(EVENTS), size=n)]
    if first is not None:
        classes[0] = EVENTS[first]
    durs = np.array([rng.uniform(*DURATIONS[kind]) for kind, _ in classes])
    gaps = rng.uniform(*GAP_SECONDS, size=n - 1)
    need = durs.sum() + gaps.sum() + 2 * EDGE_SECONDS
    duration = float(rng.uniform(min_seconds, max_seconds))
    if need > max_seconds:
        scale = (max_seconds - 2 * EDGE_SECONDS) / (need - 2 * EDGE_SECONDS)
        durs, gaps, need = durs * scale, gaps * scale, max_seconds
    duration = max(duration, need)
    # Spread the slack over lead-in, gaps and tail so events land anywhere in the clip.
    extra = (duration - need) * rng.dirichlet(np.ones(n + 1))
    events, t = [], EDGE_SECONDS + extra[0]
    for i, (kind, attr) in enumerate(classes):
        events.append(Event(kind, attr, bool(rng.random() < 0.5), float(t), float(durs[i])))
        t += durs[i] + (gaps[i] + extra[i + 1] if i < n - 1 else 0.0)
    return Scene(tuple(events), float(duration), float(rng.uniform(*snr_db)),
                 float(rng.uniform(0.0, 1.5)))


# ----------------------------------------------------------------------------- rendering
def _fade(n: int, sr: int) -> np.ndarray:
    """Raised-cosine 10 ms fade-in/out envelope of length n."""
    env = np.ones(n)
    k = min(int(0.01 * sr), n // 2)
    if k > 0:
        ramp = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, k))
        env[:k], env[n - k:] = ramp, ramp[::-1]
    return env


def render_event(event: Event, sr: int, rng: np.random.Generator) -> np.ndarray:
    """One event's waveform (s,), scaled to its loudness (RMS over its active samples)."""
    n = max(1, int(round(event.duration * sr)))
    t, active = np.arange(n) / sr, None     # active: the samples the loudness is measured on
    if event.kind == "tone":
        f0 = TONE_HZ[event.attr] * rng.uniform(0.93, 1.07)
        x = np.sin(2 * np.pi * f0 * t + rng.uniform(0, 2 * np.pi)) * _fade(n, sr)
    elif event.kind == "chirp":
        f_lo, k = 400.0 * rng.uniform(0.9, 1.1), 8.0
        dur = n / sr
        x = np.sin(2 * np.pi * f_lo * dur / math.log(k) * (k ** (t / dur) - 1)) * _fade(n, sr)
        x = x if event.attr == "rising" else x[::-1].copy()
    elif event.kind == "noise":
        x = colored_noise(rng, n, 0.0 if event.attr == "white" else 1.0) * _fade(n, sr)
    else:  # clicks: short decaying broadband pulses
        rate = rng.uniform(4, 6) if event.attr == "slow" else rng.uniform(16, 24)
        click_n = int(0.004 * sr)
        click = rng.standard_normal(click_n) * np.exp(-np.arange(click_n) / (0.001 * sr))
        x = np.zeros(n)
        starts = (np.arange(0, event.duration, 1 / rate) * sr).astype(int)
        starts = starts[starts + click_n <= n]
        for s in starts:
            x[s:s + click_n] += click
        if len(starts):
            active = x[np.concatenate([np.arange(s, s + click_n) for s in starts])]
    active = x if active is None else active
    rms = LOUD_RMS * (1.0 if event.loud else 10 ** (-QUIET_DB / 20))
    return (x * rms / (np.sqrt(np.mean(active**2)) + 1e-12)).astype(np.float64)


def render(scene: Scene, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """The clip's waveform (s,) float32 in [-1, 1]: background noise plus every event."""
    n = int(round(scene.duration * sample_rate))
    quietest = min(LOUD_RMS * (1.0 if e.loud else 10 ** (-QUIET_DB / 20)) for e in scene.events)
    x = colored_noise(rng, n, scene.noise_exponent) * quietest * 10 ** (-scene.snr_db / 20)
    for e in scene.events:
        wave = render_event(e, sample_rate, rng)
        s = int(round(e.start * sample_rate))
        wave = wave[: max(0, n - s)]
        x[s:s + len(wave)] += wave
    return np.clip(x, -1.0, 1.0).astype(np.float32)


# ----------------------------------------------------------------------------- grammar
# Phrases per event: (text, countable). Countable phrases take "a"/"an"; the others none/"some".
PHRASES: dict[tuple[str, str], list[tuple[str, bool]]] = {
    ("tone", "low"): [("low tone", True), ("low beep", True), ("low-pitched tone", True),
                      ("deep tone", True), ("low hum", True)],
    ("tone", "middle"): [("middle tone", True), ("mid-pitched beep", True),
                         ("medium tone", True), ("medium-pitched tone", True),
                         ("mid-range beep", True)],
    ("tone", "high"): [("high tone", True), ("high beep", True), ("high-pitched beep", True),
                       ("shrill tone", True), ("high-pitched tone", True)],
    ("chirp", "rising"): [("rising chirp", True), ("upward sweep", True), ("rising sweep", True),
                          ("ascending chirp", True), ("chirp that rises", True)],
    ("chirp", "falling"): [("falling chirp", True), ("downward sweep", True),
                           ("falling sweep", True), ("descending chirp", True),
                           ("chirp that falls", True)],
    ("noise", "white"): [("burst of white noise", True), ("white noise burst", True),
                         ("blast of static", True), ("burst of hiss", True),
                         ("hiss of white noise", True)],
    ("noise", "pink"): [("burst of pink noise", True), ("pink noise burst", True),
                        ("whoosh of pink noise", True), ("rush of pink noise", True),
                        ("blast of pink noise", True)],
    ("clicks", "slow"): [("slow clicks", False), ("slow click train", True),
                         ("slow ticking", False), ("series of slow clicks", True),
                         ("slow clicking", False)],
    ("clicks", "fast"): [("fast clicks", False), ("rapid click train", True),
                         ("fast ticking", False), ("rapid series of clicks", True),
                         ("quick clicking", False)],
}
LOUDNESS = {True: ["loud", "strong"], False: ["quiet", "faint", "soft"]}
LENGTH = {"short": ["short", "brief"], "long": ["long"], "medium": []}
TEMPLATES: dict[int, list[str]] = {
    1: ["{A}", "{A} can be heard", "there is {A}", "the sound of {A}",
        "{A} over background noise", "you can hear {A}", "just {A}",
        "{A} against a noisy background"],
    2: ["{A} followed by {B}", "{A}, then {B}", "{A} and then {B}", "first {A}, then {B}",
        "{B} after {A}", "{A} before {B}", "after {A}, {B}", "{B} comes after {A}",
        "{A} is followed by {B}", "{B}, preceded by {A}", "{A}, and after that {B}",
        "{B} following {A}"],
    3: ["{A}, then {B}, then {C}", "{A} followed by {B} and then {C}",
        "first {A}, then {B}, and finally {C}", "{A}, {B} and {C} in that order",
        "{A}, then {B}, followed by {C}", "{A} before {B}, then {C}",
        "after {A}, {B} and then {C}", "{A}, {B}, and then {C}"],
}


def event_phrase(event: Event, rng: np.random.Generator) -> str:
    """One paraphrase of one event, e.g. "a loud high-pitched beep" or "fast ticking"."""
    phrases = PHRASES[(event.kind, event.attr)]
    text, countable = phrases[int(rng.integers(len(phrases)))]
    mods = []
    if rng.random() < 0.35:
        mods.append(str(rng.choice(LOUDNESS[event.loud])))
    if LENGTH[event.length] and rng.random() < 0.25:
        mods.append(str(rng.choice(LENGTH[event.length])))
    rng.shuffle(mods)
    body = " ".join([*mods, text])
    if countable:
        return ("an " if body[0] in "aeiou" else "a ") + body
    return ("some " if rng.random() < 0.3 else "") + body


def make_captions(scene: Scene, rng: np.random.Generator, n: int = 5) -> list[str]:
    """``n`` distinct paraphrased captions of a scene (distinct templates where possible)."""
    templates = TEMPLATES[len(scene.events)]
    order = rng.permutation(len(templates))
    out: list[str] = []
    for attempt in range(20 * n):
        if len(out) == n:
            break
        tpl = templates[int(order[attempt % len(order)])]
        slots = {k: event_phrase(e, rng) for k, e in zip("ABC", scene.events)}
        text = tpl.format(**slots)
        text = text[0].upper() + text[1:] + "."
        if text not in out or attempt >= 10 * n:
            out.append(text)
    return out


# ----------------------------------------------------------------------------- parsing
def _toks(s: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z]+|,", s.lower().replace("-", " ")))


_CORES: dict[tuple[str, ...], tuple[str, str]] = {
    _toks(text): ev for ev, phrases in PHRASES.items() for text, _ in phrases}
_ARTICLES = {"a", "an", "the", "some", "one", "another"}
_MODIFIERS = {w for ws in (*LOUDNESS.values(), *LENGTH.values()) for w in ws}
_PREFIXES = [_toks(p) for p in ("", "first", "after", "there is", "there are", "the sound of",
                                "you can hear", "just")]
_SUFFIXES = [_toks(s) for s in ("", "can be heard", "is heard", "over background noise",
                                "against a noisy background", "in that order",
                                "one after another")]
_FORWARD = [_toks(c) for c in (
    "followed by", ", followed by", "is followed by", ", then", "then", "and then", ", and then",
    "before", ",", "and", ", and", ", and after that", "and after that", ", and finally",
    "and finally", ", next", "next", ", then finally")]
_REVERSE = [_toks(c) for c in ("after", "comes after", ", preceded by", "preceded by",
                               "is preceded by", "following", ", following")]


def _match(toks: tuple[str, ...], i: int, pattern: tuple[str, ...]) -> int | None:
    return i + len(pattern) if toks[i:i + len(pattern)] == pattern else None


def _events_at(toks: tuple[str, ...], i: int) -> list[tuple[tuple[str, str], int]]:
    """Every way an event phrase can start at token i: (event, end)."""
    out = []
    j = i + 1 if i < len(toks) and toks[i] in _ARTICLES else i
    starts = [j]
    for _ in range(2):  # up to two modifiers
        if j < len(toks) and toks[j] in _MODIFIERS:
            j += 1
            starts.append(j)
    for s in starts:
        for core, ev in _CORES.items():
            end = _match(toks, s, core)
            if end is not None:
                out.append((ev, end))
    return out


def _chains(toks: tuple[str, ...], i: int, depth: int = 0):
    """Yield (events, directions, end): event phrases joined by connectors from token i."""
    for ev, end in _events_at(toks, i):
        yield [ev], [], end
        if depth < 2:
            for conns, direction in ((_FORWARD, "fwd"), (_REVERSE, "rev")):
                for c in conns:
                    j = _match(toks, end, c)
                    if j is None:
                        continue
                    for evs, dirs, e in _chains(toks, j, depth + 1):
                        yield [ev, *evs], [direction, *dirs], e


def parse_caption(text: str) -> EventSequence | None:
    """The event sequence ``((kind, attr), ...)`` in time order a caption (generated, or a
    model's output) describes, or None when it is unparsable or ambiguous.

    Case, hyphens and punctuation other than commas are ignored. "X after Y" and "X preceded by
    Y" reverse the order (in two-event captions only); every other connector keeps it."""
    toks = _toks(text)
    results = set()
    for pre in _PREFIXES:
        i = _match(toks, 0, pre)
        if i is None:
            continue
        for evs, dirs, end in _chains(toks, i):
            if not any(_match(toks, end, s) == len(toks) for s in _SUFFIXES):
                continue
            if "rev" in dirs:
                if len(evs) != 2 or pre == _toks("after"):
                    continue
                evs = evs[::-1]
            elif pre == _toks("after") and len(evs) < 2:
                continue
            results.add(tuple(evs))
    return results.pop() if len(results) == 1 else None


# ----------------------------------------------------------------------------- writing sets
CAPTION_SPLITS = ("train", "val", "test")   # drawn in this order: a split's index seeds its clips


def clip_scene(seed: int, split: str, index: int, **scene_kw: Any) -> Scene:
    """The scene of clip ``index`` of ``split`` in a caption set written with ``seed``.

    The one seeding rule of :func:`write_caption_set`, so evaluators can recover the true events
    (onsets, durations) of a written clip from its name and the set's parameters."""
    return _scene((seed, CAPTION_SPLITS.index(split), index), **scene_kw)


def _scene(seed_key: tuple[int, ...], **scene_kw: Any) -> Scene:
    return sample_scene(np.random.default_rng([*seed_key, 0]), **scene_kw)


def _clip(task: tuple) -> tuple[str, list[str], int]:
    """Generate and write one clip; return (file name, captions, first-event class)."""
    path, seed_key, sr, scene_kw, n_captions = task
    scene = _scene(seed_key, **scene_kw)
    wave = render(scene, sr, np.random.default_rng([*seed_key, 1]))
    sf.write(path, wave, sr, subtype="PCM_16")
    captions = make_captions(scene, np.random.default_rng([*seed_key, 2]), n_captions)
    return Path(path).name, captions, EVENTS.index(scene.sequence[0])


def write_caption_set(root: str | Path, *, num_train: int = 3000, num_val: int = 300,
                      num_test: int = 300, seed: int = 0, sample_rate: int = 16000,
                      min_seconds: float = 2.0, max_seconds: float = 6.0, min_events: int = 1,
                      max_events: int = 3, snr_db: Sequence[float] = (10.0, 30.0),
                      captions_per_clip: int = 5, num_workers: int = 2) -> None:
    """Write the sound-events captioning set in the Clotho v2 layout under ``root``.

    Args:
        num_train, num_val, num_test: clips in development/, validation/, evaluation/.
        seed: everything is a function of (seed, split, clip index).
        min_events, max_events: events per clip (at most 3).
        snr_db: range of background-noise SNR, relative to the quietest event.
    """
    _check_scene_args(min_seconds, max_seconds, min_events, max_events)
    root = Path(root)
    scene_kw = dict(min_seconds=min_seconds, max_seconds=max_seconds, min_events=min_events,
                    max_events=max_events, snr_db=tuple(snr_db))
    for split_idx, (split, count) in enumerate(zip(CAPTION_SPLITS,
                                                   (num_train, num_val, num_test))):
        name = SPLIT_NAMES[split]
        (root / name).mkdir(parents=True, exist_ok=True)
        tasks = [(str(root / name / f"synth_{name}_{i:05d}.wav"), (seed, split_idx, i),
                  sample_rate, scene_kw, captions_per_clip) for i in range(count)]
        rows = parallel_map(_clip, tasks, num_workers)
        write_clotho_csv(root, name, [(fn, caps) for fn, caps, _ in rows])


def write_label_set(root: str | Path, *, num_clips: int = 2000, num_folds: int = 5, seed: int = 0,
                    sample_rate: int = 16000, min_seconds: float = 1.0, max_seconds: float = 3.0,
                    min_events: int = 1, max_events: int = 1,
                    snr_db: Sequence[float] = (10.0, 30.0), num_workers: int = 2) -> None:
    """Write a sound-event classification set in the ESC-50 layout under ``root``.

    The label of a clip is the class of its first event (one event per clip by default), one of
    :data:`CLASS_NAMES`; clip ``i`` has class ``i % 9`` (balanced, every class present from 9
    clips on) and goes to fold ``i % num_folds + 1``.

    Args:
        num_clips: clips over all folds. num_folds: folds (ESC-50 has 5). The others: as
            :func:`write_caption_set`.
    """
    _check_scene_args(min_seconds, max_seconds, min_events, max_events)
    root = Path(root)
    (root / "audio").mkdir(parents=True, exist_ok=True)
    scene_kw = dict(min_seconds=min_seconds, max_seconds=max_seconds, min_events=min_events,
                    max_events=max_events, snr_db=tuple(snr_db))
    tasks = []
    for i in range(num_clips):
        fold = i % num_folds + 1
        # ESC-50 names files {fold}-{source id}-{take}-{target}; the target is known only after
        # sampling, so the file is renamed below.
        tasks.append((str(root / "audio" / f"{fold}-{i:05d}-A.wav"), (seed, 3, i), sample_rate,
                      {**scene_kw, "first": i % len(EVENTS)}, 0))
    rows = []
    for i, (fn, _, target) in enumerate(parallel_map(_clip, tasks, num_workers)):
        fold = i % num_folds + 1
        final = f"{Path(fn).stem}-{target}.wav"
        (root / "audio" / fn).rename(root / "audio" / final)
        rows.append({"filename": final, "fold": fold, "target": target,
                     "category": CLASS_NAMES[target], "esc10": False, "src_file": f"{i:05d}",
                     "take": "A"})
    write_esc50_csv(root, rows)


def _check_scene_args(min_seconds: float, max_seconds: float, min_events: int,
                      max_events: int) -> None:
    if not 0 < min_seconds <= max_seconds:
        raise UserError(f"min_seconds ({min_seconds}) and max_seconds ({max_seconds}) must "
                         f"satisfy 0 < min_seconds <= max_seconds.")
    if max_seconds < 0.3 * max_events:
        raise UserError(f"max_seconds ({max_seconds}) is too short for max_events "
                         f"({max_events}); allow at least 0.3 s per event.")
    if not 1 <= min_events <= max_events <= 3:
        raise UserError(f"min_events ({min_events}) and max_events ({max_events}) must satisfy "
                         f"1 <= min_events <= max_events <= 3.")
