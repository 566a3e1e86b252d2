"""Rebuild a task module from the config and weights an mmtf checkpoint carries."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.checkpoint_io import model_state, stored_config
from mmtf.tasks.resolve import stored_tokenizer

if TYPE_CHECKING:
    from mmtf.tasks.base import Task


def build_task(checkpoint: dict[str, Any], path: str | os.PathLike,
               safe_targets: Iterable[str] | None = None, *,
               use_ema: bool = False) -> tuple[Task, dict[str, Any]]:
    """Re-instantiate the task module of a checkpoint and load its weights (strict).

    ``safe_targets``: extra module prefixes the stored config may name (None:
    ``MMTF_SAFE_TARGETS``); see :func:`check_targets`. ``use_ema``: load the EMA of the
    weights (``callbacks=ema``) instead of the trained ones
    (:func:`mmtf.checkpoint_io.model_state`; a CheckpointError when there is none).

    Returns:
        The task (with the checkpoint's tokenizer, if any) and the stored config.
    """
    cfg = stored_config(checkpoint, path, safe_targets)
    weights = model_state(checkpoint, path, use_ema=use_ema)     # refused before building
    model_cfg = dict(cfg["model"])
    for name in ("encoder", "decoder"):
        part = model_cfg.get(name)
        if isinstance(part, dict) and part.get("pretrained"):
            # The checkpoint already holds the trained weights; do not re-read the export or
            # the pretrained model (its sizes are in the stored config).
            model_cfg[name] = {**part, "pretrained": None}
    lora = model_cfg.get("lora")
    if isinstance(lora, dict) and lora.get("pretrained"):
        # Adapters are in the checkpoint too (train stores a PEFT folder's rank and targets).
        model_cfg["lora"] = {**lora, "pretrained": None}
    task = instantiate(OmegaConf.create(model_cfg))
    tokenizer = stored_tokenizer(checkpoint)
    if tokenizer is not None:       # handed over here; on_load_checkpoint only checks it
        task.use_tokenizer(tokenizer)
    task.on_load_checkpoint(checkpoint)
    task.load_state_dict(weights, strict=True)
    task.run_config = cfg
    return task, cfg
