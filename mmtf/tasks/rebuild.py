"""Rebuild a task module from the config and weights an mmtf checkpoint carries, or build one
zero-shot from a pretrained Hugging Face Whisper folder (:func:`build_pretrained_task`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.checkpoint_io import model_state, stored_config
from mmtf.hub import open_hf_model
from mmtf.pretrained.whisper import DEFAULT_PROMPT, MODEL_TYPES, whisper_decoder, whisper_encoder
from mmtf.tasks.captioning import CaptioningTask
from mmtf.tasks.resolve import stored_tokenizer
from mmtf.text import PretrainedTokenizer

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


def build_pretrained_task(source: str | os.PathLike) -> Task:
    """A captioning task straight from a Hugging Face Whisper folder or hub id, before any
    training: Whisper's encoder, decoder and tokenizer (prompt: English transcription without
    timestamps; ``<|startoftranscript|>`` alone for English-only models), Whisper's
    ``suppress_tokens`` / ``begin_suppress_tokens`` from ``generation_config.json`` and at most
    half the decoder's positions per window (openai/whisper's ``sample_len``).

    Raises:
        UserError: the folder is no Whisper model (its ``model_type``) or is incomplete.
    """
    owner = f"ckpt_path={source} (a pretrained Whisper folder)"
    hf = open_hf_model(source, model_types=MODEL_TYPES, owner=owner)
    tokenizer = PretrainedTokenizer.from_folder(hf.folder)
    prompt = DEFAULT_PROMPT if tokenizer.multilingual else (DEFAULT_PROMPT[0], DEFAULT_PROMPT[-1])
    tokenizer = PretrainedTokenizer.from_folder(hf.folder, prompt=prompt)
    decoder = whisper_decoder(pretrained=hf.folder)
    rules = _generation_json(hf.folder)
    generation = {"strategy": "greedy", "max_new_tokens": decoder.max_len // 2,
                  "suppress_tokens": list(rules.get("suppress_tokens") or ()),
                  "begin_suppress_tokens": list(rules.get("begin_suppress_tokens") or ())}
    task = CaptioningTask(encoder=whisper_encoder(pretrained=hf.folder), decoder=decoder,
                          optimizer=partial(torch.optim.AdamW, lr=1e-5), generation=generation)
    task.use_tokenizer(tokenizer)
    task.run_config = {"pretrained": str(source)}
    return task


def _generation_json(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
