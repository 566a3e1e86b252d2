"""glibc's malloc keeps the memory a training step frees, instead of faulting it in again.

A CPU training step allocates and frees the same tensors every step: activations, gradients,
AdamW's temporaries (``sqrt``, ``div`` over every parameter). glibc hands a block above its
mmap threshold straight back to the kernel on free (``munmap``) and shrinks the heap whenever
more than its trim threshold lies free at the top, so the next step's allocation of the same
size faults every 4 KiB page in again and the kernel zeroes it. Both thresholds start low
(128 KiB) and only grow with what was freed, so the step keeps faulting: the large model of
``experiments/training_throughput`` took ~48,000 minor page faults and ~110-190 ms of system
time per step (a third of it), the default model ~10,000 and ~30-50 ms.

:func:`keep_freed_memory` (called by ``import mmtf``, like the thread settings) fixes both with
``mallopt``: blocks up to :data:`MMAP_THRESHOLD` (glibc's own ceiling for its dynamic
threshold) come from the heap, and up to :data:`TRIM_THRESHOLD` of free heap stays with the
process. What is kept was in use a moment before, so the peak resident memory grows little (the
default training command: 1.25 -> 1.35 GB, where its epoch took 4.7-5.9 s instead of 5.9-8.4 s);
a process gives memory back to the system only beyond that amount. Only speed depends on it,
never a number a run computes.

The user's own choice wins: glibc's ``MALLOC_*_`` variables or ``glibc.malloc`` tunables in
``GLIBC_TUNABLES``, another allocator in ``LD_PRELOAD`` (jemalloc, tcmalloc, mimalloc), or
``MMTF_MALLOC=0``. Nothing is done where the C library is not glibc.

Why: see docs/design/cpu-sharing.md ("Page faults in every step").
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable, Mapping

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the highest value glibc's dynamic threshold reaches.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
OPT_OUT = "MMTF_MALLOC"
USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
            "MALLOC_MMAP_MAX_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

# What keep_freed_memory() did in this process, for the start log.
_decision: dict[str, str] = {}


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is another one (musl, macOS)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def keep_freed_memory(environ: Mapping[str, str] | None = None,
                      mallopt: Callable[[int, int], int] | None = None) -> str:
    """Raise glibc's mmap and trim thresholds in this process (see the module doc) unless the
    user chose otherwise; return what was done, in words (the start log prints it).

    Args:
        environ: where to read the user's settings (default ``os.environ``).
        mallopt: the ``mallopt`` to call (default glibc's, looked up here).
    """
    env = os.environ if environ is None else environ
    yours = [k for k in USER_ENV if k in env]
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")]
    preload = [lib for lib in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if any(name in os.path.basename(lib) for name in OTHER_ALLOCATORS)]
    opt = env.get(OPT_OUT, "").strip().lower()
    if opt in ("0", "false", "off", "no"):
        how = f"glibc's defaults ({OPT_OUT}={env[OPT_OUT]})"
    elif preload:
        how = f"{os.path.basename(preload[0])} (LD_PRELOAD, yours)"
    elif yours or tunables:
        how = ", ".join([*(f"{k}={env[k]}" for k in yours), *tunables]) + " (yours)"
    else:
        call = mallopt if mallopt is not None else _glibc_mallopt()
        if call is None:
            how = "the C library's defaults (not glibc)"
        elif call(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or call(M_TRIM_THRESHOLD,
                                                                  TRIM_THRESHOLD) != 1:
            how = "glibc's defaults (mallopt refused the thresholds)"
        else:
            how = (f"glibc keeps freed memory (mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim "
                   f"threshold {TRIM_THRESHOLD >> 20} MiB; {OPT_OUT}=0 for glibc's defaults)")
    if environ is None:
        _decision["malloc"] = how
    return how


def describe_allocator() -> str:
    """One phrase for the start log: what this process's allocator keeps."""
    return _decision.get("malloc") or keep_freed_memory()
