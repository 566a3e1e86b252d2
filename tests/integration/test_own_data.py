"""A researcher's own data and configs: manifest templates, the monitored metric, --config-dir."""

from __future__ import annotations

import json
import math
import struct
import textwrap
import wave
from pathlib import Path

import pytest
from PIL import Image

from mmtf.errors import MonitorError
from mmtf.train import train

from .conftest import CAPTION, COMMON, cli_in_process, compose_train, tiny_overrides

WORDS = ["a dog barks", "rain falls softly", "a car passes by", "birds sing loudly"]


def write_wav(path: Path, freq: float, seconds: float = 1.0, rate: int = 16000) -> None:
    """A sine tone as 16-bit mono PCM (stdlib wave: no audio library involved)."""
    n = int(seconds * rate)
    samples = [int(8000 * math.sin(2 * math.pi * freq * i / rate)) for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(struct.pack(f"<{n}h", *samples))


def write_png(path: Path, color: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 30), color).save(path)


def write_manifest(root: Path, modality: str, sizes=(8, 4, 4)) -> Path:
    """``root/{train,val,test}.jsonl`` over a handful of generated files."""
    for split, n in zip(("train", "val", "test"), sizes, strict=True):
        lines = []
        for i in range(n):
            rel = f"{split}/{i}.wav" if modality == "audio" else f"{split}/{i}.png"
            if modality == "audio":
                write_wav(root / rel, 200.0 + 100 * i)
            else:
                write_png(root / rel, (30 * i % 255, 80, 200 - 20 * i))
            lines.append(json.dumps({modality: rel, "caption": [WORDS[i % 4], WORDS[(i + 1) % 4]]}))
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def own_overrides(experiment: str, root: Path, *extra: str) -> list[str]:
    encoder = "model/encoder=audio_tiny" if "audio" in experiment else "model/encoder=vision_tiny"
    return [f"experiment={experiment}", f"data.root={root}", *COMMON, encoder, *CAPTION,
            "model.generation.strategy=greedy", "tokenizer.vocab_size=48", *extra]


@pytest.mark.parametrize(("experiment", "modality"), [("my_audio_captions", "audio"),
                                                      ("my_image_captions", "image")])
def test_template_trains_on_a_written_manifest(experiment, modality, tmp_path):
    root = write_manifest(tmp_path / "data", modality)
    cfg = compose_train(own_overrides(experiment, root), tmp_path / "run")
    assert cfg.optimized_metric == "val/cider_d"
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "val/cider_d" in metrics and "test/cider_d" in metrics, metrics
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(("overrides", "metric", "mode"), [
    (["experiment=audio_captioning"], "val/event_accuracy", "max"),
    (["experiment=audio_captioning", "data=manifest", "data.root=/x"], "val/cider_d", "max"),
    (["experiment=image_captioning", "data=coco_captions", "data.root=/x"], "val/cider_d", "max"),
    (["experiment=audio_captioning_clotho", "data.root=/x"], "val/cider_d", "max"),
    (["experiment=image_classification", "data=image_folder", "data.root=/x"], "val/accuracy",
     "max"),
    (["experiment=audio_captioning", "optimized_metric=val/loss", "optimized_mode=min"], "val/loss",
     "min"),
    (["experiment=audio_captioning", "data=manifest", "data.root=/x", "optimized_metric=val/bleu_4",
      "optimized_mode=max"], "val/bleu_4", "max"),
])
def test_monitored_metric_follows_the_data(overrides, metric, mode, tmp_path):
    cfg = compose_train(overrides, tmp_path)
    assert (cfg.optimized_metric, cfg.optimized_mode) == (metric, mode)
    assert cfg.callbacks.model_checkpoint.monitor == metric
    assert cfg.callbacks.early_stopping.monitor == metric
    assert cfg.callbacks.model_checkpoint.mode == mode


def test_unlogged_monitor_fails_at_first_validation(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir, "optimized_metric=val/nope",
                                       "test=false"), tmp_path)
    with pytest.raises(MonitorError, match=r"monitors 'val/nope'.*logged after validation: .*"
                                           r"val/event_accuracy.*val/loss"):
        train(cfg)


@pytest.mark.slow
def test_unlogged_monitor_is_one_cli_line(data_dir, tmp_path):
    args = tiny_overrides("audio_captioning", data_dir, "optimized_metric=val/nope", "test=false",
                          f"hydra.run.dir={tmp_path / 'run'}")
    proc = cli_in_process("mmtf.train", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mmtf: error:")]
    assert len(errors) == 1 and "'val/nope'" in errors[0] and "val/loss" in errors[0]
    assert "Traceback" not in proc.stderr


EXTERNAL = """\
    # @package _global_
    defaults:
      - override /data: manifest
      - override /model/encoder: audio_tiny
      - override /model/decoder: text_tiny
    task_name: mine
    tags: [lab]
    tokenizer: {{vocab_size: 48}}
    data:
      root: {root}
    model:
      decoder: {{vocab_size: "${{tokenizer.vocab_size}}"}}
      encoder: {{dim: 48}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["config-dir", "searchpath"])
def test_experiment_outside_the_repo(how, tmp_path):
    root = write_manifest(tmp_path / "data", "audio", sizes=(4, 4, 4))
    exps = tmp_path / "my_exps"
    (exps / "experiment").mkdir(parents=True)
    (exps / "experiment" / "mine.yaml").write_text(textwrap.dedent(EXTERNAL.format(root=root)))
    where = (["--config-dir", str(exps)] if how == "config-dir"
             else [f"hydra.searchpath=[file://{exps}]"])
    run = tmp_path / "run"
    args = [*where, "experiment=mine", "trainer.fast_dev_run=true", *COMMON,
            "model.generation.max_new_tokens=4", "model.test_metrics=[bleu]",
            f"hydra.run.dir={run}"]
    proc = cli_in_process("mmtf.train", args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import yaml
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["task_name"] == "mine" and cfg["data"]["format"] == "manifest"
    assert cfg["model"]["encoder"]["dim"] == 48 and cfg["optimized_metric"] == "val/cider_d"
