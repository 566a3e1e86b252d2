"""CPU threads that share the machine: how torch's OpenMP threads wait, and how many there are.

torch's intra-op pool is OpenMP (libgomp in the Linux wheels). After each parallel region its
threads spin for libgomp's default 300,000 iterations before they sleep. Alone on a CPU that
spinning saves a wake-up per op; next to another busy process it holds cores that process
needs, and every parallel region of either waits at its barrier for a thread the scheduler has
descheduled: a training step ran ~10x slower, not 2x (issue #24, experiments/cpu_sharing).

Two things are set here, each only where the user has not set it:

* :func:`share_cpu` (called by ``import mmtf``, so before ``import torch`` for every mmtf CLI):
  by default nothing goes into the environment and a :class:`~mmtf.utils.spin_governor.SpinGovernor`
  starts: libgomp's full spin while the cores are idle (no loss alone), its throttled 100-spin
  wait while other processes use at least 0.5 of this process's cores (about the fair share
  next to other work, whenever it starts), switched at run time. The static settings stay one
  variable away: ``MMTF_CPU_SHARING=passive`` (``OMP_WAIT_POLICY=PASSIVE``: sleep at once,
  the earlier default; 1.3-1.6x slower alone), ``=spin`` (``GOMP_SPINCOUNT=10000``), ``=auto``
  (one of the two chosen from the load at start, :func:`other_cpu_load`), ``=0`` (libgomp's
  default spin, no governor). libgomp reads those variables once, when torch loads it, so they
  must be in the environment before ``import torch``; every process mmtf starts inherits them
  (DDP ranks, loader workers, a sweep's jobs) and every mmtf process governs itself. Only speed
  depends on the choice, never a number the run computes. ``OMP_WAIT_POLICY`` /
  ``GOMP_SPINCOUNT`` of the user win (and no governor runs).
* :func:`threads_per_process`: the processes that compute on one machine (DDP ranks on CPU, the
  parallel jobs of a sweep launcher, busy loader workers) share its cores instead of each taking
  all of them. ``OMP_NUM_THREADS`` of the user wins.

Why: see docs/design/cpu-sharing.md
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

# How idle OpenMP threads wait: PASSIVE (sleep at once; libgomp's default spins 300,000 times
# first); under MMTF_CPU_SHARING=auto a short spin when the cores are idle at start.
# experiments/cpu_sharing measures the choices.
WAIT_POLICY = "PASSIVE"
SHORT_SPIN = "10000"
# Cores' worth of other processes' work at start from which threads sleep instead of spinning.
BUSY_CORES = 0.5
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
OPT_OUT = "MMTF_CPU_SHARING"
# Marks the wait setting as mmtf's own choice, so a child process keeps it and says so.
CHOSEN = "MMTF_OMP_WAIT"

# What share_cpu() decided in this process, for describe_threads().
_decision: dict[str, str] = {}


def _cpu_ticks(cores: set[int]) -> tuple[int, int]:
    """(busy, total) clock ticks of ``cores`` since boot, from /proc/stat."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            if int(name[3:]) not in cores:
                continue
            # user nice system idle iowait irq softirq steal (guest is inside user)
            ticks = [int(x) for x in fields[:8]]
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def _own_ticks() -> int:
    """utime + stime of this process (all its threads), in clock ticks."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def other_cpu_load(window: float = 0.05) -> float | None:
    """Cores' worth of work other processes do on this process's cores, measured over
    ``window`` seconds; None where /proc is not there (not Linux)."""
    import time

    try:
        cores = os.sched_getaffinity(0)
        busy0, total0 = _cpu_ticks(cores)
        own0 = _own_ticks()
        time.sleep(window)
        busy1, total1 = _cpu_ticks(cores)
        own1 = _own_ticks()
    except (OSError, AttributeError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return 0.0
    other = max(0, (busy1 - busy0) - (own1 - own0))
    return len(cores) * other / (total1 - total0)


def share_cpu(environ: MutableMapping[str, str] | None = None,
              other_load: float | None = None) -> str:
    """Choose how OpenMP threads wait (see the module doc) unless the user did.

    Args:
        environ: where to read and write the variables (default ``os.environ``).
        other_load: under ``MMTF_CPU_SHARING=auto``, cores' worth of other processes' work
            (default: measured now by :func:`other_cpu_load`).

    Returns how OpenMP threads wait in this process, in words (what the start log prints).
    Called before ``import torch`` it governs this process; afterwards only its children.
    """
    env = os.environ if environ is None else environ
    chosen = {k: env[k] for k in WAIT_ENV if k in env}
    late = "torch" in sys.modules and environ is None
    opt = env.get(OPT_OUT, "").strip().lower()
    if opt in ("0", "false", "off", "no"):
        how = f"libgomp's default spin ({OPT_OUT}={env[OPT_OUT]})"
    elif chosen and env.get(CHOSEN) == ",".join(f"{k}={v}" for k, v in chosen.items()):
        how = f"{env[CHOSEN]} (mmtf's choice, inherited)"
    elif chosen:
        how = ", ".join(f"{k}={v}" for k, v in chosen.items()) + " (yours)"
    elif opt in ("", "govern"):
        # The default: libgomp's own spin, throttled at run time while other work computes.
        if environ is None:
            from mmtf.utils.spin_governor import start_governor

            start_governor()
        how = (f"governed: libgomp's full spin alone, its throttled 100-spin wait while other "
               f"processes use >= 0.5 cores ({OPT_OUT}=passive for PASSIVE, =0 for libgomp's "
               "default)")
    else:
        if opt != "auto":
            busy = opt != "spin"
            why = f"mmtf's choice: {OPT_OUT}={env[OPT_OUT]}" if opt else "mmtf's default"
        else:
            load = other_cpu_load() if other_load is None else other_load
            busy = load is not None and load >= BUSY_CORES
            why = "mmtf's choice: " + (
                "no /proc/stat to measure the load" if load is None else
                f"other processes used {load:.1f} of {len(os.sched_getaffinity(0))} cores at "
                "start")
        key, value = ("OMP_WAIT_POLICY", WAIT_POLICY) if busy else ("GOMP_SPINCOUNT", SHORT_SPIN)
        env[key] = value
        env[CHOSEN] = f"{key}={value}"
        how = (f"{key}={value} ({why}; set OMP_WAIT_POLICY, GOMP_SPINCOUNT or "
               f"{OPT_OUT}=auto to choose)")
        if late:
            how = (f"libgomp's default spin in this process: torch was imported before mmtf "
                   f"({key}={value} reaches the processes it starts; import mmtf first, or "
                   "export OMP_WAIT_POLICY, to share the CPU here too)")
    if environ is None:
        _decision["wait"] = how
    return how


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: taskset, cgroup cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                    # not Linux
        return os.cpu_count() or 1


def threads_per_process(cores: int, *, processes: int = 1, loader_workers: int = 0) -> int:
    """Intra-op threads for each of ``processes`` that compute on ``cores`` at once, each with
    ``loader_workers`` loader processes of its own (one thread each, busy while it trains).

    >>> threads_per_process(16, processes=2, loader_workers=2)
    6
    >>> threads_per_process(2, processes=2)
    1
    """
    if cores < 1 or processes < 1 or loader_workers < 0:
        raise ValueError(f"threads_per_process: cores={cores}, processes={processes}, "
                         f"loader_workers={loader_workers}")
    return max(1, cores // processes - loader_workers)


def parallel_jobs(launcher: Mapping[str, Any] | None) -> int:
    """How many jobs a sweep launcher runs at once on this machine: ``n_jobs`` of joblib-style
    launchers (-1 = one per core), 1 for the sequential ones (the basic, SLURM and Optuna's)."""
    n_jobs = (launcher or {}).get("n_jobs")
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs == 0:
        return 1
    return available_cores() if n_jobs < 0 else n_jobs


def set_threads(threads: int | None, *, processes: int = 1, loader_workers: int = 0,
                environ: MutableMapping[str, str] | None = None) -> str:
    """Set torch's intra-op threads for this process (``threads``, or the share of
    :func:`threads_per_process`), unless the user's ``OMP_NUM_THREADS`` says; return the
    decision in words.

    The count also goes into ``OMP_NUM_THREADS`` so that the processes started after it (the
    DDP ranks Lightning launches, which read it rather than re-deciding) keep it.
    """
    import torch

    env = os.environ if environ is None else environ
    cores = available_cores()
    if threads is None and "OMP_NUM_THREADS" in env:
        how = f"{torch.get_num_threads()} (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, yours)"
    else:
        if threads is not None and threads < 1:
            raise ValueError(f"cpu_threads={threads}: give a positive count or null (auto)")
        n = threads or threads_per_process(cores, processes=processes,
                                           loader_workers=loader_workers)
        torch.set_num_threads(n)
        env["OMP_NUM_THREADS"] = str(n)
        why = ("cpu_threads" if threads else
               f"{cores} cores / {processes} process{'es' if processes > 1 else ''}"
               + (f" - {loader_workers} loader workers" if loader_workers else ""))
        how = f"{n} ({why})"
    if environ is None:
        _decision["threads"] = how
    return how


def describe_threads() -> str:
    """One line for the start log: threads, how they wait and what malloc keeps (what this
    process decided)."""
    import torch

    from mmtf.utils.allocator import describe_allocator
    from mmtf.utils.spin_governor import current_governor

    threads = _decision.get("threads", f"{torch.get_num_threads()} (torch's default)")
    wait = _decision.get("wait") or share_cpu()
    governor = current_governor()
    if wait.startswith("governed") and governor is not None:
        wait = governor.describe()
    return f"threads {threads}; OpenMP waits: {wait}; malloc: {describe_allocator()}"
