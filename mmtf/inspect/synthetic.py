"""How well word-to-time alignment finds the events of the built-in synthetic audio set.

Each clip is a function of ``(seed, split, index)`` (:func:`mmtf.synthetic.audio.clip_scene`), so
true event times are recovered from the set's ``.mmtf_synthetic.json``. A phrase naming an event
class hits when its aligned span overlaps that event; the chance rate is the exact score of a
same-length span placed uniformly at random."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmtf.data.formats.clotho import SPLIT_NAMES
from mmtf.decoders.align import WordSpan
from mmtf.errors import UserError, require_file
from mmtf.synthetic import audio as synthetic_audio
from mmtf.synthetic.audio import EVENTS, PHRASES, Scene
from mmtf.synthetic.cache import MARKER

SCENE_KEYS = ("min_seconds", "max_seconds", "min_events", "max_events", "snr_db")
_FILE = re.compile(r"^synth_(?P<name>[a-z]+)_(?P<index>\d+)$")


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z]+", text.lower().replace("-", " ")))


# Word sequence of each event phrase -> its class, longest first so "series of slow clicks" wins
# over "slow clicks".
CORES: list[tuple[tuple[str, ...], tuple[str, str]]] = sorted(
    ((_words(text), event) for event, phrases in PHRASES.items() for text, _ in phrases),
    key=lambda item: -len(item[0]))


def set_params(root: str | Path) -> dict:
    """The generator parameters of the synthetic audio set under ``root`` (its marker file)."""
    marker = require_file(Path(root) / MARKER, what="synthetic-set marker",
                          fix=f"data_root={root} is not a built-in synthetic audio set; point "
                              f"data_root at the synth_audio_captions folder the checkpoint was "
                              f"trained on")
    info = json.loads(marker.read_text())
    if info.get("kind") != "audio_captions":
        raise UserError(f"{marker} describes a {info.get('kind')!r} set; the event overlap needs "
                        f"the audio_captions set.")
    return info["params"]


def clip_scene(path: str | Path, params: dict) -> Scene:
    """The scene (events with onsets and durations) of one clip of the set, from its file name."""
    match = _FILE.match(Path(path).stem)
    names = {v: k for k, v in SPLIT_NAMES.items()}
    if match is None or match["name"] not in names:
        raise UserError(f"{path}: not a clip of the synthetic set (synth_<split>_<index>.wav).")
    return synthetic_audio.clip_scene(
        int(params["seed"]), names[match["name"]], int(match["index"]),
        **{k: (tuple(params[k]) if k == "snr_db" else params[k]) for k in SCENE_KEYS})


def named_events(spans: Sequence[WordSpan]) -> list[tuple[tuple[str, str], float, float]]:
    """Event phrases in an aligned caption: ``(class, start s, end s)`` of the words naming it."""
    flat = [(w, i) for i, span in enumerate(spans) for w in _words(span.word)]
    found, k = [], 0
    while k < len(flat):
        for core, event in CORES:
            if tuple(w for w, _ in flat[k:k + len(core)]) == core:
                first, last = flat[k][1], flat[k + len(core) - 1][1]
                found.append((event, spans[first].start, spans[last].end))
                k += len(core)
                break
        else:
            k += 1
    return found


def chance_overlap(length: float, duration: float, onset: float, offset: float) -> float:
    """Probability that a span of ``length`` placed uniformly in [0, duration] overlaps
    [onset, offset]."""
    room = duration - length
    if room <= 0:
        return 1.0
    lo, hi = max(0.0, onset - length), min(room, offset)     # starts s with s < offset, s + L > onset
    return max(0.0, hi - lo) / room


@dataclass
class OverlapReport:
    """Per event class: phrases paired with a true event, how many overlapped it, chance rate.

    Attributes:
        named, hits, chance: class -> phrases naming an event the clip has; of those, spans
            overlapping the event's [onset, offset]; their summed chance overlap.
        absent, clips: phrases naming a class the clip lacks (a wrong caption); clips scored.
    """

    named: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hits: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    chance: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    absent: int = 0
    clips: int = 0

    def add(self, scene: Scene, spans: Sequence[WordSpan]) -> None:
        """Score one clip's aligned caption against its scene."""
        self.clips += 1
        unused = list(scene.events)
        for event, start, end in named_events(spans):
            match = next((e for e in unused if (e.kind, e.attr) == event), None)
            if match is None:
                self.absent += 1
                continue
            unused.remove(match)
            name = f"{event[1]} {event[0]}"
            offset = match.start + match.duration
            self.named[name] += 1
            self.hits[name] += int(start < offset and end > match.start)
            self.chance[name] += chance_overlap(end - start, scene.duration, match.start, offset)

    def table(self) -> str:
        """Markdown table: class, named, overlapping, rate, chance rate; then the total."""
        lines = ["| event | named | span overlaps | rate | chance |", "|---|---|---|---|---|"]
        order = [f"{attr} {kind}" for kind, attr in EVENTS]
        for name in [n for n in order if self.named.get(n)]:
            n = self.named[name]
            lines.append(f"| {name} | {n} | {self.hits[name]} | {self.hits[name] / n:.2f} | "
                         f"{self.chance[name] / n:.2f} |")
        total, hits = sum(self.named.values()), sum(self.hits.values())
        if total:
            lines.append(f"| **all** | {total} | {hits} | {hits / total:.2f} | "
                         f"{sum(self.chance.values()) / total:.2f} |")
        lines.append(f"\n{self.clips} clips; {self.absent} named event(s) absent from their "
                     f"clip (wrong captions) are not scored.")
        return "\n".join(lines)

    @property
    def rate(self) -> float:
        """Overall fraction of paired phrases whose span overlaps the true event."""
        total = sum(self.named.values())
        return sum(self.hits.values()) / total if total else float("nan")


def event_overlap(task, data_root: str | Path, *, split: str = "val",
                  num_clips: int | None = None, layers: Sequence[int] | None = None,
                  heads: Sequence[int] | None = None, medfilt_width: int = 7) -> OverlapReport:
    """Align the captions of a split of the synthetic set and score the named events' spans.

    Args:
        task: a captioning task of an audio checkpoint (:func:`mmtf.inspect.load_task`).
        data_root: the ``synth_audio_captions`` folder (with its marker file).
        split, num_clips: "train" | "val" | "test", and its first clips to use (None = all).
        layers, heads, medfilt_width: as in :func:`mmtf.decoders.align`.
    """
    from mmtf.inspect.core import align

    if split not in synthetic_audio.CAPTION_SPLITS:
        raise UserError(f"synthetic_split={split!r} must be one of "
                        f"{list(synthetic_audio.CAPTION_SPLITS)}.")
    params = set_params(data_root)
    files = sorted((Path(data_root) / SPLIT_NAMES[split]).glob("synth_*.wav"))[:num_clips]
    if not files:
        raise UserError(f"no clips in {Path(data_root) / SPLIT_NAMES[split]}; check data_root.")
    report = OverlapReport()
    for path in files:
        spans = align(task, path, layers=layers, heads=heads, medfilt_width=medfilt_width)
        report.add(clip_scene(path, params), spans)
    return report
