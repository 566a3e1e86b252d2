"""Rebuild a task module from the config and weights an mmtf checkpoint carries, or build one
zero-shot from a pretrained Hugging Face Whisper folder (:func:`build_pretrained_task`) through
the same family registry and ``conf/model/whisper.yaml`` that training composes."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.checkpoint_io import model_state, stored_config
from mmtf.hub import open_hf_model
from mmtf.tasks.captioning import upgrade_config
from mmtf.tasks.resolve import stored_tokenizer
from mmtf.text import build_tokenizer
from mmtf.text.prompt import WhisperPrompt, is_whisper

if TYPE_CHECKING:
    from mmtf.tasks.base import Task

log = logging.getLogger("mmtf.tasks")
CAPTIONING = "mmtf.tasks.CaptioningTask"
# The tasks a Hugging Face family is used zero-shot as: family -> its conf/model config.
ZERO_SHOT = {"whisper": "whisper"}


def build_task(checkpoint: dict[str, Any], path: str | os.PathLike,
               safe_targets: Iterable[str] | None = None, *,
               use_ema: bool = False) -> tuple[Task, dict[str, Any]]:
    """Re-instantiate the task module of a checkpoint and load its weights (strict).

    Args:
        checkpoint, path: the loaded checkpoint and where it was read from.
        safe_targets: extra module prefixes the config may name (None: ``MMTF_SAFE_TARGETS``).
        use_ema: load the EMA of the weights (``callbacks=ema``) instead of the trained ones.

    Returns:
        The task (with the checkpoint's tokenizer, if any) and the stored config.
    """
    cfg = stored_config(checkpoint, path, safe_targets)
    weights = model_state(checkpoint, path, use_ema=use_ema)     # refused before building
    model_cfg = dict(cfg["model"])
    for name in ("encoder", "decoder", "text_encoder"):
        part = model_cfg.get(name)
        if isinstance(part, dict) and part.get("pretrained"):
            # The checkpoint holds the weights and the stored config the sizes.
            model_cfg[name] = {**part, "pretrained": None}
    tokenizer = stored_tokenizer(checkpoint)
    if str(model_cfg.get("_target_", "")).endswith(("CaptioningTask", "SpeechTask")):
        model_cfg = upgrade_config(model_cfg)
    if model_cfg.get("_target_") in (CAPTIONING, "mmtf.tasks.captioning.CaptioningTask"):
        # Written before SpeechTask: with a Whisper vocabulary or transcript metrics, the
        # checkpoint may decode speech and scores with its wer_normalizer.
        speech = is_whisper(tokenizer) if tokenizer is not None else False
        metrics = [*(model_cfg.get("val_metrics") or ()), *(model_cfg.get("test_metrics") or ())]
        if speech or {"wer", "cer"} & set(metrics):
            model_cfg["_target_"] = "mmtf.tasks.speech.SpeechTask"
        else:
            model_cfg.pop("wer_normalizer", None)
    lora = model_cfg.get("lora")
    if isinstance(lora, dict) and lora.get("pretrained"):
        # Adapters are in the checkpoint too (train stores a PEFT folder's rank and targets).
        model_cfg["lora"] = {**lora, "pretrained": None}
    task = instantiate(OmegaConf.create(model_cfg))
    if tokenizer is not None:       # handed over here; on_load_checkpoint only checks it
        task.use_tokenizer(tokenizer)
    task.on_load_checkpoint(checkpoint)
    task.load_state_dict(weights, strict=True)
    task.run_config = cfg
    return task, cfg


def build_pretrained_task(source: str | os.PathLike) -> Task:
    """A task straight from a Hugging Face folder or hub id, before any training: its family's
    ``conf/model`` config (:data:`ZERO_SHOT`) composed as ``mmtf.train`` does, with the folder's
    tokenizer, its zero-shot prompt, and greedy decoding of at most half the decoder's positions
    (openai/whisper's ``sample_len``) with the folder's suppressed tokens.

    Raises:
        UserError: the folder is of no family used zero-shot, or is incomplete.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mmtf.pretrained import FAMILIES
    from mmtf.utils.config_dir import CONF_DIR

    owner = f"ckpt_path={source} (a pretrained model folder)"
    families = {f: FAMILIES[f] for f in ZERO_SHOT}
    hf = open_hf_model(source, owner=owner,
                       model_types=frozenset().union(*(f.model_types for f in families.values())))
    family = next(f for f, entry in families.items() if hf.model_type in entry.model_types)
    overrides = [f"model={ZERO_SHOT[family]}", "tokenizer=pretrained"]
    if GlobalHydra.instance().is_initialized():          # inside a CLI's @hydra.main
        cfg = compose("train", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("train", overrides=overrides)
    OmegaConf.set_struct(cfg, False)
    cfg.pretrained = str(hf.folder)
    tokenizer = build_tokenizer(OmegaConf.to_container(cfg.tokenizer, resolve=True))
    cfg.tokenizer.prompt = WhisperPrompt(tokenizer).token_strings()
    tokenizer = build_tokenizer(OmegaConf.to_container(cfg.tokenizer, resolve=True))
    rules = _generation_json(hf.folder)
    cfg.model.generation = {
        "strategy": "greedy", "max_new_tokens": hf.field("max_target_positions", owner=owner) // 2,
        "suppress_tokens": list(rules.get("suppress_tokens") or ()),
        "begin_suppress_tokens": list(rules.get("begin_suppress_tokens") or ())}
    task = instantiate(OmegaConf.create(OmegaConf.to_container(cfg.model, resolve=True)))
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
