"""`python -m mmtf.train experiment=...`: compose, seed, train, test the best checkpoint, report.

Writes into the Hydra run dir the resolved ``config.yaml``, ``run_info.json``, checkpoints,
logs and ``metrics.json`` (``test/cider_d``, ..., the training cost ``train_flops`` and
``train_samples``, and ``target_reached`` when ``target.value`` is set); returns ``optimized_metric``'s best value
for Hydra sweepers. Resume: ``ckpt_path=last | auto | <file>`` with ``hydra.run.dir=<the run
dir>`` (:func:`mmtf.reliability.resolve_resume`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from mmtf.checkpoint_io import load_checkpoint, validate_safe_targets
from mmtf.data.image import record_image_processors
from mmtf.errors import ConfigError
from mmtf.loggers import continue_tracker_runs, log_config, log_final_metric, record_tracker_runs
from mmtf.pretrained import resolved_sizes
from mmtf.reliability import resolve_resume
from mmtf.tasks import Task, resolve_tokenizer
from mmtf.utils.config import check_target_signatures, print_config_tree, require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import parallel_jobs, share_cpu
from mmtf.utils.distributed import is_distributed
from mmtf.utils.run_info import write_run_info

log = logging.getLogger("mmtf.train")


def instantiate_group(cfg: DictConfig | None) -> list[Any]:
    """Instantiate every ``_target_`` entry of a callbacks/logger group (None -> [])."""
    if not cfg:
        return []
    return [instantiate(c) for c in cfg.values() if isinstance(c, DictConfig) and "_target_" in c]


def _pin_ddp_children_to_this_run(output_dir: str) -> None:
    """Make Lightning's DDP child processes join this job instead of re-running the app.

    Lightning re-launches ``sys.argv`` for ranks > 0 with ``hydra.run.dir=<HydraConfig.run.dir>``.
    In a multirun that argv still holds ``-m`` and the sweep lists (each child would run the whole
    sweep), and ``run.dir`` holds a ``${now:}`` that resolves to a new time (a duplicate dir). So
    rank 0 rewrites both once: argv = this job's own overrides, run.dir = this job's output dir."""
    if not HydraConfig.initialized() or int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    hc = HydraConfig.get()
    sys.argv = [sys.argv[0], *hc.overrides.task]
    with read_write(hc.run):
        hc.run.dir = output_dir


def train(cfg: DictConfig) -> float | None:
    """Train and test one configuration; return the best ``cfg.optimized_metric`` by
    ``cfg.optimized_mode`` (None if not logged; :func:`optimized_value`)."""
    require_values(cfg)
    check_target_signatures(cfg)
    validate_safe_targets(cfg.get("safe_targets") or [])   # refuses os, subprocess, builtins...
    output_dir = Path(cfg.paths.output_dir)
    # last | auto | <file>: checked (complete, weights-only loadable) before anything is built.
    ckpt_path = resolve_resume(cfg.get("ckpt_path"), output_dir)
    if ckpt_path is not None:
        log.info("Resuming from %s", ckpt_path)
    L.seed_everything(cfg.seed, workers=True)
    print_config_tree(cfg, save_to=output_dir / "config.yaml")

    # The model first: a bad size fails here, before any data is generated.
    task: Task = instantiate(cfg.model)
    datamodule: L.LightningDataModule = instantiate(cfg.data)
    task.run_config = OmegaConf.to_container(cfg, resolve=True)
    # Values read from pretrained folders (sizes, image preprocessing) go into the stored config:
    # a checkpoint rebuilds and preprocesses without those folders.
    for part, sizes in resolved_sizes(task.run_config["model"], task.export_parts()).items():
        task.run_config["model"][part].update(sizes)
    if task.lora is not None:        # a PEFT folder's adapters rebuild without the folder
        task.run_config["model"]["lora"] = task.resolved_lora()
    record_image_processors(task.run_config.get("data") or {})
    callbacks = instantiate_group(cfg.get("callbacks"))
    continue_tracker_runs(cfg.get("logger"), output_dir)   # a resume continues the same run
    loggers = instantiate_group(cfg.get("logger"))
    _pin_ddp_children_to_this_run(str(output_dir))
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    start_cpu_sharing(cfg, trainer)
    if trainer.is_global_zero:                 # the loggers write on rank 0 only
        write_run_info(output_dir)
        record_tracker_runs(loggers, output_dir)
        log_config(loggers, cfg)

    # After every config is built (a bad one fails before data is generated or a tokenizer
    # trained) and before fit, which launches the other DDP ranks. A fine-tune (init_from) takes
    # the checkpoint's tokenizer with its weights; a resume's own checkpoint wins over both.
    init_from = cfg.get("init_from") if ckpt_path is None else None
    connect_tokenizer(cfg, task, datamodule, ckpt_path or init_from)
    if init_from:
        init_weights(task, init_from)
    if cfg.get("train", True):
        trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    train_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    test_metrics: dict[str, float] = {}
    if cfg.get("test", False):
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if not best or trainer.fast_dev_run:
            log.warning("No best checkpoint; testing the current weights.")
            trainer.test(task, datamodule=datamodule)
        else:
            log.info("Testing the best checkpoint %s", best)
            trainer.test(task, datamodule=datamodule, ckpt_path=best, weights_only=True)
        test_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    metrics = {**train_metrics, **test_metrics}
    value = optimized_value(trainer, metrics, cfg.get("optimized_metric") or "",
                            cfg.get("optimized_mode") or "min", once=set(test_metrics))
    log_final_metric(loggers, cfg, value, trainer.global_step)
    if trainer.is_global_zero:
        report(metrics, task, output_dir, run_records(trainer))
    return value


def run_records(trainer: L.Trainer) -> dict[str, Any]:
    """What callbacks add to ``metrics.json`` beside the logged metrics: each callback's
    ``run_record()`` (the training cost of :class:`mmtf.perf.EfficiencyMonitor`, the time to
    target of :class:`mmtf.perf.TimeToTarget`)."""
    records: dict[str, Any] = {}
    for callback in trainer.callbacks:
        if callable(getattr(callback, "run_record", None)):
            records.update(callback.run_record())
    return records


def start_cpu_sharing(cfg: DictConfig, trainer: L.Trainer) -> None:
    """Start ``cfg.cpu_sharing`` (:func:`mmtf.utils.cpu_sharing.share_cpu`) in this process:
    its thread share counts the ranks this node runs, the jobs a parallel sweep launcher runs at
    once and this rank's loader workers, which all compute beside it."""
    ranks = trainer.num_devices if trainer.world_size > 1 else 1
    jobs = 1
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        jobs = parallel_jobs(HydraConfig.get().launcher)
    workers = int(OmegaConf.select(cfg, "data.loader.num_workers", default=0) or 0)
    share_cpu(cfg.get("cpu_sharing"), processes=ranks * jobs, loader_workers=workers)


def optimized_value(trainer: L.Trainer, metrics: dict[str, float], name: str, mode: str, *,
                    once: set[str]) -> float | None:
    """The best value of ``name`` by ``mode`` over the run: what a sweep optimises.

    Not the last value: a run that overfits late is tested on its best checkpoint. The checkpoint
    callback monitoring ``name`` in ``mode`` keeps the best score, across resumes too. A metric
    logged ``once`` (test metrics) is its value, as is one that callback never scored."""
    monitoring = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)
                  and c.monitor == name and c.mode == mode]
    for callback in monitoring:
        if callback.best_model_score is not None:
            return float(callback.best_model_score)
    if not monitoring and name in metrics and name not in once:
        log.warning("optimized_metric=%s: no checkpoint callback monitors it with mode=%s, so "
                    "train() returns its last value, not its best; keep callbacks."
                    "model_checkpoint (monitor=${optimized_metric}, mode=${optimized_mode}).",
                    name, mode)
    return metrics.get(name)


def connect_tokenizer(cfg: DictConfig, task: Task, datamodule: L.LightningDataModule,
                      ckpt_path: str | os.PathLike | None) -> None:
    """Resolve the run's tokenizer once (the resumed checkpoint's, else from ``cfg.tokenizer``)
    and hand the same object to the task and the data module.

    Every DDP rank runs this (Lightning re-launches the script), and resolution is
    deterministic, so every rank holds the same tokenizer. Why here: see
    docs/design/tokenizer-ownership.md"""
    spec = cfg.get("tokenizer")
    if not task.reads_text:
        if spec is not None:
            raise ConfigError(f"tokenizer (kind: {spec.get('kind')}) is set but a "
                              f"{type(task).__name__} emits no text; remove it (~tokenizer).")
        return
    spec = None if spec is None else OmegaConf.to_container(spec, resolve=True)
    spec = task.tokenizer_spec(spec)   # a pretrained text tower brings its own
    if spec is not None:            # a mixture's prompt tokens join a tokenizer mmtf trains
        spec = datamodule.tokenizer_spec(spec)
    tokenizer = resolve_tokenizer(spec, train_captions=datamodule.train_captions,
                                  ckpt_path=ckpt_path)
    task.use_tokenizer(tokenizer)
    # A prefix LM hands its chat template and media placeholder with it (Task.text_context).
    datamodule.connect(tokenizer, **task.text_context())


def init_weights(task: Task, path: str | os.PathLike) -> None:
    """Load the weights of the checkpoint ``path`` into ``task`` (``init_from``: a fresh run that
    fine-tunes them; optimizer, schedule, loops and EMA start anew).

    Raises:
        CheckpointError: the file is not a weights-only checkpoint.
        ConfigError: its weights do not fit the model (names or shapes).
    """
    state = load_checkpoint(path).get("state_dict") or {}
    try:
        missing, unexpected = task.load_state_dict(state, strict=False)
    except RuntimeError as err:                 # a shape mismatch: its first line names it
        detail = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()),
                      str(err))
        raise ConfigError(f"init_from={path}: the checkpoint's weights do not fit this model "
                          f"({detail}); build the model with the model.* settings of the run "
                          f"that wrote it.") from None
    if missing or unexpected:
        raise ConfigError(f"init_from={path}: the checkpoint's weights do not fit this model "
                          f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}); "
                          f"build the model with the model.* settings of the run that wrote it.")
    log.info("Initialised the weights from %s (a fresh run: new optimizer and schedule)", path)


def report(metrics: dict[str, float], task: Task, output_dir: Path,
           records: dict[str, Any] | None = None) -> None:
    """Print the final metrics and a few sample captions; write ``metrics.json`` (the metrics,
    then ``records``: values that are not logged metrics, such as ``train_flops``)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in sorted(metrics.items()) if not k.endswith("_step")}
    records = records or {}
    (output_dir / "metrics.json").write_text(json.dumps({**clean, **records}, indent=2) + "\n")
    lines = [f"  {k:<28} {v:.4f}" for k, v in clean.items()]
    lines += [f"  {k:<28} {v:.4g}" if isinstance(v, (int, float)) else f"  {k:<28} {v}"
              for k, v in records.items()]
    print("Final metrics:\n" + "\n".join(lines))
    for split, rows in task.last_predictions.items():
        print(f"Sample {split} captions (prediction | reference):")
        for row in rows[:5]:
            ref = row["references"][0] if row["references"] else ""
            print(f"  {row['id']}: {row['prediction']} | {ref}")
    print(f"Run dir: {output_dir}")


# What Lightning's DDP launcher writes into the launching process's environment.
_DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def _isolated_ddp_job() -> Iterator[None]:
    """Leave no DDP state behind a job, so the next job of a multirun starts its own.

    Rank 0 runs every job of a sweep in one process; Lightning keeps the process group and leaves
    ``LOCAL_RANK`` (and the master address/port) in ``os.environ``, so the next job would launch
    no ranks and wait forever in the rendezvous. Undo both after each job."""
    before = {k: os.environ.get(k) for k in _DDP_ENV}
    try:
        yield
    finally:
        if is_distributed():
            torch.distributed.destroy_process_group()
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    with open_dict(cfg):
        cfg.paths.output_dir = HydraConfig.get().runtime.output_dir
    with _isolated_ddp_job():
        return run_cli(train, cfg)


def _resume_in_its_run_dir(argv: list[str]) -> list[str]:
    """``ckpt_path=<run>/checkpoints/x.ckpt`` continues in ``<run>`` (not a new run dir).

    ``last`` and ``auto`` name no file: they resume in the run dir given by ``hydra.run.dir``."""
    args = argv[1:]
    if {"-m", "--multirun"} & set(args) or any(a.startswith("hydra.run.dir=") for a in args):
        return argv
    values = [a.split("=", 1)[1] for a in args if a.startswith("ckpt_path=")]
    if not values or values[-1] in ("", "null", "last", "auto"):
        return argv
    ckpt = Path(values[-1]).expanduser().resolve()
    run_dir = ckpt.parent.parent
    if ckpt.parent.name == "checkpoints" and (run_dir / ".hydra").is_dir():
        return [*argv, f"hydra.run.dir={run_dir}"]
    return argv


def renamed_keys(argv: list[str]) -> list[str]:
    """``argv`` with the overrides of renamed keys under their new names: ``cpu_threads=N`` is
    ``cpu_sharing.threads=N`` (``null``: ``share``)."""
    return [f"cpu_sharing.threads={a[12:] if a[12:] not in ('', 'null') else 'share'}"
            if a.startswith("cpu_threads=") else a for a in argv]


def main() -> None:
    """Console entry point (``mmtf-train``)."""
    torch.set_float32_matmul_precision("high")
    sys.argv = _resume_in_its_run_dir(renamed_keys(sys.argv))
    _hydra_main()


if __name__ == "__main__":
    main()
