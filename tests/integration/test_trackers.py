"""Trackers and run records: the whole config in every logger, run_info.json, resumes that keep
the CSV rows and the W&B / MLflow run, sample tables in W&B and MLflow."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import hydra
import lightning
import lightning as L
import pytest
import torch
import yaml
from hydra.utils import instantiate
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from mmtf.loggers import (
    TRACKER_RUNS_FILE,
    continue_tracker_runs,
    flat_config,
    record_tracker_runs,
)
from mmtf.train import train

from .conftest import REPO, compose_train, tiny_overrides


def test_flat_config_hand_checked():
    cfg = OmegaConf.create({"seed": 3, "tags": ["a", "b"], "lr": "${model.optimizer.lr}",
                            "model": {"optimizer": {"lr": 0.5}, "encoder": None},
                            "data": {"tf": [{"_target_": "x.Y", "size": [2, 2]}]}})
    assert flat_config(cfg) == {"seed": 3, "tags": "[a, b]", "lr": 0.5,
                                "model.optimizer.lr": 0.5, "model.encoder": None,
                                "data.tf.0._target_": "x.Y", "data.tf.0.size": "[2, 2]"}


def tb_hparams(run_dir: Path) -> set[str]:
    """Keys of the HParams-plugin session start written into the TensorBoard event files."""
    keys: set[str] = set()
    for events in (run_dir / "tensorboard").rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for content in acc.PluginTagToContent("hparams").values():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            keys |= set(data.session_start_info.hparams)
    return keys


def test_every_logger_gets_the_flat_config_and_run_info(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir, "logger=default",
                                       "trainer.fast_dev_run=true", "test=false",
                                       "model.optimizer.lr=0.00123", "tags=[lab,sweep7]"),
                        tmp_path)
    train(cfg)
    hparams = yaml.safe_load((tmp_path / "csv" / "hparams.yaml").read_text())
    assert hparams["model.optimizer.lr"] == 0.00123
    assert hparams["seed"] == 12345 and hparams["tags"] == "[lab, sweep7]"
    assert hparams["data.batches.batch_size"] == 4 and hparams["data.format"] == "clotho"
    assert {"model.optimizer.lr", "seed", "tags", "data.batches.batch_size",
            "model.encoder.dim"} <= tb_hparams(tmp_path)

    info = json.loads((tmp_path / "run_info.json").read_text())["starts"]
    assert len(info) == 1
    assert info[0]["packages"]["torch"] == torch.__version__.split("+")[0]
    assert info[0]["torch_build"] == {"version": torch.__version__, "cuda": torch.version.cuda}
    assert info[0]["packages"]["lightning"] == lightning.__version__
    assert info[0]["packages"]["hydra-core"] == hydra.__version__
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert info[0]["git"]["mmtf"]["commit"] == head
    assert isinstance(info[0]["git"]["mmtf"]["dirty"], bool)
    assert "command" in info[0] and info[0]["argv"]


def test_run_info_without_git_repo_or_git(tmp_path, monkeypatch):
    from mmtf.utils.run_info import git_state, write_run_info
    assert "not a git repository" in git_state(tmp_path)["error"]
    monkeypatch.setenv("PATH", str(tmp_path))               # no git executable at all
    monkeypatch.chdir(tmp_path)
    write_run_info(tmp_path / "run", ["train.py", "seed=1"])
    start = json.loads((tmp_path / "run" / "run_info.json").read_text())["starts"][0]
    assert start["git"]["cwd"] == {"error": "git is not installed"}
    assert start["argv"] == ["train.py", "seed=1"]


def csv_epochs(run_dir: Path) -> list[int]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return sorted({int(float(r["epoch"])) for r in csv.DictReader(f) if r.get("epoch")})


@pytest.mark.slow
def test_resume_keeps_csv_rows_and_appends_run_info(data_dir, tmp_path):
    common = ["test=false", "data.synthetic.num_train=8"]
    train(compose_train(tiny_overrides("audio_captioning", data_dir, *common), tmp_path))
    assert csv_epochs(tmp_path) == [0]
    train(compose_train(tiny_overrides("audio_captioning", data_dir, *common, "ckpt_path=last",
                                       "trainer.max_epochs=2"), tmp_path))
    assert csv_epochs(tmp_path) == [0, 1]
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        header = next(csv.reader(f))
    assert "val/loss" in header and "train/loss" in header
    assert len(json.loads((tmp_path / "run_info.json").read_text())["starts"]) == 2


def test_wandb_and_mlflow_continue_the_run_of_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_train(["logger=wandb"], run_dir)
    continue_tracker_runs(cfg.logger, run_dir)
    first = cfg.logger.wandb.id
    assert len(first) == 12 and cfg.logger.wandb.resume == "allow"
    assert json.loads((run_dir / TRACKER_RUNS_FILE).read_text()) == {"wandb": first}
    again = compose_train(["logger=wandb"], run_dir)          # the resumed process
    continue_tracker_runs(again.logger, run_dir)
    assert again.logger.wandb.id == first
    mine = compose_train(["logger=wandb", "+logger.wandb.id=chosen"], run_dir)
    continue_tracker_runs(mine.logger, run_dir)
    assert mine.logger.wandb.id == "chosen"

    ml = compose_train(["logger=mlflow"], run_dir)
    continue_tracker_runs(ml.logger, run_dir)
    assert "run_id" not in ml.logger.mlflow                  # first start: MLflow makes one

    class StartedMLflow(MLFlowLogger):                        # mlflow is not installed here
        def __init__(self) -> None:
            pass
        run_id = "4f2a"

    record_tracker_runs([StartedMLflow()], run_dir)
    assert json.loads((run_dir / TRACKER_RUNS_FILE).read_text()) == {"wandb": first,
                                                                    "mlflow": "4f2a"}
    resumed = compose_train(["logger=mlflow"], run_dir)
    continue_tracker_runs(resumed.logger, run_dir)
    assert resumed.logger.mlflow.run_id == "4f2a"


class RecordingWandb(WandbLogger):
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def log_table(self, key, columns=None, data=None, dataframe=None, step=None) -> None:
        self.calls.append({"key": key, "columns": columns, "data": data, "step": step})


class RecordingMLflowClient:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_text(self, run_id, text, artifact_file) -> None:
        self.calls.append((run_id, text, artifact_file))


class RecordingMLflow(MLFlowLogger):
    def __init__(self) -> None:
        self.client = RecordingMLflowClient()

    run_id = "run-7"

    @property
    def experiment(self):
        return self.client


def test_sample_table_reaches_wandb_and_mlflow(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir), tmp_path)
    task = instantiate(cfg.model)
    wandb, mlflow = RecordingWandb(), RecordingMLflow()
    trainer = L.Trainer(logger=[wandb, mlflow], default_root_dir=str(tmp_path),
                        enable_checkpointing=False, enable_progress_bar=False)
    task.trainer = trainer
    rows = [{"id": "clip1", "prediction": "a dog barks", "references": ["a dog barks twice"]},
            {"id": "clip2", "prediction": "rain", "references": ["rain falls", "it rains"]}]
    task._log_samples("val", rows)
    assert wandb.calls == [{"key": "val/samples", "columns": ["id", "prediction", "reference"],
                            "data": [["clip1", "a dog barks", "a dog barks twice"],
                                     ["clip2", "rain", "rain falls"]], "step": 0}]
    (run_id, text, artifact), = mlflow.client.calls
    assert run_id == "run-7" and artifact == "samples/val_epoch000_step0000000.md"
    assert "| clip2 | rain | rain falls |" in text


@pytest.mark.slow
def test_mlflow_resume_continues_one_run_with_params_and_samples(data_dir, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)              # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "test=false",
              "data.synthetic.num_train=8", "model.optimizer.lr=0.00077"]
    run_dir = tmp_path / "run"
    train(compose_train(tiny_overrides("audio_captioning", data_dir, *common), run_dir))
    first = json.loads((run_dir / TRACKER_RUNS_FILE).read_text())["mlflow"]
    train(compose_train(tiny_overrides("audio_captioning", data_dir, *common, "ckpt_path=last",
                                       "trainer.max_epochs=2"), run_dir))
    assert json.loads((run_dir / TRACKER_RUNS_FILE).read_text())["mlflow"] == first
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("audio_captioning").experiment_id])
    assert [r.info.run_id for r in runs] == [first]
    assert runs[0].data.params["model.optimizer.lr"] == "0.00077"
    epochs = {int(m.step) for m in client.get_metric_history(first, "epoch")}
    assert {0, 1} <= epochs
    artifacts = [a.path for a in client.list_artifacts(first, "samples")]
    assert any(p.endswith("val_epoch000_step0000002.md") for p in artifacts), artifacts
    assert any("epoch001" in p for p in artifacts), artifacts
