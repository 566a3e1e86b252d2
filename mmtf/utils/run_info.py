"""``<run_dir>/run_info.json``: what produced a run (code version, command, packages).

``{"starts": [{time, command, argv, cwd, host, python, packages, torch_build, git}, ...]}``, one
entry per process start, newest last. Missing git says why (``{"error": ...}``); writing the
record never fails a run."""

from __future__ import annotations

import datetime as dt
import json
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

RUN_INFO_FILE = "run_info.json"
PACKAGES = ("mmtf", "torch", "lightning", "hydra-core", "omegaconf", "torchaudio", "torchvision",
            "numpy")


# The installed package's own folder (a checkout's mmtf/, or site-packages/mmtf).
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def git_state(where: Path) -> dict[str, Any]:
    """``{"commit", "dirty", "root"}`` of the repository holding ``where``, or ``{"error"}``."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    try:
        root = git("rev-parse", "--show-toplevel")
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except FileNotFoundError:
        return {"error": "git is not installed"}
    except subprocess.CalledProcessError as err:
        reason = (err.stderr or "").strip().splitlines()
        return {"error": reason[0] if reason else f"git exited with {err.returncode}"}
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    return {"commit": commit, "dirty": dirty, "root": root}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed distribution versions (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def run_record(argv: list[str] | None = None) -> dict[str, Any]:
    """What produced this process: command line, code version, packages, host."""
    import torch

    argv = list(sys.argv if argv is None else argv)
    return {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *argv]),
        "argv": argv,
        "cwd": str(Path.cwd()),
        "host": platform.node(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "torch_build": {"version": torch.__version__, "cuda": torch.version.cuda},
        "git": {"mmtf": git_state(_PACKAGE_DIR),
                "cwd": git_state(Path.cwd())},
    }


def write_run_info(run_dir: Path, argv: list[str] | None = None) -> Path:
    """Append this process's :func:`run_record` to ``run_dir/run_info.json``."""
    path = run_dir / RUN_INFO_FILE
    starts: list[dict[str, Any]] = []
    if path.is_file():
        try:
            starts = list(json.loads(path.read_text()).get("starts", []))
        except (ValueError, AttributeError):
            starts = []                       # unreadable: start a new record, never fail
    starts.append(run_record(argv))
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"starts": starts}, indent=2) + "\n")
    return path
