"""Safe checkpoint loading and rebuilding models from the config a checkpoint carries.

Every ``torch.load`` in mmtf goes through :func:`load_checkpoint`, which passes
``weights_only=True`` explicitly, so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in the environment
cannot turn unpickling of arbitrary objects back on. A config stored in a checkpoint is data: its
``_target_`` entries are checked against an allowlist before anything is instantiated.

A user's own modules join the allowlist only through the loading command: the ``safe_targets``
argument, or ``MMTF_SAFE_TARGETS=mylab.models,otherlab.nets`` in the environment of any mmtf
CLI. A list stored in the checkpoint (the training config's ``safe_targets``) is shown in the
refusal, never honoured on its own: a checkpoint cannot allowlist itself. Standard-library and
builtin modules (``os``, ``subprocess``, ``builtins``...) are refused as entries.
Why: see docs/design/safe-targets.md
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
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


SAFE_TARGETS_ENV = "MMTF_SAFE_TARGETS"
_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded safely, named with the reason and the fix."""


def validate_safe_targets(entries: Iterable[str]) -> tuple[str, ...]:
    """Check a user's extra module prefixes; return them without trailing dots.

    Raises:
        CheckpointError: an entry that is not a dotted module path, or that names a
            standard-library or builtin module (they can run commands or read files).
    """
    checked = []
    for entry in entries:
        name = str(entry).strip().rstrip(".")
        if not _MODULE_PATH.fullmatch(name):
            raise CheckpointError(f"safe_targets entry {entry!r} is not a dotted module path "
                                  f"such as mylab.models.")
        top = name.split(".", 1)[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            raise CheckpointError(f"safe_targets entry {name!r} names the standard-library "
                                  f"module {top!r}; only your own packages can be allowed "
                                  f"(e.g. mylab.models).")
        checked.append(name)
    return tuple(checked)


def safe_targets_from_env() -> tuple[str, ...]:
    """The prefixes in ``MMTF_SAFE_TARGETS`` (comma-separated; empty when unset)."""
    raw = os.environ.get(SAFE_TARGETS_ENV, "")
    return validate_safe_targets(p for p in raw.split(",") if p.strip())


def _allowed(target: str, safe_targets: tuple[str, ...]) -> bool:
    return target.startswith(ALLOWED_TARGET_PREFIXES) or any(
        target == p or target.startswith(p + ".") for p in safe_targets)


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


def check_targets(cfg: Any, where: str, safe_targets: Iterable[str] | None = None,
                  stored: Iterable[str] = ()) -> None:
    """Refuse any ``_target_`` outside :data:`ALLOWED_TARGET_PREFIXES` (recursively).

    Args:
        cfg: a plain config tree (dicts and lists).
        where: its name in messages (``config.model``).
        safe_targets: the loading command's extra module prefixes; None = ``MMTF_SAFE_TARGETS``.
        stored: the prefixes the checkpoint's own config lists, named in the refusal only.
    """
    safe = (safe_targets_from_env() if safe_targets is None
            else validate_safe_targets(safe_targets))
    _check_targets(cfg, where, safe, tuple(stored))


def _check_targets(cfg: Any, where: str, safe: tuple[str, ...], stored: tuple[str, ...]) -> None:
    if isinstance(cfg, dict):
        target = cfg.get("_target_")
        if target == "hydra.utils.get_object":
            # Data configs name dtypes this way (torch.float32); import nothing else.
            if not str(cfg.get("path", "")).startswith("torch."):
                raise CheckpointError(f"{where}: hydra.utils.get_object may only name torch "
                                      f"objects, not {cfg.get('path')!r}.")
            return
        if target is not None and not _allowed(str(target), safe):
            module = str(target).rsplit(".", 1)[0]
            hint = (f" The checkpoint's config lists safe_targets {list(stored)}, which a "
                    f"checkpoint cannot grant itself." if stored else "")
            raise CheckpointError(
                f"{where}: _target_ {target!r} is not an mmtf/torch class; refusing to "
                f"instantiate a stored config that names it.{hint} If you trust that code, "
                f"allow its module when loading: {SAFE_TARGETS_ENV}={module} python -m mmtf.<cli> "
                f"... (or safe_targets=[{module!r}] in Python).")
        for key, value in cfg.items():
            _check_targets(value, f"{where}.{key}", safe, stored)
    elif isinstance(cfg, list):
        for i, value in enumerate(cfg):
            _check_targets(value, f"{where}[{i}]", safe, stored)


def stored_config(checkpoint: dict[str, Any], path: str | os.PathLike,
                  safe_targets: Iterable[str] | None = None) -> dict[str, Any]:
    """The composed config saved in an mmtf checkpoint, checked against the allowlist.

    ``safe_targets``: the loading command's extra module prefixes (None: ``MMTF_SAFE_TARGETS``).
    """
    cfg = (checkpoint.get("mmtf") or {}).get("config")
    if not isinstance(cfg, dict) or "model" not in cfg:
        raise CheckpointError(f"checkpoint {path} carries no mmtf config (checkpoint['mmtf']"
                              f"['config']); it was not written by mmtf.train.")
    # Only these parts are ever instantiated from a stored config.
    stored = [str(s) for s in cfg.get("safe_targets") or []]
    for part in ("model", "data"):
        check_targets(cfg.get(part), f"config.{part}", safe_targets, stored)
    return cfg


def build_task(checkpoint: dict[str, Any], path: str | os.PathLike,
               safe_targets: Iterable[str] | None = None) -> tuple[Task, dict[str, Any]]:
    """Re-instantiate the task module of a checkpoint and load its weights (strict).

    ``safe_targets``: extra module prefixes the stored config may name (None:
    ``MMTF_SAFE_TARGETS``); see :func:`check_targets`.

    Returns:
        The task (with the checkpoint's tokenizer, if any) and the stored config.
    """
    cfg = stored_config(checkpoint, path, safe_targets)
    model_cfg = dict(cfg["model"])
    for name in ("encoder", "decoder"):
        part = model_cfg.get(name)
        if isinstance(part, dict) and part.get("pretrained"):
            # The checkpoint already holds the trained weights; do not re-read the export or
            # the pretrained model (its sizes are in the stored config).
            model_cfg[name] = {**part, "pretrained": None}
    task = instantiate(OmegaConf.create(model_cfg))
    task.on_load_checkpoint(checkpoint)
    task.load_state_dict(checkpoint["state_dict"], strict=True)
    task.run_config = cfg
    return task, cfg
