"""`python -m mmtf.evaluate ckpt_path=... [split=test] [generation.strategy=beam]`.

Rebuilds the task from the checkpoint's config (allowlisted, weights-only; ``use_ema=true`` for
the EMA weights), scores a split and writes ``metrics.json``, ``predictions.jsonl`` and, with
WER / CER, ``errors.csv`` (per utterance, worst first). Audio longer than
``model.encoder.max_seconds`` is cropped (:func:`crop_long_audio`) unless
``long_audio=sequential|chunked``. ``clap_ckpt=<contrastive checkpoint>`` adds the CLAP score of
the generated captions (:mod:`mmtf.predict.clap`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from mmtf.checkpoint_io import check_targets, load_checkpoint
from mmtf.errors import ConfigError
from mmtf.metrics.wer import write_errors_csv
from mmtf.predict.inputs import WHOLE
from mmtf.tasks import CaptioningTask, Task
from mmtf.tasks.rebuild import build_task
from mmtf.utils.config import generation_overrides, require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import share_cpu
from mmtf.utils.parts import upgrade_config

log = logging.getLogger("mmtf.evaluate")
SPLITS = ("val", "test")


def build_datamodule(stored: dict[str, Any], overrides: Any) -> L.LightningDataModule:
    """The checkpoint's data module, with ``overrides`` (the ``data`` key of eval.yaml) merged."""
    # Checkpoints written while the data module built the tokenizer kept its settings under
    # data; the tokenizer itself is in the checkpoint (docs/design/tokenizer-ownership.md).
    stored_data = {k: v for k, v in stored["data"].items()
                   if k not in ("tokenizer", "tokenizer_path")}
    # Overrides in the old flat form (data.num_workers=0) go into their parts.
    extra = upgrade_config({"_target_": stored_data.get("_target_"),
                            **OmegaConf.to_container(OmegaConf.create(overrides or {}))})
    if "_target_" not in (overrides or {}):
        del extra["_target_"]
    data_cfg = OmegaConf.merge(OmegaConf.create(stored_data), extra)
    data_dict = OmegaConf.to_container(data_cfg, resolve=True)
    check_targets(data_dict, "data")
    return instantiate(OmegaConf.create(data_dict))


def crop_long_audio(task: Task, datamodule: L.LightningDataModule, split: str) -> None:
    """Score audio longer than ``model.encoder.max_seconds`` on its first ``max_seconds``.

    One caption per clip is scored, so predict's ``long_audio=window`` does not apply: clips
    that fit are scored whole, longer ones cropped, with one warning naming them."""
    limit = task.encoder.max_seconds if task.modality == "audio" else None
    if limit is None or datamodule.modality != "audio":
        return
    if datamodule.eval_crop == "full":
        datamodule.eval_crop, datamodule.max_seconds = "start", limit
    else:
        datamodule.max_seconds = min(datamodule.max_seconds or limit, limit)
    long = [(item.path, seconds) for item, seconds in zip(datamodule.items(split),
                                                          datamodule.durations(split))
            if seconds > limit]
    if long:
        shown = ", ".join(f"{path} ({seconds:.1f} s)" for path, seconds in long[:10])
        more = f" and {len(long) - 10} more" if len(long) > 10 else ""
        log.warning("%d %s clip(s) are longer than model.encoder.max_seconds (%g s) and are "
                    "scored on their first %g s: %s%s", len(long), split, limit, limit, shown,
                    more)


def dump_predictions(path: str | Path, rows: list[dict]) -> None:
    """Write predictions (id, prediction, references) as JSON lines."""
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Score ``cfg.ckpt_path`` on ``cfg.split``; return the metrics (keys ``<split>/<name>``)."""
    require_values(cfg)
    share_cpu(cfg.get("cpu_sharing"))
    if cfg.split not in SPLITS:
        raise ConfigError(f"split ({cfg.split!r}) must be one of {SPLITS}; set split=test or "
                          f"split=val.")
    output_dir = Path(cfg.paths.output_dir)
    task, stored = build_task(load_checkpoint(cfg.ckpt_path), cfg.ckpt_path,
                              use_ema=bool(cfg.get("use_ema", False)))
    task.update_generation(generation_overrides(cfg.get("generation")))
    if cfg.get("metrics_backend") is not None:
        if not isinstance(task, CaptioningTask):
            raise ConfigError(f"metrics_backend ({cfg.metrics_backend!r}) is set but a "
                              f"{type(task).__name__} checkpoint has no caption metrics; "
                              f"remove metrics_backend.")
        task.set_metrics_backend(cfg.metrics_backend)
    if cfg.get("wer_normalizer") is not None:
        if not hasattr(task, "set_wer_normalizer"):        # a SpeechTask's
            raise ConfigError(f"wer_normalizer ({cfg.wer_normalizer!r}) is set but a "
                              f"{type(task).__name__} checkpoint scores no transcripts; remove "
                              f"wer_normalizer.")
        task.set_wer_normalizer(cfg.wer_normalizer)
    clap = None
    if cfg.get("clap_ckpt") is not None:      # before the test run: a wrong one fails at once
        from mmtf.predict.clap import clap_model

        clap = clap_model(cfg.clap_ckpt, task, device="cuda" if cfg.accelerator in (
            "auto", "gpu") and torch.cuda.is_available() else "cpu")
    datamodule = build_datamodule(stored, cfg.get("data"))
    if cfg.get("batch_size"):
        datamodule.batch_size = cfg.batch_size
    stage = "validate" if cfg.split == "val" else "test"
    long_audio = cfg.get("long_audio") or "crop"
    if long_audio not in ("crop", *WHOLE):
        raise ConfigError(f"long_audio ({long_audio!r}) must be crop (score the first "
                          f"model.encoder.max_seconds), sequential or chunked (Whisper's "
                          f"long-form decoding of the whole clip).")
    if long_audio in WHOLE and task.modality == "audio":
        # Whole clips; the teacher-forced loss skips the batches the encoder cannot take.
        task.update_generation({"long_form": long_audio})
        datamodule.eval_crop = "full"
    else:
        crop_long_audio(task, datamodule, cfg.split)
    datamodule.setup(stage)
    if task.tokenizer is not None:             # the checkpoint's, for the token ids
        datamodule.connect(task.tokenizer, **task.text_context())
    task.connect_data(datamodule)
    loader = datamodule.val_dataloader() if cfg.split == "val" else datamodule.test_dataloader()
    trainer = L.Trainer(accelerator=cfg.accelerator, devices=1, logger=False,
                        enable_checkpointing=False, default_root_dir=str(output_dir))
    trainer.test(task, dataloaders=loader)     # test metrics (all of them) on either split
    metrics = {k.replace("test/", f"{cfg.split}/", 1): float(v)
               for k, v in trainer.callback_metrics.items()}
    rows = task.last_predictions.get("test")
    if clap is not None:                      # the cosine per row, its mean beside CIDEr-D
        from mmtf.predict.clap import items_by_id, score_predictions

        model, name = clap
        metrics[f"{cfg.split}/{name}"] = score_predictions(
            model, name, rows or [], items_by_id(datamodule, cfg.split),
            batch_size=cfg.batch_size)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.json").write_text(json.dumps(dict(sorted(metrics.items())), indent=2))
    written = []
    if rows:
        dump_predictions(output_dir / "predictions.jsonl", rows)
        written.append("predictions.jsonl")
    errors = task.caption_metrics["test"].errors if isinstance(task, CaptioningTask) else []
    if errors:                                  # wer / cer: the per-utterance alignment table
        write_errors_csv(output_dir / "errors.csv", errors)
        written.append("errors.csv")
    print(json.dumps(metrics, indent=2))
    print(f"Wrote {output_dir / 'metrics.json'}" + "".join(f" and {w}" for w in written))
    return metrics


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    with open_dict(cfg):
        cfg.paths.output_dir = HydraConfig.get().runtime.output_dir
    run_cli(evaluate, cfg)


def main() -> None:
    """Console entry point (``mmtf-evaluate``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
