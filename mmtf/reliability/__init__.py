"""Reliability: runs that die resume exactly where they stopped.

:class:`ResumeState` (RNG states and loader position), :class:`LastCheckpoint` (``last.ckpt``
after every validation), :func:`resolve_resume` (``ckpt_path=last|auto|<file>``),
:class:`PreemptionCheckpoint` (SIGTERM -> ``last.ckpt``, exit 143), :class:`DDPFailFast`,
:class:`NonFiniteLossGuard` / :func:`check_finite_loss`. Checkpoint files: :mod:`mmtf.checkpoint_io`;
resumable loading: :mod:`mmtf.data`."""

from mmtf.reliability.last_checkpoint import LastCheckpoint
from mmtf.reliability.nonfinite import NonFiniteLossError, NonFiniteLossGuard, check_finite_loss
from mmtf.reliability.preemption import PREEMPTED_EXIT_CODE, DDPFailFast, PreemptionCheckpoint
from mmtf.reliability.resume import find_checkpoints, resolve_resume, verify_resumable
from mmtf.reliability.resume_state import ResumeState
from mmtf.reliability.rng import capture_rng_state, restore_rng_state

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "DDPFailFast",
    "LastCheckpoint",
    "NonFiniteLossError",
    "NonFiniteLossGuard",
    "PreemptionCheckpoint",
    "ResumeState",
    "capture_rng_state",
    "check_finite_loss",
    "find_checkpoints",
    "resolve_resume",
    "restore_rng_state",
    "verify_resumable",
]
