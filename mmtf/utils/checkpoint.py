"""Safe checkpoint loading and rebuilding models from the config a checkpoint carries.

Every ``torch.load`` in mmtf goes through :func:`load_checkpoint`, which passes
``weights_only=True`` explicitly, so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in the environment
cannot turn unpickling of arbitrary objects back on. A config stored in a checkpoint is data: its
``_target_`` entries are checked against an allowlist before anything is instantiated.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.errors import UserError, require_file

if TYPE_CHECKING:
    from mmtf.tasks import Task

# Module prefixes a stored config may instantiate. Anything else is refused.
ALLOWED_TARGET_PREFIXES = ("mmtf.", "torch.optim.", "torch.nn.", "torchvision.transforms.",
                           "torchaudio.transforms.", "lightning.pytorch.callbacks.",
                           "lightning.pytorch.loggers.")


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded safely, named with the reason and the fix."""


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    *, mmap: bool = False) -> dict[str, Any]:
    """Load a Lightning/mmtf checkpoint with ``weights_only=True``.

    Args:
        path: the ``.ckpt`` file.
        map_location: where tensors go.
        mmap: memory-map the file: tensors are read only when touched, so opening a large
            checkpoint to read its small entries (``global_step``, ``mmtf``) is cheap.

    Raises:
        CheckpointError: missing file, or a file that is not a weights-only checkpoint (for
            example a pickle that would run code), with the path in the message.
    """
    path = require_file(path, what="checkpoint", error=CheckpointError,
                        fix="pass ckpt_path=<file.ckpt> or ckpt_path=last inside a run dir that "
                            "has checkpoints/last.ckpt")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # UnpicklingError, RuntimeError, EOFError, zip errors...
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded safely (weights_only=True): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. mmtf never "
            f"unpickles arbitrary objects; use a checkpoint written by mmtf.") from None


def check_targets(cfg: Any, where: str) -> None:
    """Refuse any ``_target_`` outside :data:`ALLOWED_TARGET_PREFIXES` (recursively)."""
    if isinstance(cfg, dict):
        target = cfg.get("_target_")
        if target == "hydra.utils.get_object":
            # Data configs name dtypes this way (torch.float32); import nothing else.
            if not str(cfg.get("path", "")).startswith("torch."):
                raise CheckpointError(f"{where}: hydra.utils.get_object may only name torch "
                                      f"objects, not {cfg.get('path')!r}.")
            return
        if target is not None and not str(target).startswith(ALLOWED_TARGET_PREFIXES):
            raise CheckpointError(f"{where}: _target_ {target!r} is not an mmtf/torch class; "
                                  f"refusing to instantiate a stored config that names it.")
        for key, value in cfg.items():
            check_targets(value, f"{where}.{key}")
    elif isinstance(cfg, list):
        for i, value in enumerate(cfg):
            check_targets(value, f"{where}[{i}]")


def stored_config(checkpoint: dict[str, Any], path: str | os.PathLike) -> dict[str, Any]:
    """The composed config saved in an mmtf checkpoint, checked against the allowlist."""
    cfg = (checkpoint.get("mmtf") or {}).get("config")
    if not isinstance(cfg, dict) or "model" not in cfg:
        raise CheckpointError(f"checkpoint {path} carries no mmtf config (checkpoint['mmtf']"
                              f"['config']); it was not written by mmtf.train.")
    # Only these parts are ever instantiated from a stored config.
    for part in ("model", "data"):
        check_targets(cfg.get(part), f"config.{part}")
    return cfg


def build_task(checkpoint: dict[str, Any], path: str | os.PathLike,
               ) -> tuple[Task, dict[str, Any]]:
    """Re-instantiate the task module of a checkpoint and load its weights (strict).

    Returns:
        The task (with the checkpoint's tokenizer, if any) and the stored config.
    """
    cfg = stored_config(checkpoint, path)
    model_cfg = dict(cfg["model"])
    encoder = model_cfg.get("encoder")
    if isinstance(encoder, dict) and encoder.get("pretrained"):
        # The checkpoint already holds the trained encoder weights; do not re-read the export.
        model_cfg["encoder"] = {**encoder, "pretrained": None}
    task = instantiate(OmegaConf.create(model_cfg))
    task.on_load_checkpoint(checkpoint)
    task.load_state_dict(checkpoint["state_dict"], strict=True)
    task.run_config = cfg
    return task, cfg
