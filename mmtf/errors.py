"""The one exception type for a user's wrong input, and the one file-exists check.

Every error that a user can fix by changing a config value, a path or a file derives from
:class:`UserError`: the CLIs (:func:`mmtf.utils.config.run_cli`) print its message as one line
and exit with status 2; anything else is a bug in mmtf and keeps its traceback.
``HYDRA_FULL_ERROR=1`` shows the traceback of a user error too.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["UserError", "require_file"]


class UserError(ValueError):
    """A wrong input (config key, path, file content); the message names it and the fix.

    A ``ValueError`` so that code catching bad values keeps working.
    """


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
