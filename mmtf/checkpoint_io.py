"""Safe checkpoint IO: weights-only loading, the ``_target_`` allowlist, atomic writes (layer 0).

Every ``torch.load`` goes through :func:`load_checkpoint` (``weights_only=True`` explicitly). A
stored config's ``_target_`` entries are checked against an allowlist (:func:`check_targets`,
:func:`stored_config`), extended only by the loading command (``safe_targets`` /
``MMTF_SAFE_TARGETS``), never by the checkpoint itself (docs/design/safe-targets.md).
:class:`AtomicCheckpointIO` and :func:`atomic_torch_save` write a temp file, fsync, and
``os.replace`` it onto the target (docs/design/atomic-checkpoints.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fsspec.utils
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mmtf.errors import CheckpointError, require_file
from mmtf.utils.parts import upgrade_config

log = logging.getLogger(__name__)

# Module prefixes a stored config may instantiate. Anything else is refused.
ALLOWED_TARGET_PREFIXES = ("mmtf.", "torch.optim.", "torch.nn.", "torchvision.transforms.",
                           "torchaudio.transforms.", "lightning.pytorch.callbacks.",
                           "lightning.pytorch.loggers.")


SAFE_TARGETS_ENV = "MMTF_SAFE_TARGETS"
_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


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
    """Load a Lightning/mmtf checkpoint with ``weights_only=True`` (``mmap``: tensors are read
    only when touched).

    Raises:
        CheckpointError: a missing file, or one that is not a weights-only checkpoint.
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
        cfg, where: a plain config tree (dicts and lists) and its name in messages.
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

    ``safe_targets``: the loading command's extra module prefixes (None: ``MMTF_SAFE_TARGETS``)."""
    cfg = (checkpoint.get("mmtf") or {}).get("config")
    if not isinstance(cfg, dict) or "model" not in cfg:
        raise CheckpointError(f"checkpoint {path} carries no mmtf config (checkpoint['mmtf']"
                              f"['config']); it was not written by mmtf.train.")
    # Only these parts are ever instantiated from a stored config.
    stored = [str(s) for s in cfg.get("safe_targets") or []]
    for part in ("model", "data"):
        check_targets(cfg.get(part), f"config.{part}", safe_targets, stored)
    return upgrade_config(cfg)     # a checkpoint written before the constructors took parts


# The EMA callback's averaged weights (mmtf.tasks.ema), beside the trained ``state_dict``.
EMA_STATE_KEY = "ema_state_dict"


def model_state(checkpoint: dict[str, Any], path: str | os.PathLike, *,
                use_ema: bool = False) -> dict[str, torch.Tensor]:
    """The task weights of a checkpoint: the trained ``state_dict``, or with ``use_ema`` the
    exponential moving average that ``callbacks=ema`` saved beside it (same keys).

    Raises:
        CheckpointError: ``use_ema`` and the checkpoint holds no average.
    """
    if not use_ema:
        return checkpoint["state_dict"]
    average = checkpoint.get(EMA_STATE_KEY)
    if average is None:
        raise CheckpointError(f"checkpoint {path} holds no EMA weights ({EMA_STATE_KEY}): train "
                              f"with callbacks=ema (the average is saved from "
                              f"callbacks.ema.start_step on), or set use_ema=false.")
    return average


# ------------------------------------------------------------------ atomic writes
_TMP_SUFFIX = ".tmp"


def _host_tag() -> str:
    # Hostnames can hold dots; keep the temp name parseable ('.' separates fields).
    return socket.gethostname().replace(".", "_") or "host"


def _temp_prefix(target: Path) -> str:
    return f".{target.name}."


def fsync_dir(directory: str | os.PathLike) -> None:
    """``fsync`` a directory so a rename inside it survives a power loss (no-op where the OS
    does not allow opening directories, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:   # some filesystems (e.g. certain network mounts) refuse directory fsync
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # exists, owned by someone else
        return True
    return True


def stale_temp_files(target: str | os.PathLike) -> list[Path]:
    """Temp files of ``target`` left by writers on this host that are no longer running."""
    target = Path(target)
    host = _host_tag()
    stale = []
    for path in target.parent.glob(_temp_prefix(target) + "*" + _TMP_SUFFIX):
        fields = path.name[len(_temp_prefix(target)):-len(_TMP_SUFFIX)].split(".")
        if len(fields) != 3 or fields[0] != host or not fields[1].isdigit():
            continue                       # another host's writer (shared FS): not ours to judge
        pid = int(fields[1])
        if pid == os.getpid() or not _pid_alive(pid):
            stale.append(path)
    return stale


def atomic_torch_save(obj: Any, target: str | os.PathLike) -> None:
    """``torch.save(obj, target)`` so that ``target`` is either the old file or the complete new
    one, whatever kills the process and when; stale temp files of ``target`` are then removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / (f"{_temp_prefix(target)}{_host_tag()}.{os.getpid()}."
                           f"{secrets.token_hex(4)}{_TMP_SUFFIX}")
    try:
        # O_EXCL: never reuse a file; mode 0o666 & ~umask, as a plain open() would create it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(target.parent)
    for stale in stale_temp_files(target):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            log.info("Removed a partial checkpoint left by a killed writer: %s", stale)


def _is_local(path: str | os.PathLike) -> bool:
    return fsspec.utils.get_protocol(str(path)) in ("file", "local")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO with atomic, durable local saves and weights-only loads.

    Use it as a Trainer plugin: ``Trainer(plugins=[AtomicCheckpointIO()])`` or, in
    ``conf/trainer/*.yaml``, ``plugins: [{_target_: mmtf.checkpoint_io.AtomicCheckpointIO}]``.
    Remote URLs (``s3://`` ...) fall back to Lightning's fsspec path, which is atomic on object
    stores by construction."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (see the module docstring)."""
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO.save_checkpoint: storage_options is not "
                            f"supported (got {storage_options!r}); drop it.")
        if not _is_local(path):
            super().save_checkpoint(checkpoint, path)
            return
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path: str | os.PathLike,
                        map_location: Callable | str | torch.device | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Load with ``torch.load(..., weights_only=True)`` (explicit, whatever the env says).

        Raises:
            CheckpointError: ``weights_only=False`` was requested, the file is missing, or it is
                not a weights-only checkpoint (corrupt, truncated, or pickled code).
        """
        if weights_only is False:
            raise CheckpointError(
                f"AtomicCheckpointIO: refusing weights_only=False for {path}; mmtf checkpoints "
                f"hold only tensors and plain data. Call trainer.fit(..., weights_only=True).")
        if not _is_local(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        return load_checkpoint(path, map_location=map_location if map_location is not None
                               else "cpu")
