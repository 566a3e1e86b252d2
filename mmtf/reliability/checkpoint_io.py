"""Crash-safe Lightning checkpoint files: write beside the target, fsync, rename, fsync the dir.

:class:`AtomicCheckpointIO` writes ``.<name>.<host>.<pid>.<random>.tmp`` in the target's
directory, flushes and ``os.fsync``\\ s it, ``os.replace``\\ s it onto the target (atomic on one
filesystem) and fsyncs the directory so the rename itself is durable. A reader sees the old file
or the new one, never a mix. Temp files left by a killed writer are removed by the next
successful save of the same target (only those of this host whose process is gone); loaders
never look at them. Loading always passes ``weights_only=True`` (through
:func:`mmtf.utils.checkpoint.load_checkpoint`), whatever the environment says.
Why not Lightning's ``TorchCheckpointIO``: see docs/design/atomic-checkpoints.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec.utils
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mmtf.utils.checkpoint import CheckpointError, load_checkpoint

log = logging.getLogger(__name__)

__all__ = ["AtomicCheckpointIO", "atomic_torch_save", "fsync_dir", "stale_temp_files"]

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
    one, whatever kills the process and when; stale temp files of ``target`` are then removed.
    """
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
    ``conf/trainer/*.yaml``, ``plugins: [{_target_: mmtf.reliability.AtomicCheckpointIO}]``.
    Remote URLs (``s3://`` ...) fall back to Lightning's fsspec path, which is atomic on object
    stores by construction.
    """

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
