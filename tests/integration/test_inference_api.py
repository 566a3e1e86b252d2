"""Long audio in predict/evaluate, the notebook API (mmtf.load + caption) against predict, and
use_ema of evaluate, load and export."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hydra import compose, initialize_config_dir

import mmtf
from mmtf.errors import UserError
from mmtf.predict import predict, print_predictions

from .conftest import AUDIO_CAPTIONER_MAX_SECONDS, CONF, cli_in_process, evaluate_in_process

LIMIT = AUDIO_CAPTIONER_MAX_SECONDS   # of the checkpoint; the synthetic clips are 1-1.5 s
RATE = 16000


@pytest.fixture
def ckpt(audio_captioner) -> Path:
    """The session's tiny audio captioner (conftest.py): encoder limit LIMIT, crop.eval=start."""
    return audio_captioner.ckpt


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """A 3 s clip, its first LIMIT seconds, and its three 1 s windows, as exact float WAVs."""
    folder = tmp_path_factory.mktemp("clips")
    rng = np.random.default_rng(0)
    wave = (rng.normal(0, 0.1, 3 * RATE) * np.sin(np.linspace(0, 40, 3 * RATE))).astype(np.float32)
    parts = {"long": wave, "head": wave[: int(LIMIT * RATE)],
             **{f"w{i}": wave[i * RATE:(i + 1) * RATE] for i in range(3)}}
    for name, part in parts.items():
        sf.write(folder / f"{name}.wav", part, RATE, subtype="FLOAT")
    return {name: folder / f"{name}.wav" for name in parts}


def test_predict_crops_long_audio_with_a_warning(ckpt, clips, caplog):
    with caplog.at_level(logging.WARNING, logger="mmtf.data.inputs"):
        (row,) = predict(str(ckpt), [str(clips["long"])])
    (head,) = predict(str(ckpt), [str(clips["head"])])
    assert row["caption"] == head["caption"] and "start" not in row
    (message,) = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert str(clips["long"]) in message and "3.00 s" in message and f"({LIMIT:g} s)" in message


def test_predict_windows_caption_every_window_with_its_span(ckpt, clips):
    rows = predict(str(ckpt), [str(clips["long"])], long_audio="window")
    windows = predict(str(ckpt), [str(clips[f"w{i}"]) for i in range(3)])
    assert [(r["start"], r["end"]) for r in rows] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert [r["caption"] for r in rows] == [w["caption"] for w in windows]
    assert {r["path"] for r in rows} == {str(clips["long"])}


def test_predict_cli_prints_window_spans(ckpt, clips, tmp_path):
    out = cli_in_process("mmtf.predict", [f"ckpt_path={ckpt}", f"inputs=[{clips['long']}]",
                                          "long_audio=window", f"hydra.run.dir={tmp_path / 'p'}"],
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split("\t") for line in out.stdout.splitlines() if line.startswith("/")]
    assert [line[1] for line in lines] == ["0.00-1.00", "1.00-2.00", "2.00-3.00"]


def test_evaluate_crops_clips_longer_than_the_encoder_accepts(ckpt, tmp_path, caplog):
    """data.crop.eval=full used to pass clips over the encoder's limit (an error mid-test)."""
    with caplog.at_level(logging.WARNING, logger="mmtf.evaluate"):
        full = evaluate_in_process(ckpt, tmp_path / "full", "+data.crop.eval=full")
    assert any("longer than model.encoder.max_seconds" in r.getMessage() for r in caplog.records)
    cropped = evaluate_in_process(ckpt, tmp_path / "start", "+data.crop.eval=start")
    assert full == cropped
    rows = (tmp_path / "full" / "predictions.jsonl").read_text().splitlines()
    assert rows == (tmp_path / "start" / "predictions.jsonl").read_text().splitlines()


def test_notebook_api_captions_equal_predict(ckpt, clips):
    files = [clips["head"], clips["w1"], clips["long"]]
    model, tokenizer = mmtf.load(ckpt)
    expected = [r["caption"] for r in predict(str(ckpt), [str(p) for p in files])]
    assert model.caption(files) == expected
    assert tokenizer is model.tokenizer and not model.training
    # In-memory waveforms: at the encoder's rate, or with their own rate (resampled).
    waves = [torch.from_numpy(sf.read(p, dtype="float32")[0]) for p in files]
    assert model.caption(waves) == expected
    # Generation options for one call, then the checkpoint's again.
    before = dict(model.generation)
    beam = [r["caption"] for r in predict(str(ckpt), [str(p) for p in files],
                                          {"strategy": "beam", "num_beams": 3})]
    assert model.caption(files, strategy="beam", num_beams=3) == beam
    assert model.generation == before


def test_repeat_penalties_reach_generation_from_predict_andevaluate_in_process(ckpt, clips, tmp_path,
                                                                     capsys):
    files = [clips["head"], clips["w0"], clips["w2"]]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("predict", overrides=[
            f"ckpt_path={ckpt}", "accelerator=cpu", f"inputs=[{','.join(map(str, files))}]",
            "generation.repetition_penalty=1.5", "generation.no_repeat_ngram_size=1"])
    print_predictions(cfg)
    printed = [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()]
    model, tokenizer = mmtf.load(ckpt)
    gen = model.model.generate(*_batch(files), **{**model.generation, "repetition_penalty": 1.5,
                                                   "no_repeat_ngram_size": 1})
    for row, length in zip(gen.tokens.tolist(), gen.lengths.tolist()):
        assert len(set(row[:length])) == length                   # no token twice
    assert printed == tokenizer.decode_batch(gen.tokens.tolist())
    plain = evaluate_in_process(ckpt, tmp_path / "plain")
    banned = evaluate_in_process(ckpt, tmp_path / "banned", "generation.no_repeat_ngram_size=1")
    assert plain != banned
    with pytest.raises(UserError, match=r"repetition_penalty \(0.0\) must be > 0"):
        evaluate_in_process(ckpt, tmp_path / "bad", "generation.repetition_penalty=0.0")


def _batch(files: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """Clips padded by hand, (b, samples), and their lengths."""
    waves = [torch.from_numpy(sf.read(p, dtype="float32")[0]) for p in files]
    lengths = torch.tensor([len(w) for w in waves])
    x = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        x[i, : len(w)] = w
    return x, lengths


def test_use_ema_changes_what_evaluate_load_and_export_see(ckpt, tmp_path):
    """A copy of the checkpoint given an ``ema_state_dict`` (the trained weights plus noise, as
    callbacks=ema writes it beside state_dict): use_ema=true reads it everywhere, use_ema=false
    (the default) the trained weights; without one, use_ema=true is a one-line error."""
    from mmtf.checkpoint_io import EMA_STATE_KEY, atomic_torch_save, load_checkpoint
    from mmtf.export import export_part, load_exported

    checkpoint = load_checkpoint(ckpt)
    params = {k for k, _ in mmtf.load(ckpt)[0].named_parameters(remove_duplicate=False)}
    g = torch.Generator().manual_seed(0)   # the parameters averaged, the buffers the model's
    average = {k: v + 0.5 * torch.randn(v.shape, generator=g) if k in params else v
               for k, v in checkpoint["state_dict"].items()}
    with_ema = tmp_path / "ema.ckpt"
    atomic_torch_save({**checkpoint, EMA_STATE_KEY: average}, with_ema)
    name = "model.encoder.stack.blocks.0.mlp.fc_in.weight"

    trained, _ = mmtf.load(with_ema)
    averaged, _ = mmtf.load(with_ema, use_ema=True)
    assert torch.equal(trained.state_dict()[name], checkpoint["state_dict"][name])
    assert torch.equal(averaged.state_dict()[name], average[name])

    export_part(with_ema, "encoder", tmp_path / "enc", use_ema=True)
    exported = load_exported(tmp_path / "enc").state_dict()["stack.blocks.0.mlp.fc_in.weight"]
    assert torch.equal(exported, average[name])

    evaluate_in_process(with_ema, tmp_path / "plain")
    evaluate_in_process(with_ema, tmp_path / "ema", "use_ema=true")
    plain = (tmp_path / "plain" / "predictions.jsonl").read_text()
    assert (tmp_path / "ema" / "predictions.jsonl").read_text() != plain

    out = cli_in_process("mmtf.evaluate", [f"ckpt_path={ckpt}", "use_ema=true",
                                           "accelerator=cpu", f"hydra.run.dir={tmp_path / 'x'}"],
                         cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})     # the one-line form
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"mmtf: error: CheckpointError: checkpoint {ckpt} holds no EMA weights (ema_state_dict): "
        f"train with callbacks=ema (the average is saved from callbacks.ema.start_step on), or "
        f"set use_ema=false.")
