"""Fuzzing the decoders and index readers: bad input is a DataError naming the file, never a crash.

Random bytes and truncated real WAV/FLAC/PNG files go through :func:`load_audio` /
:func:`load_image`; random CSV/JSON/JSONL index files go through the Clotho, COCO and manifest
readers. Each either returns a result or raises :class:`mmtf.data.DataError`; any other exception
fails. Last, a small Clotho set with broken files completes setup and a train epoch under
``on_error=skip`` with the problems counted.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mmtf.data import CaptionDataModule, DataError, load_audio, load_image
from mmtf.data.errors import ErrorPolicy
from mmtf.data.formats.clotho import read_clotho
from mmtf.data.formats.coco import read_coco
from mmtf.data.formats.manifest import read_manifest
from mmtf.text import BPETokenizer
from tests.unit.presets import flat

EXAMPLES = Counter()  # examples run per kind, checked by _run_fuzz
FUZZ = settings(max_examples=50, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def _valid_bytes(kind: str) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    if kind in ("WAV", "FLAC"):
        sf.write(buf, rng.normal(0, 0.1, (4000, 2)).astype(np.float32), 8000, format=kind)
    else:
        Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


VALID = {kind: _valid_bytes(kind) for kind in ("WAV", "FLAC", "PNG")}


def _run_fuzz(fuzz, kind: str, tmp_path: Path) -> None:
    """Run one hypothesis fuzzer and check it really tried its examples."""
    before = EXAMPLES[kind]
    fuzz(tmp_path=tmp_path)
    ran = EXAMPLES[kind] - before
    print(f"\nfuzz {kind}: {ran} examples")
    assert ran >= FUZZ.max_examples * 0.8, ran


def _check_load(load, path: Path) -> None:
    try:
        out = load(path)
    except DataError as err:
        assert path.name in str(err), str(err)
        return
    assert isinstance(out, torch.Tensor) and out.numel() > 0
    assert torch.isfinite(out.float()).all()


def _fuzz_file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / "fuzz" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


@FUZZ
@given(data=st.binary(max_size=2048), ext=st.sampled_from([".wav", ".flac", ".mp3", ".ogg"]))
def _random_bytes_as_audio(tmp_path, data, ext):
    EXAMPLES["audio_random"] += 1
    _check_load(load_audio, _fuzz_file(tmp_path, f"clip{ext}", data))


@FUZZ
@given(kind=st.sampled_from(["WAV", "FLAC"]), cut=st.floats(0, 1), flip=st.integers(0, 10**6))
def _truncated_or_corrupted_audio(tmp_path, kind, cut, flip):
    data = bytearray(VALID[kind][: int(cut * len(VALID[kind]))])
    if data and flip % 3 == 0:  # also flip one byte now and then
        data[flip % len(data)] ^= 0xFF
    EXAMPLES["audio_truncated"] += 1
    _check_load(load_audio, _fuzz_file(tmp_path, f"cut.{kind.lower()}", bytes(data)))


@FUZZ
@given(data=st.binary(max_size=2048) | st.integers(0, len(VALID["PNG"])).map(
    lambda n: VALID["PNG"][:n]), ext=st.sampled_from([".png", ".jpg", ".bmp"]))
def _random_or_truncated_images(tmp_path, data, ext):
    EXAMPLES["image"] += 1
    _check_load(load_image, _fuzz_file(tmp_path, f"img{ext}", data))


def test_valid_files_do_load(tmp_path):
    """The fuzz baseline is loadable, so truncation is what makes the errors."""
    assert load_audio(_fuzz_file(tmp_path, "a.wav", VALID["WAV"]), sample_rate=None).shape == (4000,)
    assert load_audio(_fuzz_file(tmp_path, "a.flac", VALID["FLAC"]), sample_rate=None).shape == (4000,)
    assert load_image(_fuzz_file(tmp_path, "a.png", VALID["PNG"])).shape == (3, 12, 10)


# Text with the characters CSV and JSON quoting care about.
TEXT = st.text(st.sampled_from(list('ab ,"\n\r\'\\{}[]:é\x00')), max_size=12)


def _read(reader, root: Path, **kw):
    """Run a reader with on_error=raise: a list of items or a DataError, nothing else."""
    try:
        items = reader(root, "train", report=ErrorPolicy("raise"), **kw)
    except DataError:
        return None
    assert isinstance(items, list)
    return items


@FUZZ
@given(header=st.lists(st.sampled_from(["file_name", "caption_1", "caption_2", "x", ""]),
                       max_size=4),
       rows=st.lists(st.lists(TEXT, max_size=4), max_size=4), quote=st.booleans())
def _random_clotho_csv(tmp_path, header, rows, quote):
    root = tmp_path / "fuzz_clotho"
    (root / "development").mkdir(parents=True, exist_ok=True)
    (root / "development" / "a.wav").write_bytes(VALID["WAV"])
    cells = [header, *rows]
    if quote:
        text = "\n".join(",".join('"' + c.replace('"', '""') + '"' for c in r) for r in cells)
    else:
        text = "\n".join(",".join(r) for r in cells)
    (root / "clotho_captions_development.csv").write_text(text, encoding="utf-8")
    EXAMPLES["clotho_csv"] += 1
    _read(read_clotho, root)


JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | TEXT,
                          lambda kids: st.lists(kids, max_size=3)
                          | st.dictionaries(st.sampled_from(["id", "image_id", "file_name",
                                                             "caption", "audio", "image", "path"]),
                                            kids, max_size=4), max_leaves=8)


@FUZZ
@given(doc=st.dictionaries(st.sampled_from(["images", "annotations", "x"]), JSON_VALUE,
                           max_size=3) | JSON_VALUE, raw=st.none() | TEXT)
def _random_coco_json(tmp_path, doc, raw):
    root = tmp_path / "fuzz_coco"
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "train").mkdir(exist_ok=True)
    (root / "train" / "a.png").write_bytes(VALID["PNG"])
    text = json.dumps(doc) if raw is None else raw
    (root / "annotations" / "captions_train.json").write_text(text, encoding="utf-8")
    EXAMPLES["coco_json"] += 1
    _read(read_coco, root)


@FUZZ
@given(lines=st.lists(JSON_VALUE.map(json.dumps) | TEXT, max_size=4),
       modality=st.sampled_from(["audio", "image"]))
def _random_manifest_jsonl(tmp_path, lines, modality):
    root = tmp_path / "fuzz_manifest"
    root.mkdir(exist_ok=True)
    (root / "a.wav").write_bytes(VALID["WAV"])
    (root / "train.jsonl").write_text("\n".join(lines), encoding="utf-8")
    EXAMPLES["manifest_jsonl"] += 1
    _read(read_manifest, root, modality=modality)


@pytest.mark.timeout(120)
def test_random_bytes_as_audio(tmp_path):
    _run_fuzz(_random_bytes_as_audio, "audio_random", tmp_path)

@pytest.mark.timeout(120)
def test_truncated_or_corrupted_audio(tmp_path):
    _run_fuzz(_truncated_or_corrupted_audio, "audio_truncated", tmp_path)

@pytest.mark.timeout(120)
def test_random_or_truncated_images(tmp_path):
    _run_fuzz(_random_or_truncated_images, "image", tmp_path)

@pytest.mark.timeout(120)
def test_random_clotho_csv(tmp_path):
    _run_fuzz(_random_clotho_csv, "clotho_csv", tmp_path)

@pytest.mark.timeout(120)
def test_random_coco_json(tmp_path):
    _run_fuzz(_random_coco_json, "coco_json", tmp_path)

@pytest.mark.timeout(120)
def test_random_manifest_jsonl(tmp_path):
    _run_fuzz(_random_manifest_jsonl, "manifest_jsonl", tmp_path)

def _clotho_set(root: Path, broken: dict[str, bytes]) -> None:
    rng = np.random.default_rng(1)
    for split, name in (("train", "development"), ("val", "validation"),
                        ("test", "evaluation")):
        (root / name).mkdir(parents=True)
        rows = ["file_name," + ",".join(f"caption_{k}" for k in range(1, 6))]
        for i in range(6):
            clip = f"{split}{i}.wav"
            sf.write(root / name / clip, rng.normal(0, 0.1, 8000).astype(np.float32), 16000)
            rows.append(clip + "," + ",".join(f'"a dog barks, {k}"' for k in range(5)))
        if split == "train":
            for clip, data in broken.items():
                (root / name / clip).write_bytes(data)
                rows.append(clip + "," + ",".join(["a cat meows"] * 5))
            rows.append("gone.wav," + ",".join(["missing file"] * 5))
        (root / f"clotho_captions_{name}.csv").write_text("\n".join(rows) + "\n")


def test_skip_policy_completes_an_epoch_and_counts_the_broken_files(tmp_path):
    broken = {"random.wav": bytes(range(256)) * 4, "cut.wav": VALID["WAV"][:100],
              "empty.wav": b"", "cut.flac": VALID["FLAC"][:300]}
    root = tmp_path / "clotho"
    _clotho_set(root, broken)
    dm = flat(CaptionDataModule, format="clotho", root=str(root), batch_size=2, max_seconds=1.0,
                           seed=0, on_error="skip")
    dm.setup("fit")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=120))
    ids = [i for batch in dm.train_dataloader() for i in batch["ids"]]
    # Every good clip is seen; no broken one (a skipped slot may be refilled by a good clip).
    assert {Path(i).stem for i in ids} == {f"train{i}" for i in range(6)}
    # The 4 broken files and the missing one are all counted, none silently.
    assert dm.error_counts.total == 5, dm.error_counts.summary()
    assert dm.error_counts.as_dict() == {"undecodable": 2, "truncated": 1, "empty_file": 1,
                                         "missing_file": 1}
    with pytest.raises(DataError, match=r"(random|cut|empty)\.(wav|flac)|gone\.wav"):
        strict = flat(CaptionDataModule, format="clotho", root=str(root), batch_size=2,
                                   max_seconds=1.0)
        strict.setup("fit")
        strict.connect(BPETokenizer.train(strict.train_captions(), vocab_size=120))
        for _ in strict.train_dataloader():
            pass

