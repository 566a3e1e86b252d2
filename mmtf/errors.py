"""Every user-facing error type, and the one file-exists check (layer 0: imports no mmtf code).

An error a user fixes by changing a config, path or file derives from :class:`UserError`; the
CLIs (:func:`mmtf.utils.config.run_cli`) print it as one line and exit 2 (``HYDRA_FULL_ERROR=1``
shows the traceback); anything else is a bug and keeps its traceback."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CheckpointError", "ConfigError", "DataError", "MonitorError", "ResumeError", "UserError",
           "in_config", "require_file"]

SKIP_HINT = "set data.on_error=skip to skip such items and count them instead"


class UserError(ValueError):
    """A wrong input (config key, path, file content); the message names it and the fix.

    A ``ValueError`` so that code catching bad values keeps working.
    """


class ConfigError(UserError):
    """A config that cannot work, found before anything is built; one readable sentence."""


class MonitorError(ConfigError):
    """A monitored metric (checkpointing, early stopping, the sweep's objective) is not logged."""


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded safely, named with the reason and the fix."""


class ResumeError(CheckpointError):
    """Nothing to resume, or a checkpoint that cannot be resumed; names the path and the fix."""


class DataError(UserError):
    """A problem with one input file or one row of an index file.

    Takes one positional message (so DataLoader workers can re-raise it in the main process).

    Args:
        message: the full sentence shown to the user.
        reason: short key for counting (see the module docstring).
        path: the offending file.
        where: the index entry that pointed to it (``"captions.csv line 17"``).
    """

    def __init__(self, message: str, *, reason: str = "invalid", path: str | Path | None = None,
                 where: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.path = None if path is None else str(path)
        self.where = where

    @classmethod
    def make(cls, reason: str, path: str | Path | None, problem: str, fix: str,
             where: str | None = None, skippable: bool = True) -> DataError:
        """Build the standard message: ``<file> (<where>): <problem>; <fix>[ (or skip)].``"""
        loc = str(path) if path is not None else "<no file>"
        if where and path is not None and where.startswith(f"{Path(path).name} "):
            where = where[len(Path(path).name) + 1:]  # "x.csv (line 5)", not "x.csv (x.csv line 5)"
        if where:
            loc += f" ({where})"
        hint = f" (or {SKIP_HINT})" if skippable else ""
        return cls(f"{loc}: {problem}; {fix}{hint}.", reason=reason, path=path, where=where)

    def location(self) -> str:
        """The file and row, for counting examples."""
        loc = self.path or "<no file>"
        return f"{loc} ({self.where})" if self.where else loc


def require_file(path: str | os.PathLike, *, what: str, fix: str,
                 error: type[UserError] = UserError) -> Path:
    """``path`` as a ``Path`` if it is an existing file, else ``error`` naming it and the fix.

    Args:
        path: the file the user pointed to (``~`` is expanded).
        what: what the file is, for the message ("checkpoint", "tokenizer file").
        fix: what to do instead, one clause ("pass ckpt_path=<file.ckpt>").
        error: the :class:`UserError` subclass to raise (``CheckpointError``, ``DataError``...).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        state = "is a directory" if path.is_dir() else "does not exist"
        raise error(f"{what} {path} {state}; {fix}.")
    return path


@contextlib.contextmanager
def in_config(node: str) -> Iterator[None]:
    """Prefix a :class:`UserError` raised inside with the config node it comes from.

    A rule is checked once, by the module that owns it (``Attention`` owns the width rule), which
    does not know where in a config it was built; the part that builds it does. So
    ``with in_config("model.encoder"): TransformerStack(...)`` turns ``Attention: dim (128) must
    be divisible by num_heads (5) ...`` into ``model.encoder: Attention: ...``. The error keeps
    its type and attributes; nested contexts add a prefix only once.
    """
    try:
        yield
    except UserError as err:
        message = str(err.args[0]) if err.args else ""
        if not message.startswith(f"{node}: ") and not message.startswith(f"{node}."):
            err.args = (f"{node}: {message}", *err.args[1:])
        raise
