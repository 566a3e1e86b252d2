"""The CLIs as a user runs them: train, evaluate, predict, export, multirun, DDP on CPU."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image

import mmtf
from mmtf.checkpoint_io import load_checkpoint
from mmtf.data.audio import AUDIO_EXTENSIONS
from mmtf.data.image import IMAGE_EXTENSIONS
from mmtf.errors import UserError
from mmtf.evaluate import build_datamodule
from mmtf.export import export_part, load_exported
from mmtf.metrics import caption_metrics, event_sequence_accuracy
from mmtf.predict import expand_inputs, predict, print_predictions
from mmtf.synthetic import audio as synthetic_audio
from mmtf.synthetic import image as synthetic_image
from mmtf.tasks import CaptioningTask
from mmtf.tasks.rebuild import build_task
from mmtf.text import load_tokenizer
from mmtf.train import train

from .conftest import (
    CONF,
    cli_in_process,
    compose_train,
    evaluate_in_process,
    run_cli,
    tiny_overrides,
)

USER_ERRORS = {"HYDRA_FULL_ERROR": "0"}   # run_cli's default (1) shows every traceback


def _tiny(data_dir: Path, *extra: str) -> list[str]:
    return tiny_overrides("audio_captioning", data_dir, *extra)


@pytest.fixture
def tiny_run(audio_captioner) -> Path:
    """The session's real `python -m mmtf.train` run (conftest.py), whose checkpoint the other
    CLI tests use."""
    return audio_captioner.run_dir


def test_train_cli_writes_a_complete_run_dir(tiny_run):
    assert (tiny_run / "config.yaml").is_file() and (tiny_run / ".hydra").is_dir()
    assert (tiny_run / "checkpoints" / "last.ckpt").is_file()
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    for key in ("test/loss", "test/cider_d", "test/bleu_4", "test/event_accuracy", "val/loss"):
        assert key in metrics, sorted(metrics)
    assert list((tiny_run / "samples").glob("val_epoch*.md"))
    assert (tiny_run / "samples" / "val_attention_epoch000.png").is_file()
    assert (tiny_run / "csv" / "metrics.csv").is_file()
    assert list((tiny_run / "tensorboard").glob("events.out.tfevents.*"))
    checkpoint = load_checkpoint(tiny_run / "checkpoints" / "last.ckpt")
    assert checkpoint["mmtf"]["tokenizer"] and checkpoint["mmtf"]["config"]["model"]


def _recomputed(rows: list[dict], parser) -> dict[str, float]:
    """The caption metrics and event accuracy of predictions.jsonl rows, from scratch."""
    predictions = [r["prediction"] for r in rows]
    references = [r["references"] for r in rows]
    scores = dict(caption_metrics(predictions, references, metrics=["bleu", "rouge_l", "cider_d"]))
    scores["event_accuracy"] = event_sequence_accuracy(predictions, references, parser)
    return {f"test/{k}": v for k, v in scores.items()}


def test_evaluate_cli_metrics_equal_a_recomputation_from_its_predictions(tiny_run, tmp_path):
    out_dir = tmp_path / "eval"
    # In the worker: evaluate's real interpreters are the compiled-decoding and user-error tests.
    out = cli_in_process("mmtf.evaluate", [f"ckpt_path={tiny_run / 'checkpoints' / 'last.ckpt'}",
                                           f"hydra.run.dir={out_dir}", "generation.strategy=beam",
                                           "generation.num_beams=2"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    rows = [json.loads(line) for line in (out_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["references"]) == 5 for r in rows)
    assert len({r["id"] for r in rows}) == 4
    expected = _recomputed(rows, synthetic_audio.parse_caption)
    assert set(expected) <= set(metrics)
    for key, value in expected.items():      # logged as float32 by Lightning
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


@pytest.mark.slow
def test_evaluate_cli_compiled_decoding_gives_the_eager_predictions(tiny_run, tmp_path):
    predictions = {}
    for compiled in ("false", "true"):
        out_dir = tmp_path / f"eval_{compiled}"
        # Eager in the worker (no interpreter start); compiled in its own interpreter: inductor
        # must not run in the worker (tests/unit/decoders/test_compiled_generation.py says why),
        # and in a forked child of the worker it hangs on a lock.
        run = run_cli if compiled == "true" else cli_in_process
        out = run("mmtf.evaluate", [f"ckpt_path={tiny_run / 'checkpoints' / 'last.ckpt'}",
                                    f"hydra.run.dir={out_dir}", "generation.strategy=greedy",
                                    f"generation.compile={compiled}"], cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = (out_dir / "predictions.jsonl").read_text().splitlines()
        predictions[compiled] = [json.loads(line)["prediction"] for line in rows]
    assert len(predictions["true"]) == 4
    assert predictions["true"] == predictions["false"]


def test_predict_cli_captions_files_and_folders(tiny_run, tmp_path):
    folder = tmp_path / "clips"
    folder.mkdir()
    rng = np.random.default_rng(0)
    sf.write(folder / "a.wav", rng.normal(0, 0.1, 16000).astype(np.float32), 16000)
    sf.write(folder / "b.flac", rng.normal(0, 0.1, (22050, 2)).astype(np.float32), 22050)
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    out = run_cli("mmtf.predict", [f"ckpt_path={ckpt}", f"inputs=[{folder / 'a.wav'},{folder}]",
                                   "format=json", f"hydra.run.dir={tmp_path / 'p'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [Path(r["path"]).name for r in rows] == ["a.wav", "a.wav", "b.flac"]
    assert all(isinstance(r["caption"], str) for r in rows)


def test_predict_captions_equal_generate_on_the_same_checkpoint_and_inputs(tiny_run, tmp_path):
    rng = np.random.default_rng(1)
    clips = [rng.normal(0, 0.1, n).astype(np.float32) for n in (16000, 9600)]
    paths = [tmp_path / "a.wav", tmp_path / "b.wav"]
    for path, clip in zip(paths, clips):
        sf.write(path, clip, 16000, subtype="FLOAT")       # 16 kHz float: read back exactly
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    rows = predict(str(ckpt), [str(p) for p in paths])
    task, _ = build_task(load_checkpoint(ckpt), ckpt)
    task.eval()
    wave = torch.zeros(2, 16000)                          # padded by hand, (b, samples)
    for i, clip in enumerate(clips):
        wave[i, : len(clip)] = torch.from_numpy(clip)
    with torch.no_grad():
        gen = task.model.generate(wave, torch.tensor([16000, 9600]), **task.generation)
    assert (gen.tokens > 3).any()                         # real words, not only specials
    assert [r["path"] for r in rows] == [str(p) for p in paths]
    assert [r["caption"] for r in rows] == task.tokenizer.decode_batch(gen.tokens.tolist())


def test_predict_takes_every_file_the_loaders_take(tmp_path):
    for name in ("a.aiff", "b.WAV", "c.opus", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    found = expand_inputs([str(tmp_path)], AUDIO_EXTENSIONS)
    assert [p.name for p in found] == ["a.aiff", "b.WAV", "c.opus"]
    with pytest.raises(UserError, match=r"input \S+missing.wav does not exist; pass files or "
                                        r"folders of \.aif/"):
        expand_inputs([str(tmp_path / "missing.wav")], AUDIO_EXTENSIONS)
    with pytest.raises(UserError, match=r"inputs: no \S+ files found"):
        expand_inputs([str(tmp_path)], IMAGE_EXTENSIONS)


def test_export_decoder_round_trip_gives_the_same_logits(tiny_run, tmp_path):
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    export_part(ckpt, "decoder", tmp_path / "dec")
    decoder = load_exported(tmp_path / "dec")
    task, _ = build_task(load_checkpoint(ckpt), ckpt)
    assert load_tokenizer(tmp_path / "dec" / "tokenizer.json") == task.tokenizer
    tokens = torch.tensor([[1, 5, 9, 7, 2], [1, 6, 2, 0, 0]])
    memory = torch.randn(2, 7, task.model.decoder.context_dim)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    task.eval()
    decoder.eval()
    with torch.no_grad():
        expected = task.model.decoder(tokens, memory, mask)
        assert torch.equal(decoder(tokens, memory, mask), expected)
    with pytest.raises(ValueError, match=r"part \('head'\) must be one of \('encoder', "
                                         r"'decoder', 'text_encoder'\)"):
        export_part(ckpt, "head", tmp_path / "x")


def test_exported_encoder_gives_identical_features_in_a_classifier(tiny_run, data_dir, tmp_path):
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    out = run_cli("mmtf.export", [f"ckpt_path={ckpt}", "part=encoder", f"out={tmp_path / 'enc'}",
                                  f"hydra.run.dir={tmp_path / 'x'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "enc" / "weights.safetensors").is_file()
    captioner, _ = build_task(load_checkpoint(ckpt), ckpt)
    cfg = compose_train(tiny_overrides("audio_classification", data_dir,
                                       f"model.encoder.pretrained={tmp_path / 'enc'}",
                                       "model.encoder.freeze=true"), tmp_path)
    classifier = instantiate(cfg.model)
    assert not any(p.requires_grad for p in classifier.encoder.parameters())
    wave, lengths = torch.randn(2, 16000) * 0.1, torch.tensor([16000, 9000])
    captioner.eval()
    expected = captioner.model.encoder(wave, lengths)
    got = classifier.encoder(wave, lengths)
    torch.testing.assert_close(got.memory, expected.memory, rtol=0, atol=0)
    torch.testing.assert_close(classifier.features(wave, lengths),
                               captioner.model.encoder.pool(expected), rtol=0, atol=0)
    standalone = load_exported(tmp_path / "enc", freeze=True)
    torch.testing.assert_close(standalone(wave, lengths).memory, expected.memory, rtol=0, atol=0)


@pytest.mark.slow
def test_multirun_two_jobs_into_one_sweep_dir(data_dir, tmp_path):
    sweep = tmp_path / "sweep"
    out = cli_in_process("mmtf.train", ["-m", *_tiny(data_dir, "test=false"),
                                        "model.decoder.depth=1,2", f"hydra.sweep.dir={sweep}"],
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1"]
    for job, depth in (("0", 1), ("1", 2)):
        assert (sweep / job / "metrics.json").is_file()
        assert f"depth: {depth}" in (sweep / job / "config.yaml").read_text()
    assert not (tmp_path / "outputs").exists()           # nothing written outside the sweep dir


@pytest.mark.slow
def test_ddp_cpu_two_processes_one_run_dir(data_dir, tmp_path):
    """Also: activation checkpointing of both parts and an EMA of the weights under DDP."""
    run_dir = tmp_path / "ddp"
    # As a user starts it (no OMP_NUM_THREADS): the two ranks split the cores between them.
    out = run_cli("mmtf.train", [*_tiny(data_dir), "trainer=ddp_cpu", f"hydra.run.dir={run_dir}",
                                 "model.encoder.activation_checkpointing=true",
                                 "model.decoder.activation_checkpointing=true", "callbacks=ema"],
                  cwd=tmp_path, timeout=600, env={"OMP_NUM_THREADS": None})
    assert out.returncode == 0, out.stderr[-3000:]
    cores = len(os.sched_getaffinity(0))
    ranks = re.findall(r"\[perf\].*?; threads (\d+) \((.*?)\);", out.stderr + out.stdout)
    assert len(ranks) == 2, out.stderr[-3000:]
    # Rank 0 decides the count; rank 1 inherits it through OMP_NUM_THREADS.
    assert [int(n) for n, _ in ranks] == [max(1, cores // 2)] * 2, ranks
    assert (run_dir / "metrics.json").is_file()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert "test/cider_d" in metrics and "val/event_accuracy" in metrics
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1] == "last.ckpt"
    assert not (tmp_path / "outputs").exists()           # no duplicate run dirs from rank 1
    # 12 training clips over 2 ranks x batch 4: 2 steps per epoch on each rank.
    last = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 2 and last["callbacks"]["EMA"]["updates"] == 2
    assert last["ema_state_dict"].keys() == last["state_dict"].keys()


def test_config_errors_are_one_readable_line(data_dir, tmp_path):
    base = _tiny(data_dir, f"hydra.run.dir={tmp_path / 'r'}")
    cases = {
        "model.encoder.dimm=3": ("Could not override 'model.encoder.dimm'", 1),
        "model.generation.max_new_tokens=64": ("max_new_tokens (64) + the prompt (1 token) "
                                               "exceeds model.decoder.max_len (64)", 2),
        "model.encoder.dim=oops": ("'model.encoder.dim' = 'oops' (str) does not fit", 2),
    }
    for override, (message, code) in cases.items():
        out = cli_in_process("mmtf.train", [*base, override], cwd=tmp_path, env=USER_ERRORS)
        assert out.returncode == code, (override, out.returncode, out.stderr[-2000:])
        assert message in out.stderr, (override, out.stderr[-2000:])
        if code == 2:
            assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 3


def test_misspelt_key_inside_an_experiment_yaml_fails_up_front(data_dir, tmp_path):
    conf = tmp_path / "extra_conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - audio_captioning\nmodel:\n  encoder:\n"
        "    n_mel: 16\n")
    overrides = [o if o != "experiment=audio_captioning" else "experiment=typo"
                 for o in _tiny(data_dir)]
    out = cli_in_process("mmtf.train", [*overrides,
                                        f"hydra.searchpath=[file://{tmp_path / 'extra_conf'}]",
                                        f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path,
                         env=USER_ERRORS)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "'model.encoder.n_mel' is not an argument" in out.stderr
    assert "Did you mean 'frontend.n_mels'" in out.stderr   # the key's place since #39
    assert not (data_dir / "nothing").exists()


def test_a_user_error_is_one_line_unless_hydra_full_error(tiny_run, tmp_path):
    args = [f"ckpt_path={tiny_run / 'checkpoints' / 'last.ckpt'}", "split=train",
            f"hydra.run.dir={tmp_path / 'e'}"]
    short = run_cli("mmtf.evaluate", args, cwd=tmp_path, env=USER_ERRORS)   # the console path
    assert short.returncode == 2 and "Traceback" not in short.stderr, short.stderr[-2000:]
    assert short.stderr.strip().splitlines() == [
        "mmtf: error: ConfigError: split ('train') must be one of ('val', 'test'); set "
        "split=test or split=val."]
    full = cli_in_process("mmtf.evaluate", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr
    assert "ConfigError: split ('train')" in full.stderr


def test_evaluate_hands_the_checkpoint_tokenizer_to_the_data(tiny_run, tmp_path, monkeypatch):
    ckpt = tiny_run / "checkpoints" / "last.ckpt"
    same = []
    connect_data = CaptioningTask.connect_data
    monkeypatch.setattr(CaptioningTask, "connect_data", lambda self, dm: (
        same.append(dm.tokenizer is self.tokenizer), connect_data(self, dm)))
    plain = evaluate_in_process(ckpt, tmp_path / "plain")
    assert same == [True]                      # the very object the checkpoint's task holds
    # A checkpoint written while the tokenizer settings lived under data (data.tokenizer,
    # data.tokenizer_path) evaluates too, with its own tokenizer.
    old = load_checkpoint(ckpt)
    old["mmtf"]["config"]["data"].update(tokenizer={"kind": "char"}, tokenizer_path=None)
    torch.save(old, tmp_path / "old.ckpt")
    _, stored = build_task(old, tmp_path / "old.ckpt")
    assert build_datamodule(stored, None).tokenizer is None     # built without those keys
    other = evaluate_in_process(tmp_path / "old.ckpt", tmp_path / "other")
    assert other["test/loss"] == plain["test/loss"]        # the same token ids as targets
    assert ((tmp_path / "other" / "predictions.jsonl").read_text()
            == (tmp_path / "plain" / "predictions.jsonl").read_text())


# ---------------------------------------------------------------- other task and modality
def _train_tiny(experiment: str, data_dir: Path, run_dir: Path) -> Path:
    train(compose_train(tiny_overrides(experiment, data_dir, "test=false"), run_dir))
    return run_dir / "checkpoints" / "last.ckpt"


def test_evaluate_and_predict_a_classification_checkpoint(data_dir, tmp_path, capsys):
    ckpt = _train_tiny("image_classification", data_dir, tmp_path / "run")
    metrics = evaluate_in_process(ckpt, tmp_path / "eval")
    # Recompute the accuracy from the model's logits on the same test loader.
    task, stored = build_task(load_checkpoint(ckpt), ckpt)
    task.eval()
    dm = instantiate(stored["data"])
    dm.setup("test")
    correct = total = 0
    predicted: dict[str, int] = {}
    with torch.no_grad():
        for batch in dm.test_dataloader():
            labels = task(batch["image"]).argmax(-1)
            correct += int((labels == batch["label"]).sum())
            total += len(labels)
            predicted.update(zip(batch["ids"], labels.tolist()))
    assert metrics["test/accuracy"] == pytest.approx(correct / total, abs=1e-6)
    assert not (tmp_path / "eval" / "predictions.jsonl").exists()
    items = dm.items("test")
    rows = predict(str(ckpt), [str(item.path) for item in items])
    assert task.class_names == dm.class_names
    assert [r["label"] for r in rows] == [predicted[item.id] for item in items]
    assert [r["class"] for r in rows] == [dm.class_names[predicted[item.id]] for item in items]
    # The CLI prints the class name, not the index.
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("predict", overrides=[f"ckpt_path={ckpt}", "accelerator=cpu",
                                            f"inputs=[{','.join(str(i.path) for i in items)}]"])
    capsys.readouterr()                                   # drop what training printed
    print_predictions(cfg)
    printed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert printed == [[str(item.path), dm.class_names[predicted[item.id]]] for item in items]
    assert set(dm.class_names) == {"circle", "square", "triangle", "cross"}


def test_evaluate_and_predict_an_image_captioning_checkpoint(image_captioner, tmp_path):
    ckpt = image_captioner.ckpt
    evaluate_in_process(ckpt, tmp_path / "eval")
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    rows = [json.loads(line)
            for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    expected = _recomputed(rows, synthetic_image.parse_caption)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    # predict on the test images gives the captions evaluate generated for them.
    _, stored = build_task(load_checkpoint(ckpt), ckpt)
    dm = instantiate(stored["data"])
    paths = {item.id: str(item.path) for item in dm.items("test")}
    predicted = predict(str(ckpt), [paths[r["id"]] for r in rows])
    assert [p["caption"] for p in predicted] == [r["prediction"] for r in rows]
    # The notebook API on files, PIL images and uint8 tensors: the same captions.
    model, _ = mmtf.load(ckpt)
    files = [paths[r["id"]] for r in rows]
    assert model.caption(files) == [r["prediction"] for r in rows]
    images = [Image.open(f) for f in files]
    assert model.caption(images) == [r["prediction"] for r in rows]
    tensors = [torch.from_numpy(np.asarray(im.convert("RGB"))).permute(2, 0, 1) for im in images]
    assert model.caption(tensors, batch_size=2) == [r["prediction"] for r in rows]
