"""Reliability: runs that die resume exactly where they stopped.

* :class:`ResumeState`: callback; RNG states (python, numpy, torch, CUDA; per rank) in every
  checkpoint and back on resume; validation does not shift the training stream; keeps the
  train loader's position and its sampler's epoch in step with the loop.
* :class:`LastCheckpoint`: callback; ``last.ckpt`` after every validation run and every N
  steps, whatever the monitored metric did.
* :func:`resolve_resume`: ``ckpt_path=last|auto|<file>`` -> a verified checkpoint or a clear
  error (nothing to resume, truncated file, weights-only file).
* :class:`PreemptionCheckpoint`: callback; SIGTERM -> ``last.ckpt`` at the end of the current
  batch, exit status 143. :class:`DDPFailFast`: a failing launcher rank kills its DDP children.
* :class:`NonFiniteLossGuard` / :func:`check_finite_loss`: NaN/inf loss -> a clear error naming
  step, batch and ids, or a skipped optimizer step, agreed on by all DDP ranks.

Checkpoint files are written atomically and read weights-only by :mod:`mmtf.checkpoint_io`
(layer 0). The resumable loading itself (sampler state, loaders, per-item randomness) is in
:mod:`mmtf.data`.
"""

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
