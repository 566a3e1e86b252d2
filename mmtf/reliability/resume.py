"""Pick the checkpoint to resume from, and fail early and clearly when there is none.

``ckpt_path``: ``None``/``""`` fresh; ``last`` the newest checkpoint of the run dir (none is an
error); ``auto`` the same but none means fresh; or a path. Newest by mtime over
``checkpoints/*.ckpt`` and ``hpc_ckpt_*.ckpt`` (ties: ``last.ckpt``). The file is opened
weights-only with ``mmap`` before anything is built."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import CheckpointError, ResumeError, require_file

__all__ = ["find_checkpoints", "resolve_resume", "verify_resumable"]

# What Lightning's fit needs besides the weights (a save_weights_only file lacks these).
_RESUME_KEYS = ("state_dict", "loops", "optimizer_states", "global_step", "epoch")


def find_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Resumable candidates of a run dir, newest first (``last.ckpt`` first among equals)."""
    run_dir = Path(run_dir)
    found = [*(run_dir / "checkpoints").glob("*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    found = [p for p in found if p.is_file()]          # drops dangling symlinks
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name == "last.ckpt"),
                  reverse=True)


def verify_resumable(path: str | os.PathLike, others: list[Path] | None = None,
                     ) -> dict[str, Any]:
    """Open ``path`` cheaply (weights-only, memory-mapped) and check it can resume a fit.

    Returns:
        ``{"global_step": int, "epoch": int}`` of the checkpoint.

    Raises:
        ResumeError: missing, unreadable/truncated, or weights-only file; the message names the
            path, suggests an older checkpoint from ``others`` if there is one, and the fix.
    """
    path = Path(path)
    alt = next((p for p in (others or []) if p != path), None)
    fallback = (f" An older checkpoint exists: pass ckpt_path={alt}." if alt is not None
                else " Start fresh by dropping ckpt_path.")
    require_file(path, what="checkpoint", error=ResumeError,
                 fix="pass ckpt_path=<file.ckpt>, ckpt_path=last inside the run dir to resume, "
                     "or drop ckpt_path")
    try:
        ckpt = load_checkpoint(path, mmap=True)
    except CheckpointError as err:   # truncated zip, pickled code, not a torch file at all
        raise ResumeError(
            f"checkpoint {path} ({path.stat().st_size} bytes) is corrupt or not a weights-only "
            f"checkpoint; it was probably cut off by a crash while being written without "
            f"mmtf.checkpoint_io.AtomicCheckpointIO.{fallback}") from err
    missing = [k for k in _RESUME_KEYS if not (isinstance(ckpt, dict) and k in ckpt)]
    if missing:
        raise ResumeError(
            f"checkpoint {path} cannot resume training: it lacks {missing} (a weights-only or "
            f"exported file?). Load its weights with model.encoder.pretrained=... in a fresh "
            f"run instead, or pick a full checkpoint.{fallback}")
    return {"global_step": int(ckpt["global_step"]), "epoch": int(ckpt["epoch"])}


def resolve_resume(ckpt_path: str | os.PathLike | None, run_dir: str | os.PathLike,
                   ) -> str | None:
    """The checkpoint file a fit should resume from, or None to start fresh.

    Args:
        ckpt_path: None | "" | "last" | "auto" | a file path (see the module docstring).
        run_dir: the run's output dir (``paths.output_dir``), holding ``checkpoints/``.

    Raises:
        ResumeError: ``last`` with nothing in ``run_dir``, a missing path, or a corrupt,
            truncated or weights-only checkpoint.
    """
    if ckpt_path is None or str(ckpt_path) == "":
        return None
    run_dir = Path(run_dir)
    if str(ckpt_path) in ("last", "auto"):
        candidates = find_checkpoints(run_dir)
        if not candidates:
            if str(ckpt_path) == "auto":
                return None
            ckpts = run_dir / "checkpoints"
            raise ResumeError(
                f"ckpt_path=last but {ckpts / 'last.ckpt'} does not exist and {ckpts} holds no "
                f"*.ckpt (nor {run_dir}/hpc_ckpt_*.ckpt): nothing to resume. Pass "
                f"hydra.run.dir=<the run dir to resume> or ckpt_path=<file.ckpt>; "
                f"ckpt_path=auto starts fresh when "
                f"there is nothing; drop ckpt_path to start fresh.")
        verify_resumable(candidates[0], candidates[1:])
        return str(candidates[0])
    path = Path(ckpt_path).expanduser()
    verify_resumable(path, [p for p in find_checkpoints(path.parent.parent) if p != path]
                     if path.parent.name == "checkpoints" else None)
    return str(path)
