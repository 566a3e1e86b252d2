"""`python -m mmtf.inspect` on tiny audio and image checkpoints, and the per-epoch attention
figure callback in a real `python -m mmtf.train` run."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.image
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mmtf.checkpoint_io import load_checkpoint

from .conftest import NO_FIGURE, cli_in_process, run_cli, tiny_overrides


def _train(data_dir: Path, run_dir: Path, experiment: str, *extra: str) -> Path:
    """A tiny run as the default config makes it: TensorBoard logger, the attention figure
    callback on (conf/callbacks/default.yaml) unless ``extra`` turns it off."""
    base = [o if o != "logger=csv" else "logger=default"
            for o in tiny_overrides(experiment, data_dir, "test=false") if o != NO_FIGURE]
    overrides = [*base, *extra]
    out = cli_in_process("mmtf.train", [*overrides, f"hydra.run.dir={run_dir}"],
                         cwd=run_dir.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def audio_runs(data_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The same tiny audio captioning run with and without the attention figure callback: two
    epochs, so the second epoch's SpecAugment masks would show any random number the callback
    drew at the end of the first. ResumeState is off: it restores the generators after every
    validation and would hide such a draw."""
    work = tmp_path_factory.mktemp("inspect_audio")
    common = ("trainer.max_epochs=2", "callbacks.resume_state=null")
    return (_train(data_dir, work / "with", "audio_captioning", *common),
            _train(data_dir, work / "without", "audio_captioning", *common, NO_FIGURE))


def _first_val_clip(data_dir: Path) -> Path:
    root = data_dir / "synth_audio_captions"
    with open(root / "clotho_captions_validation.csv", newline="") as f:
        return root / "validation" / next(csv.DictReader(f))["file_name"]


@pytest.mark.slow
@pytest.mark.timeout(900)      # the fixture trains two runs before this first test
def test_callback_logs_a_figure_per_epoch_and_changes_no_weight(audio_runs):
    with_cb, without = audio_runs
    for epoch in (0, 1):
        image = matplotlib.image.imread(with_cb / "samples" / f"val_attention_epoch{epoch:03d}.png")
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 600
    events = EventAccumulator(str(next((with_cb / "tensorboard").rglob("events.out.*")).parent),
                              size_guidance={"images": 0})
    events.Reload()
    assert len(events.Images("val/attention")) == 2
    a = load_checkpoint(with_cb / "checkpoints" / "last.ckpt")["state_dict"]
    b = load_checkpoint(without / "checkpoints" / "last.ckpt")["state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert not (without / "samples" / "val_attention_epoch000.png").exists()


@pytest.mark.slow
def test_inspect_cli_writes_audio_figures_and_a_word_table(audio_runs, data_dir, tmp_path):
    ckpt = audio_runs[1] / "checkpoints" / "last.ckpt"
    clip = _first_val_clip(data_dir)
    out = run_cli("mmtf.inspect", [f"ckpt_path={ckpt}", f"input={clip}", f"out={tmp_path}",
                                   "name=clip", "encoder_self=[1]", "decoder_self=[0,2]",
                                   f"hydra.run.dir={tmp_path / 'h'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "caption: " in out.stdout and "word" in out.stdout and "start s" in out.stdout
    for figure in ("cross", "alignment", "encoder_self", "decoder_self"):
        assert matplotlib.image.imread(tmp_path / f"clip_{figure}.png").shape[-1] in (3, 4)
    rows = (tmp_path / "clip_words.tsv").read_text().splitlines()
    assert rows[0] == "word\tstart_s\tend_s"
    starts = [float(r.split("\t")[1]) for r in rows[1:]]
    ends = [float(r.split("\t")[2]) for r in rows[1:]]
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))


@pytest.mark.slow
def test_inspect_cli_scores_event_overlap_on_the_synthetic_set(audio_runs, tmp_path):
    ckpt = audio_runs[1] / "checkpoints" / "last.ckpt"
    out = cli_in_process("mmtf.inspect", [f"ckpt_path={ckpt}", "synthetic_split=val",
                                          "num_clips=2", f"hydra.run.dir={tmp_path / 'h'}"],
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 clips;" in out.stdout


def test_inspect_cli_overlays_attention_on_an_image(image_captioner, tmp_path):
    images = sorted((image_captioner.data_dir / "synth_image_captions").rglob("*.png"))
    assert images
    out = cli_in_process("mmtf.inspect", [f"ckpt_path={image_captioner.ckpt}",
                                          f"input={images[0]}", f"out={tmp_path / 'o'}",
                                          "name=img", "layers=[-1]", "head=0",
                                          f"hydra.run.dir={tmp_path / 'h'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["img_cross_layer1.png"]


def test_inspect_cli_needs_one_input(tmp_path):
    out = cli_in_process("mmtf.inspect", ["ckpt_path=x.ckpt", f"hydra.run.dir={tmp_path / 'h'}"],
                         cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})   # the one-line form
    assert out.returncode == 2
    assert "give exactly one of input=<audio or image file> and synthetic_split" in out.stderr
