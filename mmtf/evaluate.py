"""`python -m mmtf.evaluate ckpt_path=... [split=test] [generation.strategy=beam]`.

Rebuilds the task from the config stored in the checkpoint (allowlisted ``_target_``s, weights
loaded with ``weights_only=True``), scores it on a split with the checkpoint's data config, and
writes ``metrics.json`` and ``predictions.jsonl`` (captioning) into the run dir.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mmtf.tasks.captioning import dump_predictions
from mmtf.utils.checkpoint import build_task, check_targets, load_checkpoint
from mmtf.utils.config import run_cli

log = logging.getLogger("mmtf.evaluate")
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
SPLITS = ("val", "test")


def build_datamodule(stored: dict[str, Any], overrides: Any, task: L.LightningModule,
                     workdir: Path) -> L.LightningDataModule:
    """The checkpoint's data module (plus overrides), reusing the checkpoint's tokenizer."""
    data_cfg = OmegaConf.merge(OmegaConf.create(stored["data"]), overrides or {})
    data_dict = OmegaConf.to_container(data_cfg, resolve=True)
    check_targets(data_dict, "data")
    tokenizer = getattr(task, "tokenizer", None)
    if tokenizer is not None and "tokenizer_path" in data_dict:
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "tokenizer.json"
        tokenizer.save(path)
        data_dict["tokenizer_path"] = str(path)
    return instantiate(OmegaConf.create(data_dict))


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Score ``cfg.ckpt_path`` on ``cfg.split``; return the metrics (keys ``<split>/<name>``)."""
    if cfg.split not in SPLITS:
        raise ValueError(f"split ({cfg.split!r}) must be one of {SPLITS}.")
    output_dir = Path(cfg.paths.output_dir)
    checkpoint = load_checkpoint(cfg.ckpt_path)
    task, stored = build_task(checkpoint, cfg.ckpt_path)
    if hasattr(task, "generation") and cfg.get("generation"):
        overrides = OmegaConf.to_container(cfg.generation, resolve=True)
        task.generation.update({k: v for k, v in overrides.items() if v is not None})
    datamodule = build_datamodule(stored, cfg.get("data"), task, output_dir)
    if cfg.get("batch_size") and hasattr(datamodule, "batch_size"):
        datamodule.batch_size = cfg.batch_size
    datamodule.setup("validate" if cfg.split == "val" else "test")
    loader = datamodule.val_dataloader() if cfg.split == "val" else datamodule.test_dataloader()
    if hasattr(task, "caption_parser"):      # the loaders come without their data module
        task.caption_parser = getattr(datamodule, "caption_parser", None)
    trainer = L.Trainer(accelerator=cfg.accelerator, devices=1, logger=False,
                        enable_checkpointing=False, default_root_dir=str(output_dir))
    trainer.test(task, dataloaders=loader)
    metrics = {k.replace("test/", f"{cfg.split}/", 1): float(v)
               for k, v in trainer.callback_metrics.items()}
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.json").write_text(json.dumps(dict(sorted(metrics.items())), indent=2))
    rows = (getattr(task, "last_predictions", None) or {}).get("test")
    if rows:
        dump_predictions(output_dir / "predictions.jsonl", rows)
    print(json.dumps(metrics, indent=2))
    print(f"Wrote {output_dir / 'metrics.json'}" + (" and predictions.jsonl" if rows else ""))
    return metrics


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.paths.output_dir = HydraConfig.get().runtime.output_dir
    run_cli(evaluate, cfg)


def main() -> None:
    """Console entry point (``mmtf-evaluate``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
