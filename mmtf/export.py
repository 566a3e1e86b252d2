"""`python -m mmtf.export ckpt_path=... part=encoder out=enc/`: reusable weights without pickle.

Writes ``weights.safetensors`` + ``config.yaml`` (:func:`mmtf.hub.write_export`) and loads the
folder back to check it; load with ``model.encoder.pretrained=out/`` or :func:`load_exported`.
``format=hf`` writes a Hugging Face family back in its layout (:data:`mmtf.pretrained.PAIR_WRITERS`);
LoRA is merged (``merge_lora=true``) or written alone with ``format=peft``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn

from mmtf.checkpoint_io import check_targets, load_checkpoint
from mmtf.errors import CheckpointError, ConfigError, require_file
from mmtf.hub import EXPORT_CONFIG, open_export, write_export
from mmtf.nn.lora import has_lora, strip_lora
from mmtf.pretrained import export_hf, export_peft
from mmtf.tasks.rebuild import build_task
from mmtf.utils.config import require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import share_cpu
from mmtf.utils.parts import upgrade_config

PARTS = ("encoder", "decoder", "text_encoder")
FORMATS = ("mmtf", "hf", "peft")


def merged_task(ckpt_path: str | Path, merge_lora: bool, fmt: str, *,
                use_ema: bool = False) -> tuple[Any, dict[str, Any]]:
    """The checkpoint's task and stored config (``use_ema``: with the EMA of the weights,
    ``callbacks=ema``); LoRA adapters merged into the base weights (the base architecture
    again) when ``merge_lora``.

    Raises:
        ConfigError: the model has adapters and ``merge_lora`` is false (the base layout has
            no place for them).
    """
    task, stored = build_task(load_checkpoint(ckpt_path), ckpt_path, use_ema=use_ema)
    if has_lora(task):
        if not merge_lora:
            raise ConfigError(f"format={fmt}: the checkpoint's model has LoRA adapters, which "
                              f"the {fmt} layout has no place for; add merge_lora=true (the "
                              f"adapters folded into the weights) or use format=peft (the "
                              f"adapters alone).")
        for part in task.export_parts().values():
            strip_lora(part)
    return task, stored


def export_part(ckpt_path: str | Path, part: str, out: str | Path, *,
                merge_lora: bool = False, use_ema: bool = False) -> Path:
    """Export ``part`` of the checkpoint's model to the folder ``out``; return it.
    ``use_ema``: the EMA of the weights (``callbacks=ema``) instead of the trained ones."""
    if part not in PARTS:
        raise ConfigError(f"part ({part!r}) must be one of {PARTS}.")
    task, stored = merged_task(ckpt_path, merge_lora, "mmtf", use_ema=use_ema)
    parts = task.export_parts()
    if part not in parts:
        raise ConfigError(f"part ({part!r}): the checkpoint {ckpt_path} holds a "
                          f"{type(task).__name__}, whose parts are {sorted(parts)}.")
    module = parts[part]
    part_cfg: dict[str, Any] = dict(stored["model"][part])
    if part != "decoder":
        part_cfg.update(pretrained=None, freeze=False)
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    # A text part goes with the tokenizer whose ids it was trained on.
    out = write_export(out, state, part_cfg, metadata={"part": part, "source": str(ckpt_path)},
                       tokenizer=task.tokenizer if part != "encoder" else None)
    reloaded = load_exported(out).state_dict()
    if reloaded.keys() != state.keys() or not all(torch.equal(reloaded[k], v)
                                                  for k, v in state.items()):
        raise RuntimeError(f"export: {out} does not load back into the exported weights.")
    count = sum(p.numel() for p in module.parameters())
    print(f"Exported {part} ({count:,} parameters) to {out}/")
    return out


def export_hf_model(ckpt_path: str | Path, out: str | Path, *, merge_lora: bool = False,
                    use_ema: bool = False) -> Path:
    """Export the checkpoint's whole model in its family's Hugging Face layout; return ``out``
    (``use_ema``: its EMA weights)."""
    task, stored = merged_task(ckpt_path, merge_lora, "hf", use_ema=use_ema)
    return export_hf(task, stored["model"], out)


def export_peft_adapter(ckpt_path: str | Path, out: str | Path, *, use_ema: bool = False) -> Path:
    """Export the checkpoint's LoRA adapters as a PEFT adapter folder; return ``out``
    (``use_ema``: the adapters' EMA)."""
    task, stored = build_task(load_checkpoint(ckpt_path), ckpt_path, use_ema=use_ema)
    return export_peft(task, stored["model"], out)


def load_exported(path: str | Path, *, freeze: bool = False) -> nn.Module:
    """Rebuild an exported encoder or decoder from ``path/config.yaml`` and its weights.

    Args:
        path: a folder written by ``python -m mmtf.export``.
        freeze: no trainable parameters, eval mode.

    Raises:
        CheckpointError: no ``config.yaml``, a ``_target_`` outside mmtf/torch (allowlist), or
            weights that are not safetensors of this module.
    """
    path = Path(path)
    config_file = require_file(path / EXPORT_CONFIG, what="exported config",
                               fix="pass the folder written by python -m mmtf.export",
                               error=CheckpointError)
    export = open_export(path, owner="exported weights", key="the path", error=CheckpointError)
    cfg = upgrade_config(export.config(resolve=True))
    if not cfg:
        raise CheckpointError(f"{config_file} holds no part config (a _target_ and its "
                              f"arguments); pass the folder written by python -m mmtf.export.")
    check_targets(cfg, str(config_file))
    if "pretrained" in cfg:                       # encoders load (and check) their own weights
        return instantiate({**cfg, "pretrained": str(path), "freeze": freeze})
    tensors = export.tensors()                    # safetensors or refused, before instantiate
    module = instantiate(cfg)
    try:
        module.load_state_dict(tensors, strict=True)
    except Exception as err:   # other tensors
        raise CheckpointError(f"exported weights {export.weights_file} do not load into "
                              f"{cfg.get('_target_')}: {str(err).splitlines()[0]}") from None
    if freeze:
        module.requires_grad_(False).eval()
    return module


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="export")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(_export, cfg)


def _export(cfg: DictConfig) -> Path:
    require_values(cfg)
    share_cpu(cfg.get("cpu_sharing"))
    if cfg.format not in FORMATS:
        raise ConfigError(f"format ({cfg.format!r}) must be one of {FORMATS}: mmtf (one part, "
                          f"safetensors + config.yaml), hf (the whole model for transformers) "
                          f"or peft (LoRA adapters for PeftModel.from_pretrained).")
    merge, use_ema = bool(cfg.get("merge_lora", False)), bool(cfg.get("use_ema", False))
    if cfg.format == "hf":
        return export_hf_model(cfg.ckpt_path, cfg.out, merge_lora=merge, use_ema=use_ema)
    if cfg.format == "peft":
        return export_peft_adapter(cfg.ckpt_path, cfg.out, use_ema=use_ema)
    return export_part(cfg.ckpt_path, cfg.part, cfg.out, merge_lora=merge, use_ema=use_ema)


def main() -> None:
    """Console entry point (``mmtf-export``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
