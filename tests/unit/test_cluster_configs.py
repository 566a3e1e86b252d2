"""SLURM recipes (sbatch script, submitit launcher preset) and every trainer/logger config.

The sbatch script is run by bash with a stand-in ``srun`` that records its arguments; those
arguments are then composed as each rank's Hydra process would, under that rank's simulated
SLURM environment.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
LAUNCHER = CONF / "hydra" / "launcher" / "slurm.yaml"

JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "mmtf", "SLURM_NNODES": "2",
       "SLURM_NTASKS_PER_NODE": "4", "SLURM_NTASKS": "8", "SLURM_SUBMIT_DIR": "/home/me/mmtf"}


def _rank_env(rank: int, restart: int = 0) -> dict[str, str]:
    return {**JOB, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % 4),
            "SLURM_NODEID": str(rank // 4), "SLURMD_NODENAME": f"gpu{rank // 4:02d}",
            "SLURM_RESTART_COUNT": str(restart)}


def _compose(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


@pytest.fixture(scope="module")
def srun_args(tmp_path_factory) -> list[str]:
    """The command line the sbatch script hands to srun, with user overrides appended."""
    tmp = tmp_path_factory.mktemp("sbatch")
    record = tmp / "srun_args"
    fake = tmp / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {record}\n')
    fake.chmod(0o755)
    env = {**os.environ, **JOB, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(SBATCH), "data.batches.batch_size=8"], env=env, cwd=tmp, check=True,
                   timeout=60)
    return record.read_text().split("\0")[:-1]


def test_sbatch_runs_the_training_cli_under_srun(srun_args):
    assert srun_args[:3] == ["python", "-m", "mmtf.train"]
    assert srun_args[-1] == "data.batches.batch_size=8"       # the user's overrides come last


def test_sbatch_asks_for_requeue_and_a_warning_signal():
    directives = [line.split()[1] for line in SBATCH.read_text().splitlines()
                  if line.startswith("#SBATCH ")]
    assert "--requeue" in directives
    assert "--signal=USR1@120" in directives          # Lightning's SLURMEnvironment requeue signal
    assert "--job-name=mmtf" in directives            # not bash/interactive: Lightning detects SLURM


@pytest.mark.slow
def test_every_rank_and_a_requeue_compose_the_same_run_dir(srun_args, monkeypatch):
    overrides = srun_args[3:]
    run_dirs = set()
    envs = [_rank_env(rank) for rank in range(8)] + [_rank_env(0, restart=1),
                                                      _rank_env(5, restart=1)]
    for env in envs:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        cfg = _compose(overrides)
        run_dirs.add(OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"])
        assert cfg.ckpt_path == "auto"
        assert (cfg.trainer.num_nodes, cfg.trainer.devices) == (2, 4)
        assert cfg.trainer.strategy._target_.endswith("DDPStrategy")
    assert run_dirs == {"./outputs/audio_captioning/slurm/4242"}


def test_another_job_gets_another_run_dir(srun_args, monkeypatch):
    for key, value in {**_rank_env(0), "SLURM_JOB_ID": "4243"}.items():
        monkeypatch.setenv(key, value)
    cfg = _compose(srun_args[3:])
    assert cfg.hydra.run.dir == "./outputs/audio_captioning/slurm/4243"


def test_lightning_reads_each_rank_from_the_simulated_slurm_env(monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    for rank in (0, 5):
        for key, value in _rank_env(rank).items():
            monkeypatch.setenv(key, value)
        assert SLURMEnvironment.detect()
        env = SLURMEnvironment()
        assert (env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()) == (
            rank, rank % 4, rank // 4, 8)


# ----------------------------------------------------------------- submitit launcher preset
NEEDS_PLUGIN = "hydra-submitit-launcher is not installed (pip install 'mmtf[slurm]')"


def test_launcher_preset_extends_the_plugins_config_with_one_rank_per_gpu():
    """Without the plugin: the file itself (the plugin's schema supplies the other keys)."""
    preset = OmegaConf.to_container(OmegaConf.load(LAUNCHER))
    assert preset["defaults"] == ["submitit_slurm", "_self_"]
    assert preset["tasks_per_node"] == "${.gpus_per_node}"
    assert preset["nodes"] == "${trainer.num_nodes}"
    assert preset["max_num_timeout"] > 0 and preset["signal_delay_s"] > 0


@pytest.fixture()
def launcher_cfg(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason=NEEDS_PLUGIN)
    cfg = _compose(["hydra/launcher=slurm", "trainer=ddp", "trainer.num_nodes=2",
                    "hydra.launcher.gpus_per_node=4", "hydra.launcher.partition=gpu",
                    f"hydra.sweep.dir={tmp_path}"])
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def test_launcher_preset_composes_one_rank_per_gpu(launcher_cfg):
    assert launcher_cfg["_target_"] == (
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher")
    assert (launcher_cfg["nodes"], launcher_cfg["gpus_per_node"],
            launcher_cfg["tasks_per_node"]) == (2, 4, 4)
    assert launcher_cfg["partition"] == "gpu" and launcher_cfg["name"] == "train"


def test_launcher_preset_becomes_the_sbatch_submitit_submits(launcher_cfg, tmp_path, monkeypatch):
    """The launcher's own mapping of its keys onto submitit's SLURM executor, rendered."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    fake = tmp_path / "bin" / "srun"            # submitit's SLURM executor wants srun on PATH
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    params = dict(launcher_cfg)
    params.pop("_target_")
    executor = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    base = {f.name for f in dataclasses.fields(BaseQueueConf)}
    # update_parameters refuses a name submitit does not know.
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    # The file submitit would submit (no public API renders it without submitting).
    sbatch = executor._executor._make_submission_file_text("cmd", "uid")
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --time=1440", "#SBATCH --mem=64GB",
                 "#SBATCH --signal=USR2@120"):
        assert line in sbatch, sbatch


# ------------------------------------------------------------ every trainer and logger config
TRAINERS = sorted(p.stem for p in (CONF / "trainer").glob("*.yaml"))
LOGGERS = sorted(p.stem for p in (CONF / "logger").glob("*.yaml"))
LOGGER_PACKAGE = {"wandb": "wandb", "mlflow": "mlflow"}


def test_every_trainer_and_logger_file_is_tested():
    assert set(TRAINERS) == {"default", "gpu", "ddp", "ddp_cpu", "fsdp", "debug"}
    assert set(LOGGERS) == {"default", "csv", "tensorboard", "wandb", "mlflow"}


@pytest.mark.parametrize("trainer", TRAINERS)
def test_trainer_config_composes_and_its_strategy_resolves(trainer):
    cfg = _compose([f"trainer={trainer}"])
    assert cfg.trainer._target_ == "lightning.pytorch.trainer.Trainer"
    if "strategy" in cfg.trainer:
        strategy = instantiate(cfg.trainer.strategy)    # builds on CPU, no process group yet
        assert type(strategy).__name__ == cfg.trainer.strategy._target_.rsplit(".", 1)[1]


@pytest.mark.parametrize("trainer", ["default", "debug", "ddp_cpu"])
def test_cpu_trainer_configs_instantiate(trainer, tmp_path):
    cfg = _compose([f"trainer={trainer}", f"paths.output_dir={tmp_path}"])
    built = instantiate(cfg.trainer, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False)
    assert built.num_devices == cfg.trainer.devices


@pytest.mark.parametrize("logger", LOGGERS)
def test_logger_config_composes_and_instantiates(logger, tmp_path):
    cfg = _compose([f"logger={logger}", f"paths.output_dir={tmp_path}",
                    f"paths.log_dir={tmp_path}"])
    for name, node in cfg.logger.items():
        module, _, cls = node._target_.rpartition(".")
        assert callable(getattr(importlib.import_module(module), cls)), node._target_
        package = LOGGER_PACKAGE.get(name)
        if package and importlib.util.find_spec(package) is None:
            pytest.skip(f"{name}: `{package}` is not installed (pip install 'mmtf[{package}]');"
                        f" its _target_ resolves, instantiation needs the package")
        built = instantiate(node)
        assert type(built).__name__ == cls
