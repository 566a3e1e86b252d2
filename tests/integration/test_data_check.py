"""`python -m mmtf.data.check` as a user runs it: a clean set passes, a broken one lists every
problem (file, index line, reason) and exits 1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mmtf.synthetic import ensure_synthetic
from tests.unit.data.conftest import TINY_AUDIO

from .conftest import cli_in_process

REPO = Path(__file__).resolve().parents[2]


def _check(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mmtf.data.check", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def clotho(tmp_path_factory) -> Path:
    return ensure_synthetic(tmp_path_factory.mktemp("chk") / "clotho", "audio_captions",
                            **TINY_AUDIO)


@pytest.mark.slow  # a fresh interpreter imports torch + lightning: 5-50 s on a shared 2-core box
def test_clean_dataset_passes(clotho, tmp_path):
    res = _check(["data=clotho", f"data.root={clotho}"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "train        6        30" in out and "val          3        15" in out
    assert "Duration histogram" in out and "Vocabulary:" in out and "Tokenizer (bpe):" in out
    assert "OK: no problems found" in out
    assert list(tmp_path.iterdir()) == []  # a check writes nothing


@pytest.mark.slow
def test_broken_dataset_lists_every_problem(clotho, tmp_path):
    root = tmp_path / "broken"
    shutil.copytree(clotho, root)
    files = sorted((root / "development").glob("*.wav"))
    files[0].write_bytes(np.random.default_rng(0).bytes(3000))
    files[1].unlink()
    x = np.full(8000, 0.1, dtype=np.float32)
    x[7] = np.inf
    sf.write(str(files[2]), x, 16000, subtype="FLOAT")
    (root / "validation" / "synth_validation_00000.wav").write_bytes(b"")
    csv = root / "clotho_captions_development.csv"
    lines = csv.read_text().splitlines()
    lines[4] = lines[4].split(",")[0] + ",,a,b,c,d"
    csv.write_text("\n".join(lines) + "\n")
    res = cli_in_process("mmtf.data.check", ["data=clotho", f"data.root={root}",
                                             "data.max_caption_tokens=12"], tmp_path)
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    assert f"[undecodable] {files[0]} (clotho_captions_development.csv line 2)" in out
    assert f"[missing_file] {files[1]} (clotho_captions_development.csv line 3)" in out
    assert f"[non_finite] {files[2]} (clotho_captions_development.csv line 4)" in out
    assert "[empty_caption]" in out and "(line 5): caption_1 is empty" in out
    assert "[empty_file]" in out and "synth_validation_00000.wav" in out
    assert "[caption_truncated]" in out
    assert "FAILED:" in out and "undecodable=1" in out and "missing_file=1" in out


def _run_in_process(overrides: list[str], capsys) -> tuple[int, str]:
    """The same check without Hydra's main (the console path is tested above)."""
    from hydra import compose, initialize_config_dir

    from mmtf.data.check import run_check

    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("data_check", overrides=overrides)
    n = run_check(cfg)
    return n, capsys.readouterr().out


def test_built_in_default_is_generated_and_checked(tmp_path, capsys):
    sizes = [f"data.synthetic.{k}={v}" for k, v in TINY_AUDIO.items()]
    n, out = _run_in_process([f"paths.data_dir={tmp_path}", *sizes], capsys)
    assert n == 0 and "OK: no problems found" in out
    assert (tmp_path / "synth_audio_captions" / ".mmtf_synthetic.json").is_file()


def test_unreadable_images_and_missing_columns(tmp_path, capsys):
    root = tmp_path / "imgs"
    for split in ("train", "val"):
        (root / split / "cat").mkdir(parents=True)
        (root / split / "cat" / "bad.png").write_bytes(b"not a png at all")
    n, out = _run_in_process(["data=image_folder", f"data.root={root}", "splits=[train,val]"],
                             capsys)
    assert n == 2 and "[unreadable_image]" in out and "bad.png" in out
    assert "Classes (1): cat=2" in out
    esc = tmp_path / "esc"
    (esc / "meta").mkdir(parents=True)
    (esc / "meta" / "esc50.csv").write_text("filename,target\na.wav,0\n")
    n, out = _run_in_process(["data=esc50", f"data.root={esc}"], capsys)
    assert n == 1  # one broken file, reported once although three splits read it
    assert "[missing_columns]" in out and "['fold', 'category']" in out


def test_built_in_questions_are_checked_and_a_bad_line_named(tmp_path, capsys):
    sizes = [f"data.synthetic.{k}={v}" for k, v in TINY_AUDIO.items()]
    n, out = _run_in_process(["data=synth_audio_qa", f"paths.data_dir={tmp_path}", *sizes],
                             capsys)
    assert n == 0 and "OK: no problems found" in out, out
    assert "val          " in out and "Question types: " in out and "right letters: A=" in out
    # The same files as a user's own set, one answer broken.
    root = tmp_path / "synth_audio_qa"
    lines = (root / "val.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"answer": "', '"answer": "not an option ')
    (root / "val.jsonl").write_text("\n".join(lines) + "\n")
    n, out = _run_in_process(["data=synth_audio_qa", "data._target_=mmtf.data.QADataModule",
                              "~data.synthetic", f"data.root={root}"], capsys)
    assert n == 1 and "[bad_row]" in out
    assert f"{root / 'val.jsonl'} (line 2): 'answer' ('not an option " in out
