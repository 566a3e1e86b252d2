"""The synthetic-set cache (config hash, atomic install, races) and event-sequence accuracy."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from mmtf.errors import DataError
from mmtf.synthetic import ensure_synthetic
from mmtf.synthetic.cache import MARKER, config_hash

KW = dict(num_train=3, num_val=1, num_test=1, min_seconds=1.0, max_seconds=1.2)


def _snapshot(root):
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_generated_once_and_reused(tmp_path):
    root = ensure_synthetic(tmp_path / "set", "audio_captions", **KW)
    meta = json.loads((root / MARKER).read_text())
    assert meta["hash"] == config_hash("audio_captions", KW) and meta["kind"] == "audio_captions"
    assert meta["params"]["captions_per_clip"] == 5  # defaults are recorded too
    before = _snapshot(root)
    assert ensure_synthetic(tmp_path / "set", "audio_captions", **KW, num_workers=1) == root
    assert _snapshot(root) == before          # num_workers does not change the output


def test_changed_config_regenerates(tmp_path):
    root = ensure_synthetic(tmp_path / "set", "audio_captions", **KW)
    first = (root / "clotho_captions_development.csv").read_text()
    ensure_synthetic(tmp_path / "set", "audio_captions", **{**KW, "seed": 1})
    assert (root / "clotho_captions_development.csv").read_text() != first
    assert json.loads((root / MARKER).read_text())["params"]["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]  # no temp or old folders left


def test_defaults_spelled_out_hash_the_same():
    explicit = {**KW, "seed": 0, "min_events": 1, "snr_db": [10.0, 30.0]}
    assert config_hash("audio_captions", KW) == config_hash("audio_captions", explicit)
    assert config_hash("audio_captions", KW) != config_hash("audio_captions", {**KW, "seed": 1})
    with pytest.raises(ValueError, match=r"data\.synthetic: \['num_clips'\] not understood by "
                                         r"the 'audio_captions' generator"):
        config_hash("audio_captions", {"num_clips": 3})


def test_foreign_folder_is_never_overwritten(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(DataError, match=r"mine: holds files but no \.mmtf_synthetic\.json"):
        ensure_synthetic(tmp_path / "mine", "audio_captions", **KW)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_unknown_kind():
    with pytest.raises(ValueError, match=r"synthetic kind \('video'\) must be one of"):
        ensure_synthetic("/nonexistent", "video")


def _race(root: str, queue) -> None:
    try:
        ensure_synthetic(root, "image_captions", num_train=40, num_val=2, num_test=2,
                         image_size=32, num_workers=1)
        queue.put("ok")
    except Exception as e:  # pragma: no cover - reported to the parent
        queue.put(repr(e))


def test_racing_processes_both_succeed(tmp_path):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path / "set"), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [queue.get(timeout=5) for _ in procs] == ["ok"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]
    assert len(list((tmp_path / "set" / "train").glob("*.png"))) == 40
    assert json.loads((tmp_path / "set" / MARKER).read_text())["kind"] == "image_captions"

