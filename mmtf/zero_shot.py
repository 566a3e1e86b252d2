"""`python -m mmtf.zero_shot ckpt_path=<contrastive checkpoint> data=synth_audio_labels`.

Zero-shot classification with a contrastive checkpoint (CLIP / CLAP): each class name fills a
prompt template ("the sound of a {label}"), the prompts are embedded by the checkpoint's text
tower, and every clip (or image) of a classification split takes the class whose prompt is
nearest. No training on the labels. Writes ``metrics.json`` (``<split>/zero_shot/accuracy``,
its chance level, per-class accuracy) into the run dir. Guide: docs/guide/contrastive.md.

Shapes: n items, c classes, e embedding width.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict
from torch import Tensor

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import ConfigError, UserError
from mmtf.tasks.base import batch_inputs
from mmtf.tasks.contrastive import ContrastiveTask
from mmtf.tasks.rebuild import build_task
from mmtf.utils.config import require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import share_cpu

log = logging.getLogger("mmtf.zero_shot")
SPLITS = ("train", "val", "test")

__all__ = ["ZeroShotScore", "label_prompts", "score_predictions", "zero_shot"]


@dataclass(frozen=True)
class ZeroShotScore:
    """Accuracy of predicted classes against the true ones.

    Attributes:
        accuracy: the share of items whose prediction is their class.
        chance: the accuracy of always answering the most frequent class (1 / c when the
            classes are balanced): what a classifier that ignores the input reaches.
        per_class: each class's accuracy over its items (None: the class has no item).
        count: the items scored.
    """

    accuracy: float
    chance: float
    per_class: list[float | None]
    count: int


def score_predictions(predictions: Tensor, targets: Tensor, num_classes: int) -> ZeroShotScore:
    """Accuracy, chance level and per-class accuracy of ``predictions`` (n,) against
    ``targets`` (n,), both class indices in ``[0, num_classes)``.

    Raises:
        ValueError: different shapes, no item, or an index out of range.
    """
    if predictions.shape != targets.shape or predictions.dim() != 1 or targets.numel() == 0:
        raise ValueError(f"score_predictions: predictions and targets must be the same (n,) "
                         f"with n >= 1, got {tuple(predictions.shape)} and "
                         f"{tuple(targets.shape)}.")
    for name, t in (("predictions", predictions), ("targets", targets)):
        if bool(((t < 0) | (t >= num_classes)).any()):
            raise ValueError(f"score_predictions: {name} hold an index outside [0, "
                             f"{num_classes}).")
    right = (predictions == targets).double()                                   # (n,)
    counts = torch.bincount(targets, minlength=num_classes)                     # (c,)
    hits = torch.bincount(targets, weights=right, minlength=num_classes)        # (c,)
    per_class = [None if int(n) == 0 else float(h / n) for h, n in zip(hits, counts)]
    return ZeroShotScore(accuracy=float(right.mean()),
                         chance=float(counts.max()) / targets.numel(),
                         per_class=per_class, count=targets.numel())


def label_prompts(class_names: Sequence[str], labels: Sequence[str] | None = None,
                  ) -> list[str]:
    """The text each class is called in the prompt: ``labels`` in class order when given,
    else the class names with ``_`` as spaces ("low_tone" -> "low tone").

    Raises:
        ConfigError: ``labels`` of another length than the classes.
    """
    if labels is None:
        return [str(name).replace("_", " ") for name in class_names]
    if len(labels) != len(class_names):
        raise ConfigError(f"labels has {len(labels)} entries but the data has "
                          f"{len(class_names)} classes ({list(class_names)}); give one label per "
                          f"class in that order, or labels=null for the class names.")
    return [str(label) for label in labels]


@torch.no_grad()
def zero_shot(task: ContrastiveTask, loader: Any, prompts: Sequence[str], template: str,
              ) -> tuple[Tensor, Tensor]:
    """Predicted (n,) and true (n,) class indices of every item of ``loader`` (batches with
    ``label``), each item taking the class of its nearest prompt."""
    task.eval()
    predictions, targets = [], []
    for batch in loader:
        inputs, lengths = batch_inputs(batch)
        media = task.embed_media(inputs.to(task.device),
                                 None if lengths is None else lengths.to(task.device))  # (b, e)
        predictions.append(task.zero_shot_classify(media, prompts, template=template)
                           .predictions.cpu())
        targets.append(batch["label"].cpu())
    return torch.cat(predictions), torch.cat(targets)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Score ``cfg.ckpt_path`` zero-shot on ``cfg.split`` of ``cfg.data``; return the metrics."""
    require_values(cfg)
    share_cpu(cfg.get("cpu_sharing"))
    if cfg.split not in SPLITS:
        raise ConfigError(f"split ({cfg.split!r}) must be one of {SPLITS}.")
    task, _ = build_task(load_checkpoint(cfg.ckpt_path), cfg.ckpt_path,
                         use_ema=bool(cfg.get("use_ema", False)))
    if not isinstance(task, ContrastiveTask):
        raise UserError(f"ckpt_path={cfg.ckpt_path} holds a {type(task).__name__}; zero-shot "
                        f"classification needs a contrastive checkpoint (experiment="
                        f"audio_text_retrieval or image_text_retrieval).")
    datamodule = instantiate(cfg.data)
    if getattr(datamodule, "targets", None) != "label":
        raise ConfigError(f"data ({cfg.data.get('_target_')}) is not a classification set; "
                          f"choose one with data=synth_audio_labels | esc50 | "
                          f"synth_image_labels | image_folder.")
    if datamodule.modality != task.modality:
        raise ConfigError(f"data holds {datamodule.modality} but the checkpoint embeds "
                          f"{task.modality}; choose a {task.modality} classification set.")
    if cfg.get("batch_size"):
        datamodule.batch_size = cfg.batch_size
    datamodule.prepare_data()
    datamodule.setup("test" if cfg.split == "test" else "fit")
    task.check_audio_limit(datamodule)
    loader = {"train": datamodule.train_dataloader, "val": datamodule.val_dataloader,
              "test": datamodule.test_dataloader}[cfg.split]()
    names = list(datamodule.class_names)
    prompts = label_prompts(names, cfg.get("labels"))
    device = "cuda" if cfg.accelerator in ("gpu", "cuda") or (
        cfg.accelerator == "auto" and torch.cuda.is_available()) else "cpu"
    task.to(device)
    predictions, targets = zero_shot(task, loader, prompts, cfg.template)
    score = score_predictions(predictions, targets, len(names))
    key = f"{cfg.split}/zero_shot"
    metrics = {f"{key}/accuracy": score.accuracy, f"{key}/chance": score.chance,
               f"{key}/count": score.count, "template": cfg.template,
               "prompts": [cfg.template.format(label=p) for p in prompts],
               f"{key}/per_class": dict(zip(names, score.per_class))}
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2))
    print(f"Wrote {output_dir / 'metrics.json'}")
    return metrics


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="zero_shot")
def _hydra_main(cfg: DictConfig) -> None:
    with open_dict(cfg):
        cfg.paths.output_dir = HydraConfig.get().runtime.output_dir
    run_cli(run, cfg)


def main() -> None:
    """Console entry point (``python -m mmtf.zero_shot``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
