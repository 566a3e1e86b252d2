"""Tiny speech corpora in the real on-disk layouts (LibriSpeech, Common Voice), written here:
tones and noise with transcripts, enough for readers and a few training steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

# Words the tiny test tokenizers know (tests/unit/pretrained/tiny_hf.py's corpus).
TEXTS = ["A DOG BARKS AT THE CAT", "RAIN FALLS ON A TIN ROOF", "BIRDS SING IN TALL TREES",
         "PEOPLE TALK NEAR THE BUSY ROAD", "WATER DRIPS INTO A METAL BUCKET"]


def clip(seed: int, seconds: float = 1.0, sr: int = 16000) -> np.ndarray:
    """A tone plus noise, different per seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    wave = 0.3 * np.sin(2 * np.pi * (200 + 50 * (seed % 7)) * t) + 0.05 * rng.standard_normal(t.size)
    return wave.astype(np.float32)


def write_librispeech(root: Path, subsets: dict[str, int], *, seconds: float = 1.0) -> Path:
    """``root/<subset>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` + flac files, two
    chapters per subset, utterances alternating between them."""
    for s, (subset, count) in enumerate(subsets.items()):
        chapters: dict[Path, list[str]] = {}
        for i in range(count):
            speaker, chapter = 100 + s, 10 + i % 2
            folder = root / subset / str(speaker) / str(chapter)
            folder.mkdir(parents=True, exist_ok=True)
            utt = f"{speaker}-{chapter}-{i:04d}"
            sf.write(str(folder / f"{utt}.flac"), clip(1000 * s + i, seconds), 16000)
            chapters.setdefault(folder, []).append(f"{utt} {TEXTS[i % len(TEXTS)]}")
        for folder, lines in chapters.items():
            speaker, chapter = folder.parent.name, folder.name
            (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
    return root


def write_common_voice(root: Path, splits: dict[str, int], *, locale: str | None = "en",
                       seconds: float = 1.0) -> Path:
    """``root/<split>.tsv`` + ``root/clips/*.mp3`` (MP3 through libsndfile)."""
    (root / "clips").mkdir(parents=True, exist_ok=True)
    header = ["client_id", "path", "sentence", "up_votes", "down_votes", "age", "gender"]
    if locale is not None:
        header.append("locale")
    for s, (name, count) in enumerate(splits.items()):
        lines = ["\t".join(header)]
        for i in range(count):
            path = f"common_voice_{locale or 'xx'}_{s}{i:03d}.mp3"
            sf.write(str(root / "clips" / path), clip(500 * s + i, seconds), 16000, format="MP3")
            # Common Voice's TSVs are not quoted: a sentence's own quote stays a character.
            text = '"' + TEXTS[i % len(TEXTS)].capitalize() + '."'
            row = [f"client{i}", path, text, "2", "0", "", ""]
            lines.append("\t".join([*row, locale] if locale is not None else row))
        (root / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
