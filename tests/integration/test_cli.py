"""The CLIs as a user runs them: train, evaluate, predict, export, multirun, DDP on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hydra.utils import instantiate

from mmtf.export import load_exported
from mmtf.utils.checkpoint import build_task, load_checkpoint

from .conftest import compose_train, run_cli, tiny_overrides


def _tiny(data_dir: Path, *extra: str) -> list[str]:
    return tiny_overrides("audio_captioning", data_dir, *extra)


@pytest.fixture(scope="module")
def tiny_run(data_dir, tmp_path_factory) -> Path:
    """One real `python -m mmtf.train` run whose checkpoint the other CLI tests use."""
    work = tmp_path_factory.mktemp("cli")
    run_dir = work / "run"
    overrides = [o if o != "logger=csv" else "logger=default" for o in _tiny(data_dir)]
    out = run_cli("mmtf.train", [*overrides, f"hydra.run.dir={run_dir}"], cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


def test_train_cli_writes_a_complete_run_dir(tiny_run):
    assert (tiny_run / "config.yaml").is_file() and (tiny_run / ".hydra").is_dir()
    assert (tiny_run / "checkpoints" / "last.ckpt").is_file()
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    for key in ("test/loss", "test/cider_d", "test/bleu_4", "test/event_accuracy", "val/loss"):
        assert key in metrics, sorted(metrics)
    assert list((tiny_run / "samples").glob("val_epoch*.md"))
    assert (tiny_run / "csv" / "metrics.csv").is_file()
    assert list((tiny_run / "tensorboard").glob("events.out.tfevents.*"))
    checkpoint = load_checkpoint(tiny_run / "checkpoints" / "last.ckpt")
    assert checkpoint["mmtf"]["tokenizer"] and checkpoint["mmtf"]["config"]["model"]


def test_evaluate_cli_scores_and_writes_predictions(tiny_run, tmp_path):
    out_dir = tmp_path / "eval"
    out = run_cli("mmtf.evaluate", [f"ckpt_path={tiny_run / 'checkpoints' / 'last.ckpt'}",
                                    f"hydra.run.dir={out_dir}", "generation.strategy=beam",
                                    "generation.num_beams=2"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert {"test/cider_d", "test/bleu_4", "test/event_accuracy"} <= set(metrics)
    rows = [json.loads(line) for line in (out_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["references"]) == 5 for r in rows)


@pytest.mark.slow
def test_evaluate_cli_compiled_decoding_gives_the_eager_predictions(tiny_run, tmp_path):
    predictions = {}
    for compiled in ("false", "true"):
        out_dir = tmp_path / f"eval_{compiled}"
        out = run_cli("mmtf.evaluate", [f"ckpt_path={tiny_run / 'checkpoints' / 'last.ckpt'}",
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
                                   "json=true", f"hydra.run.dir={tmp_path / 'p'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [Path(r["path"]).name for r in rows] == ["a.wav", "a.wav", "b.flac"]
    assert all(isinstance(r["caption"], str) for r in rows)


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


def test_multirun_two_jobs_into_one_sweep_dir(data_dir, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli("mmtf.train", ["-m", *_tiny(data_dir, "test=false"), "model.decoder.depth=1,2",
                                 f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1"]
    for job, depth in (("0", 1), ("1", 2)):
        assert (sweep / job / "metrics.json").is_file()
        assert f"depth: {depth}" in (sweep / job / "config.yaml").read_text()
    assert not (tmp_path / "outputs").exists()           # nothing written outside the sweep dir


@pytest.mark.slow
def test_ddp_cpu_two_processes_one_run_dir(data_dir, tmp_path):
    run_dir = tmp_path / "ddp"
    out = run_cli("mmtf.train", [*_tiny(data_dir), "trainer=ddp_cpu", f"hydra.run.dir={run_dir}"],
                  cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / "metrics.json").is_file()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert "test/cider_d" in metrics and "val/event_accuracy" in metrics
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1] == "last.ckpt"
    assert not (tmp_path / "outputs").exists()           # no duplicate run dirs from rank 1
    # 12 training clips over 2 ranks x batch 4: 2 steps per epoch on each rank.
    assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 2


def test_config_errors_are_one_readable_line(data_dir, tmp_path):
    base = _tiny(data_dir, f"hydra.run.dir={tmp_path / 'r'}")
    cases = {
        "model.encoder.dimm=3": ("Could not override 'model.encoder.dimm'", 1),
        "model.encoder.num_heads=5": ("dim (32) must be divisible by num_heads (5)", 2),
        "model.encoder.dim=oops": ("'model.encoder.dim' = 'oops' (str) does not fit", 2),
    }
    for override, (message, code) in cases.items():
        out = run_cli("mmtf.train", [*base, override], cwd=tmp_path)
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
    out = run_cli("mmtf.train", [*overrides, f"hydra.searchpath=[file://{tmp_path / 'extra_conf'}]",
                                 f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "'model.encoder.n_mel' is not an argument" in out.stderr
    assert "Did you mean 'n_mels'" in out.stderr
    assert not (data_dir / "nothing").exists()
