"""Short spoken utterances in the Clotho layout, synthesized with espeak-ng (reproducible).

Each clip is one sentence of a few words (1-3 s of speech); its one caption is the transcript.
``--set grammar`` (the default): 3-5 words of a fixed grammar, ``[number] colour noun verb
[place]`` from 30 words. ``--set short`` (harder): 2-4 words of the same grammar with any slot
but the noun left out (the sentence's shape does not tell which word a masked span held), spoken
at 130-199 wpm with random pauses between words, by 10 voices over a wider pitch range (held out:
4 others). Train, validation and evaluation use disjoint sentences, and the evaluation split
also uses voices the training split never hears, so the test WER measures recognition of
held-out word sequences by held-out speakers.

    apt-get install -y espeak-ng
    python experiments/short_utterances_specaugment/make_data.py /tmp/short_utts

Writes root/{development,validation,evaluation}/*.wav (16 kHz mono PCM-16) and
root/clotho_captions_{development,validation,evaluation}.csv; the same arguments write the same
files (sentences, voices, rates and pitches come from one numpy seed; espeak-ng is
deterministic).
"""

from __future__ import annotations

import argparse
import io
import itertools
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from mmtf.data.audio import resample
from mmtf.data.formats.clotho import write_clotho_csv

NUMBERS = ["one", "two", "three", "four", "five", "six"]
COLOURS = ["red", "green", "blue", "black", "white", "yellow"]
NOUNS = ["dog", "cat", "bird", "horse", "fish", "snake"]
VERBS = ["runs", "jumps", "sleeps", "swims", "sings", "waits"]
PLACES = ["here", "there", "now", "today", "again", "away"]
TRAIN_VOICES = ["en", "en-us", "en+m3", "en+f2", "en-us+m5", "en+f4"]
HELD_OUT_VOICES = ["en-gb-x-rp", "en+m7", "en-us+f3"]
SHORT_TRAIN_VOICES = ["en", "en-us", "en+m3", "en+f2", "en-us+m5", "en+f4", "en-gb-scotland",
                     "en-029", "en+m1", "en+f1"]
SHORT_HELD_OUT_VOICES = ["en-gb-x-rp", "en+m7", "en-us+f3", "en-us-nyc"]
SAMPLE_RATE = 16000


def sentences(rng: np.random.Generator) -> list[str]:
    """Every sentence of the grammar, shuffled: [number] colour noun verb [place]."""
    out = []
    for number, colour, noun, verb, place in itertools.product(
            [None, *NUMBERS], COLOURS, NOUNS, VERBS, [None, *PLACES]):
        words = [number, colour, noun, verb, place]
        if number is None and place is None:
            continue        # 3-5 words
        if number is not None and place is not None and rng.random() < 0.7:
            continue        # fewer of the longest
        out.append(" ".join(w for w in words if w))
    rng.shuffle(out)
    return out


def short_sentences(rng: np.random.Generator) -> list[str]:
    """Every 2-4-word sentence of ``[number] [colour] noun [verb] [place]``, shuffled: which
    slots are filled varies, so a masked word cannot be restored from the sentence's shape."""
    out = []
    for number, colour, noun, verb, place in itertools.product(
            [None, *NUMBERS], [None, *COLOURS], NOUNS, [None, *VERBS], [None, *PLACES]):
        words = [w for w in (number, colour, noun, verb, place) if w]
        if 2 <= len(words) <= 4:
            out.append(" ".join(words))
    rng.shuffle(out)
    return out


def speak(text: str, voice: str, rate: int, pitch: int, gap: int = 0) -> np.ndarray:
    """espeak-ng's waveform of ``text`` at 16 kHz, float32 mono; ``gap``: extra pause between
    words, in units of 10 ms."""
    pause = ["-g", str(gap)] if gap else []
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-p", str(pitch), *pause,
                          "--stdout", text], check=True, capture_output=True).stdout
    data, rate_in = sf.read(io.BytesIO(wav), dtype="float32")
    return resample(torch.from_numpy(data), rate_in, SAMPLE_RATE).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", choices=("grammar", "short"), default="grammar")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    sizes = {"development": args.train, "validation": args.val, "evaluation": args.test}
    hard = args.set == "short"
    pool = short_sentences(rng) if hard else sentences(rng)
    rates, pitches = ((130, 200), (15, 86)) if hard else ((150, 200), (30, 70))
    train_voices, held_out = ((SHORT_TRAIN_VOICES, SHORT_HELD_OUT_VOICES) if hard
                              else (TRAIN_VOICES, HELD_OUT_VOICES))
    if sum(sizes.values()) > len(pool):
        raise SystemExit(f"the grammar has {len(pool)} sentences; ask for fewer clips")
    start = 0
    for split, n in sizes.items():
        voices = held_out if split == "evaluation" else train_voices
        folder = args.root / split
        folder.mkdir(parents=True, exist_ok=True)
        rows, seconds = [], []
        for i, text in enumerate(pool[start:start + n]):
            voice = voices[int(rng.integers(len(voices)))]
            rate, pitch = int(rng.integers(*rates)), int(rng.integers(*pitches))
            # The grammar set draws no gap, so its files are the ones measured before.
            wave = speak(text, voice, rate, pitch, int(rng.integers(0, 9)) if hard else 0)
            name = f"{split}_{i:05d}.wav"
            sf.write(folder / name, wave, SAMPLE_RATE, subtype="PCM_16")
            rows.append((name, [text]))
            seconds.append(len(wave) / SAMPLE_RATE)
        write_clotho_csv(args.root, split, rows)
        print(f"{split}: {n} clips, {np.mean(seconds):.2f} s mean "
              f"({np.min(seconds):.2f}-{np.max(seconds):.2f} s)")
        start += n


if __name__ == "__main__":
    main()
