"""Where mmtf's Hydra configs live: the one lookup every CLI's ``@hydra.main`` uses.

An installed wheel carries them as the package data ``mmtf/conf/**.yaml``; a checkout (plain or
``pip install -e .``) has them at the repository root, ``conf/``. The installed copy wins when it
exists, so a wheel never picks up an unrelated ``conf/`` beside site-packages.
Why: see docs/design/packaging.md.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CONF_DIR", "find_config_dir"]

_PACKAGE = Path(__file__).resolve().parents[1]   # .../mmtf


def find_config_dir(package: Path = _PACKAGE) -> str:
    """The absolute path of the directory that holds ``train.yaml`` and the config groups:
    ``package/conf`` (the installed copy) or ``package/../conf`` (the checkout's).

    Raises:
        RuntimeError: neither holds ``train.yaml`` (a broken install: a bug, not a user error).
    """
    candidates = (package / "conf", package.parent / "conf")
    for candidate in candidates:
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise RuntimeError(
        f"mmtf's configs are missing: no train.yaml in {' or '.join(map(str, candidates))}; "
        "reinstall mmtf (pip install mmtf) or run from a checkout that has conf/."
    )


CONF_DIR = find_config_dir()
