"""Sharing the CPU with other work; importing this module changes nothing, :func:`share_cpu` does.

The CLIs start it from their ``cpu_sharing`` config block; in a notebook::

    from mmtf.utils.cpu_sharing import share_cpu
    print(share_cpu())                          # or share_cpu({"wait": "off", "malloc": "off"})

* ``wait: govern | off``: a :class:`SpinGovernor` thread gives libgomp's threads their full spin
  while the cores are idle and a throttled wait while other processes use them.
* ``threads: share | off | N``: torch's intra-op threads, this process's share of the CPUs it
  may use (:func:`usable_cores`: affinity mask and cgroup quota).
* ``malloc: keep | off``: glibc keeps the memory a step frees instead of faulting it in again.

The user's own ``OMP_*`` / ``GOMP_SPINCOUNT`` / malloc variables or preloaded allocator win. Not
in DataLoader workers. A failing part is logged once and left as it was. Only speed depends on
this, never a computed number. Why: docs/design/cpu-sharing.md"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mmtf.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULTS = {"wait": "govern", "threads": "share", "malloc": "keep"}
INTERVAL = 0.5
# Cores' worth of other processes' work from which waits are throttled, and below which (two
# samples in a row) the full spin returns.
BUSY_CORES = 0.5
QUIET_CORES = 0.25
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# glibc's malloc.h; 32 MiB is DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, glibc's own ceiling.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 256 << 20
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
              "MALLOC_MMAP_MAX_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_decided: dict[str, str] = {}                  # what share_cpu() did here, for describe()


def _off(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in
                              ("0", "false", "off", "no"))


# ---------------------------------------------------------------------------- the CPUs
def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"),
                     membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of this process's cgroup CPU quota, the lowest along its cgroup path (v2
    ``cpu.max``; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None where there is none."""
    limits = []
    lines = membership.read_text().splitlines() if membership.is_file() else []
    for _, controllers, path in (line.split(":", 2) for line in lines):
        if controllers and "cpu" not in controllers.split(","):
            continue
        base = root / controllers                 # v2: controllers == "", the unified tree
        for d in (base / path.lstrip("/"), *(base / path.lstrip("/")).parents):
            if not controllers and (d / "cpu.max").is_file():
                quota, period = (d / "cpu.max").read_text().split()[:2]
                limits += [] if quota == "max" else [int(quota) / int(period)]
            elif controllers and (d / "cpu.cfs_quota_us").is_file():
                quota = int((d / "cpu.cfs_quota_us").read_text())
                limits += [quota / int((d / "cpu.cfs_period_us").read_text())] if quota > 0 else []
            if d == base:
                break
    return min(limits, default=None)


def usable_cores() -> int:
    """The CPUs this process may use: its affinity mask (taskset, cpusets) capped by its cgroup
    CPU quota (``docker --cpus``, Kubernetes limits), rounded up."""
    if not hasattr(os, "sched_getaffinity"):      # not Linux
        return os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    cores = len(os.sched_getaffinity(0))
    return cores if limit is None else max(1, min(cores, math.ceil(limit)))


def threads_per_process(cores: int, *, processes: int = 1, loader_workers: int = 0) -> int:
    """Intra-op threads for each of ``processes`` computing on ``cores`` at once, each with
    ``loader_workers`` loader processes (one thread each, busy while it trains).

    >>> threads_per_process(16, processes=2, loader_workers=2)
    6
    """
    if cores < 1 or processes < 1 or loader_workers < 0:
        raise ValueError(f"threads_per_process: cores={cores}, processes={processes}, "
                         f"loader_workers={loader_workers}")
    return max(1, cores // processes - loader_workers)


def parallel_jobs(launcher: Mapping[str, Any] | None) -> int:
    """Jobs a sweep launcher runs at once here: joblib-style ``n_jobs`` (-1 = one per usable
    core), 1 for the sequential ones (basic, SLURM, Optuna's)."""
    n_jobs = (launcher or {}).get("n_jobs")
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs == 0:
        return 1
    return usable_cores() if n_jobs < 0 else n_jobs


def set_threads(threads: int | None, *, processes: int = 1, loader_workers: int = 0,
                environ: MutableMapping[str, str] | None = None) -> str:
    """Set torch's intra-op threads (``threads``, else the :func:`threads_per_process` share
    unless the user's ``OMP_NUM_THREADS`` says) and ``OMP_NUM_THREADS``, which the DDP ranks
    Lightning launches read; return the decision in words."""
    import torch

    env = os.environ if environ is None else environ
    if threads is None and "OMP_NUM_THREADS" in env:
        return f"{torch.get_num_threads()} (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, yours)"
    cores = usable_cores()
    n = threads or threads_per_process(cores, processes=processes, loader_workers=loader_workers)
    torch.set_num_threads(n)
    env["OMP_NUM_THREADS"] = str(n)
    why = "cpu_sharing.threads" if threads else (
        f"{cores} cores / {processes} process{'es' if processes > 1 else ''}"
        + (f" - {loader_workers} loader workers" if loader_workers else ""))
    return f"{n} ({why})"


# ---------------------------------------------------------------------------- the spin governor
def loaded_libgomp() -> str | None:
    """Path of the libgomp this process has loaded (torch's), or None."""
    maps = Path("/proc/self/maps")
    paths = [line.rsplit(None, 1)[-1] for line in maps.read_text().splitlines()] \
        if maps.is_file() else []
    return next((p for p in paths if os.path.basename(p).startswith("libgomp")), None)


def cpu_ticks() -> tuple[int, int, int]:
    """(busy, total) clock ticks since boot of this process's cores (``/proc/stat``), and its
    own (utime + stime of all its threads)."""
    cores, busy, total = os.sched_getaffinity(0), 0, 0
    for name, *fields in (line.split() for line in Path("/proc/stat").read_text().splitlines()):
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cores:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return busy, total, int(own[11]) + int(own[12])


class _Team:
    """A helper thread owning a docked OpenMP team of ``size`` threads while it lives: libgomp
    throttles every wait to 100 spins while it manages more threads than CPUs."""

    def __init__(self, libgomp: str, size: int) -> None:
        gomp = ctypes.CDLL(libgomp)                 # the loaded copy: same handle, same counters
        gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                       ctypes.c_uint]
        gomp.GOMP_parallel.restype = None
        noop = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)   # free(NULL) does nothing
        self._release, started, failed = threading.Event(), threading.Event(), []

        def own_team() -> None:
            try:
                gomp.GOMP_parallel(noop, None, size, 0)
            except BaseException as err:            # raised by the caller, below
                failed.append(err)
            started.set()
            self._release.wait()                    # the thread's exit frees its team

        self._thread = threading.Thread(target=own_team, name="mmtf-spin-governor-team",
                                        daemon=True)
        self._thread.start()
        if not started.wait(5.0) or failed:
            self.end()
            raise failed[0] if failed else RuntimeError("libgomp's team did not start in 5 s")

    def end(self) -> None:
        self._release.set()
        self._thread.join(5.0)


class SpinGovernor:
    """Throttle libgomp's waits while other processes compute on this process's cores.

    Args:
        interval: seconds between load samples.
        sample: returns ``(busy, total, own)`` ticks (default :func:`cpu_ticks`); for tests.
        libgomp: returns the loaded libgomp's path or None (default :func:`loaded_libgomp`).
    """

    def __init__(self, interval: float = INTERVAL,
                 sample: Callable[[], tuple[int, int, int]] = cpu_ticks,
                 libgomp: Callable[[], str | None] = loaded_libgomp) -> None:
        self.interval, self._sample, self._libgomp = interval, sample, libgomp
        self._team: _Team | None = None
        self._last: tuple[int, int, int] | None = None
        self._quiet = self.switches = 0
        self.other_load = 0.0
        self.failure: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def throttled(self) -> bool:
        return self._team is not None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def step(self) -> None:
        """Take one load sample (the first only sets the baseline) and throttle or release."""
        now = self._sample()
        last, self._last = self._last, now
        if last is None or now[1] <= last[1]:
            return
        cores = len(os.sched_getaffinity(0))
        other = max(0, now[0] - last[0] - (now[2] - last[2]))      # busy ticks not our own
        self.other_load = cores * other / (now[1] - last[1])
        if self._team is None and self.other_load >= BUSY_CORES:
            path = self._libgomp()
            if path is not None:
                # more threads than the CPUs libgomp counts: its affinity mask, not the quota
                self._team = _Team(path, cores + 1)
                self.switches += 1
            self._quiet = 0
        elif self._team is not None:
            self._quiet = self._quiet + 1 if self.other_load < QUIET_CORES else 0
            if self._quiet >= 2:
                self.release()

    def release(self) -> None:
        """Back to libgomp's own wait: end the helper team, if there is one."""
        if self._team is not None:
            self._team.end()
            self._team = None
            self.switches += 1
        self._quiet = 0

    def _run(self) -> None:
        try:
            while True:
                self.step()
                time.sleep(self.interval)
        except Exception as err:                    # logged, not raised: the run goes on
            self.failure = f"{type(err).__name__}: {err}"
            log.warning("The spin governor stopped (%s); libgomp waits its own way from now on "
                        "(cpu_sharing.wait=off turns it off).", self.failure, exc_info=True)
        finally:
            self.release()

    def start(self) -> SpinGovernor:
        self._thread = threading.Thread(target=self._run, name="mmtf-spin-governor", daemon=True)
        self._thread.start()
        return self

    def describe(self) -> str:
        if self.failure:
            return f"libgomp's own (the spin governor failed: {self.failure})"
        return (f"governed (libgomp's full spin alone, its throttled 100-spin wait while other "
                f"processes use >= {BUSY_CORES} cores; now "
                f"{'throttled' if self.throttled else 'full spin'}, {self.switches} switches)")


_governor: SpinGovernor | None = None


def _wait(setting: Any) -> str:
    opt = os.environ.get("MMTF_CPU_SHARING")
    yours = [f"{k}={os.environ[k]}" for k in WAIT_ENV if k in os.environ]
    if _off(setting) or (opt is not None and _off(opt)):
        why = "cpu_sharing.wait=off" if _off(setting) else f"MMTF_CPU_SHARING={opt}"
        return f"libgomp's own ({why})"
    if yours:
        return ", ".join(yours) + " (yours)"
    if not Path("/proc/stat").is_file():
        return "libgomp's own (no /proc/stat to govern by)"
    global _governor
    if _governor is None or not _governor.running:     # one per process (again after a fork)
        _governor = SpinGovernor().start()
    return "governed"


# ---------------------------------------------------------------------------- malloc
def keep_freed_memory(environ: Mapping[str, str] | None = None,
                      mallopt: Callable[[int, int], int] | None = None) -> str:
    """Raise glibc's mmap and trim thresholds unless the user chose otherwise; what was done.

    Args:
        environ: where to read the user's settings (default ``os.environ``).
        mallopt: the ``mallopt`` to call (default glibc's, where the C library is glibc).
    """
    env = os.environ if environ is None else environ
    yours = [f"{k}={env[k]}" for k in MALLOC_ENV if k in env] + [
        t for t in env.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")]
    preload = [os.path.basename(lib) for lib in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if any(name in os.path.basename(lib) for name in OTHER_ALLOCATORS)]
    if _off(env.get("MMTF_MALLOC", "")):
        return f"glibc's defaults (MMTF_MALLOC={env['MMTF_MALLOC']})"
    if preload or yours:
        return f"{preload[0]} (LD_PRELOAD, yours)" if preload else ", ".join(yours) + " (yours)"
    if mallopt is None and (platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"):
        return "the C library's defaults (not glibc)"
    call = mallopt or ctypes.CDLL("libc.so.6").mallopt
    refused = [name for name, param, value in (("mmap", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                               ("trim", M_TRIM_THRESHOLD, TRIM_THRESHOLD))
               if call(param, value) != 1]
    if refused:
        raise OSError(f"mallopt refused the {' and '.join(refused)} threshold")
    return (f"glibc keeps freed memory (mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim "
            f"threshold {TRIM_THRESHOLD >> 20} MiB)")


# ---------------------------------------------------------------------------- the entry
def _check(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` over :data:`DEFAULTS`; a ConfigError names a key or value that is not one."""
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"cpu_sharing.{unknown[0]}: not a setting ({', '.join(DEFAULTS)}).")
    s = {**DEFAULTS, **settings}
    if not (_off(s["wait"]) or s["wait"] == "govern"):
        raise ConfigError(f"cpu_sharing.wait={s['wait']!r}: govern or off (a static wait: export "
                          f"OMP_WAIT_POLICY=PASSIVE or GOMP_SPINCOUNT=<n> before the start).")
    n = s["threads"]
    if not (_off(n) or n in ("share", None) or (type(n) is int and n > 0)):
        raise ConfigError(f"cpu_sharing.threads={n!r}: share, off or a positive count.")
    if not (_off(s["malloc"]) or s["malloc"] == "keep"):
        raise ConfigError(f"cpu_sharing.malloc={s['malloc']!r}: keep or off.")
    opt = os.environ.get("MMTF_CPU_SHARING", "").strip().lower()
    if opt not in ("", "govern") and not _off(opt):
        raise ConfigError(f"MMTF_CPU_SHARING={opt}: libgomp reads a static wait only when torch "
                          f"loads it, before mmtf starts; export OMP_WAIT_POLICY=PASSIVE (or "
                          f"GOMP_SPINCOUNT=<n>) instead, or unset it.")
    return s


def share_cpu(settings: Mapping[str, Any] | None = None, *, processes: int = 1,
              loader_workers: int = 0) -> str:
    """Start sharing the CPU in this process as ``settings`` say; return the start-log phrase.

    Args:
        settings: the ``cpu_sharing`` config block (``wait``, ``threads``, ``malloc``; a key
            left out takes :data:`DEFAULTS`).
        processes: processes computing on this machine at once (DDP ranks of this node x the
            jobs of a parallel sweep launcher), for ``threads: share``.
        loader_workers: this process's loader workers, for ``threads: share``.

    Calling it again (the jobs of a sweep) keeps the running governor.

    Raises:
        ConfigError: a setting that is not one (before anything is changed).
    """
    s = _check(settings or {})
    loading = sys.modules.get("torch.utils.data")
    if loading is not None and loading.get_worker_info() is not None:
        return "not started in a DataLoader worker"
    threads = None if s["threads"] in ("share", None) else s["threads"]
    parts: dict[str, Callable[[], str]] = {
        "wait": lambda: _wait(s["wait"]),
        "threads": lambda: (f"{_torch_threads()}; cpu_sharing.threads=off)" if _off(threads)
                            else set_threads(threads, processes=processes,
                                             loader_workers=loader_workers)),
        "malloc": lambda: ("glibc's defaults (cpu_sharing.malloc=off)" if _off(s["malloc"])
                           else keep_freed_memory()),
    }
    for key, start in parts.items():
        try:
            _decided[key] = start()
        except Exception as err:                    # logged, not raised: the run goes on
            _decided[key] = f"left as it was ({type(err).__name__}: {err})"
            log.warning("cpu_sharing.%s=%s failed and was left as it was: %s", key, s[key], err,
                        exc_info=True)
    return describe()


def _torch_threads() -> str:
    torch = sys.modules.get("torch")
    return f"{torch.get_num_threads()} (torch's default" if torch else "(torch's default"


def describe() -> str:
    """The start log's line: threads, how they wait, what malloc keeps, as decided here."""
    wait = _decided.get("wait", "libgomp's own (share_cpu not started)")
    return (f"threads {_decided.get('threads') or _torch_threads() + ')'}; OpenMP waits: "
            f"{_governor.describe() if wait == 'governed' and _governor else wait}; malloc: "
            f"{_decided.get('malloc', 'the C library defaults (share_cpu not started)')}")
