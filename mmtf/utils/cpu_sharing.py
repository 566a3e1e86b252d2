"""Sharing the CPU with other work: how torch's OpenMP threads wait, how many there are, and
what glibc's malloc keeps. Importing this module changes nothing; :func:`share_cpu` does.

The command-line tools start it from their ``cpu_sharing`` config block (``mmtf.train``,
``evaluate``, ``predict``, ``export``, ``inspect``); in a notebook::

    from mmtf.utils.cpu_sharing import share_cpu
    print(share_cpu())                          # or share_cpu({"wait": "off", "malloc": "off"})

Three parts, each turned off by its key:

* ``wait: govern`` (``off``: libgomp's own wait). libgomp's threads spin 300,000 times after
  each parallel region: the fastest wait on idle cores, ~4-13x slower than the fair share next
  to another busy process. A :class:`SpinGovernor` thread samples ``/proc/stat`` every
  :data:`INTERVAL` s; while other processes use at least :data:`BUSY_CORES` of this process's
  cores it holds a helper thread that owns a docked OpenMP team of ``cores + 1`` threads, and
  libgomp, which throttles every wait to 100 spins while it manages more threads than it has
  CPUs (and counts them on every wait), then waits almost like ``OMP_WAIT_POLICY=PASSIVE``.
  After two quiet samples the helper ends and the full spin is back. It works after ``import
  torch``: it only acts on the libgomp found in ``/proc/self/maps``. A static wait is libgomp's
  own environment variable, exported before the process starts (libgomp reads it when torch
  loads it, before any mmtf code runs): ``OMP_WAIT_POLICY=PASSIVE`` or ``GOMP_SPINCOUNT=N``;
  either turns the governor off, as ``MMTF_CPU_SHARING=0`` does.
* ``threads: share`` (``off``: torch's default; or a count): torch's intra-op threads are this
  process's share of the CPUs it may use (:func:`usable_cores`: affinity mask and cgroup CPU
  quota) among the processes that compute beside it (:func:`threads_per_process`); also put
  into ``OMP_NUM_THREADS`` for the DDP ranks it starts. The user's ``OMP_NUM_THREADS`` wins.
* ``malloc: keep`` (``off``: glibc's defaults): ``mallopt`` raises glibc's mmap threshold to
  32 MiB and its trim threshold to 256 MiB, so a training step's freed tensors stay with the
  process instead of faulting in again every step. The user's ``MALLOC_*_`` variables,
  ``glibc.malloc`` tunables, another allocator in ``LD_PRELOAD`` or ``MMTF_MALLOC=0`` win.

Only speed depends on any of this, never a number a run computes. It does not start in a
DataLoader worker (its parent's governor watches the machine). A failure in a part is logged
once, at warning level with its traceback, and that part is left as it was (the governor ends
its helper team, so libgomp is back to its own wait); a bad setting is a ``ConfigError``.

Why: see docs/design/cpu-sharing.md
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import platform
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mmtf.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULTS = {"wait": "govern", "threads": "share", "malloc": "keep"}
OFF = ("0", "false", "off", "no")
INTERVAL = 0.5
# Cores' worth of other processes' work from which waits are throttled, and below which (for two
# samples in a row) the full spin returns.
BUSY_CORES = 0.5
QUIET_CORES = 0.25
WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# glibc's malloc.h; MMAP_THRESHOLD is DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, the ceiling of its
# own dynamic threshold.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
              "MALLOC_MMAP_MAX_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

# What share_cpu() decided in this process, for describe().
_decided: dict[str, str] = {}


def _off(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in OFF)


# ---------------------------------------------------------------------------- the CPUs
def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"),
                     membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of this process's cgroup CPU quota (the lowest along its cgroup path: v2
    ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None where there is none."""
    if not membership.is_file():
        return None
    limits = []
    for line in membership.read_text().splitlines():
        _, controllers, path = line.split(":", 2)       # "hierarchy-id:controllers:path"
        if controllers == "":
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            base, files = root / controllers, ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        folder = base / path.lstrip("/")
        for d in (folder, *folder.parents):
            if files[0] == "cpu.max" and (d / "cpu.max").is_file():
                quota, period = (d / "cpu.max").read_text().split()[:2]
                if quota != "max":
                    limits.append(int(quota) / int(period))
            elif files[0] != "cpu.max" and (d / files[0]).is_file():
                quota = int((d / files[0]).read_text())
                if quota > 0:
                    limits.append(quota / int((d / files[1]).read_text()))
            if d == base:
                break
    return min(limits) if limits else None


def usable_cores() -> int:
    """The CPUs this process may use: its affinity mask (taskset, cpusets), capped by its
    cgroup's CPU quota (``docker --cpus``, Kubernetes limits), rounded up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                    # not Linux
        return os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return cores if limit is None else max(1, min(cores, math.ceil(limit)))


# ---------------------------------------------------------------------------- thread counts
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
    launchers (-1 = one per usable core), 1 for the sequential ones (basic, SLURM, Optuna's)."""
    n_jobs = (launcher or {}).get("n_jobs")
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs == 0:
        return 1
    return usable_cores() if n_jobs < 0 else n_jobs


def set_threads(threads: int | None, *, processes: int = 1, loader_workers: int = 0,
                environ: MutableMapping[str, str] | None = None) -> str:
    """Set torch's intra-op threads for this process (``threads``, or the share of
    :func:`threads_per_process`), unless the user's ``OMP_NUM_THREADS`` says; return the
    decision in words. The count also goes into ``OMP_NUM_THREADS``: the DDP ranks Lightning
    launches read it rather than re-deciding."""
    import torch

    env = os.environ if environ is None else environ
    if threads is None and "OMP_NUM_THREADS" in env:
        return f"{torch.get_num_threads()} (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, yours)"
    cores = usable_cores()
    n = threads or threads_per_process(cores, processes=processes, loader_workers=loader_workers)
    torch.set_num_threads(n)
    env["OMP_NUM_THREADS"] = str(n)
    why = ("cpu_sharing.threads" if threads else
           f"{cores} cores / {processes} process{'es' if processes > 1 else ''}"
           + (f" - {loader_workers} loader workers" if loader_workers else ""))
    return f"{n} ({why})"


# ---------------------------------------------------------------------------- the spin governor
def loaded_libgomp() -> str | None:
    """Path of the libgomp this process has loaded (torch's), or None."""
    maps = Path("/proc/self/maps")
    if not maps.is_file():                    # not Linux: no libgomp to find
        return None
    for line in maps.read_text().splitlines():
        path = line.rsplit(None, 1)[-1]
        if os.path.basename(path).startswith("libgomp"):
            return path
    return None


def cpu_ticks() -> tuple[int, int, int]:
    """(busy, total) clock ticks since boot of the cores this process may run on, from
    ``/proc/stat``, and this process's own (utime + stime of all its threads)."""
    cores = os.sched_getaffinity(0)
    busy = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cores:
            # user nice system idle iowait irq softirq steal (guest is inside user)
            ticks = [int(x) for x in fields[:8]]
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return busy, total, int(own[11]) + int(own[12])


class _Team:
    """A helper thread that owns a docked OpenMP team of ``size`` threads while it lives."""

    def __init__(self, libgomp: str, size: int) -> None:
        gomp = ctypes.CDLL(libgomp)                 # the loaded copy: same handle, same counters
        gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                       ctypes.c_uint]
        gomp.GOMP_parallel.restype = None
        noop = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)   # free(NULL) does nothing
        self._release = threading.Event()
        started = threading.Event()
        failed: list[BaseException] = []

        def own_team() -> None:
            try:
                gomp.GOMP_parallel(noop, None, size, 0)
            except BaseException as err:            # handed to the caller, raised there
                failed.append(err)
            started.set()
            self._release.wait()                    # the thread's exit frees its team

        self._thread = threading.Thread(target=own_team, name="mmtf-spin-governor-team",
                                        daemon=True)
        self._thread.start()
        ok = started.wait(5.0)
        if failed or not ok:
            self.end()
            raise failed[0] if failed else RuntimeError("libgomp's helper team did not start "
                                                        "within 5 s")

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
        self.interval = interval
        self._sample = sample
        self._libgomp = libgomp
        self._team: _Team | None = None
        self._quiet = 0
        self._last: tuple[int, int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.switches = 0
        self.other_load = 0.0
        self.failure: str | None = None

    @property
    def throttled(self) -> bool:
        return self._team is not None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def step(self) -> None:
        """Take one load sample and throttle or release."""
        now = self._sample()
        last, self._last = self._last, now
        if last is None or now[1] <= last[1]:
            return
        cores = max(1, len(os.sched_getaffinity(0)))
        other = max(0, (now[0] - last[0]) - (now[2] - last[2]))
        self.other_load = cores * other / (now[1] - last[1])
        if self._team is None and self.other_load >= BUSY_CORES:
            path = self._libgomp()
            if path is not None:
                # libgomp throttles above the CPUs of its affinity mask (not the cgroup quota)
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
            self.step()                             # the first sample
            while not self._stop.wait(self.interval):
                self.step()
        except Exception as err:                    # a governor must not take the run with it
            self.failure = f"{type(err).__name__}: {err}"
            log.warning("The spin governor stopped (%s); libgomp waits its own way from now "
                        "on (cpu_sharing.wait=off silences this).", self.failure, exc_info=True)
        finally:
            self.release()

    def start(self) -> SpinGovernor:
        self._thread = threading.Thread(target=self._run, name="mmtf-spin-governor",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.release()

    def describe(self) -> str:
        if self.failure:
            return f"libgomp's own (the spin governor failed: {self.failure})"
        state = "throttled" if self.throttled else "full spin"
        return (f"governed (libgomp's full spin alone, its throttled 100-spin wait while other "
                f"processes use >= {BUSY_CORES} cores; now {state}, {self.switches} switches)")


_governor: SpinGovernor | None = None


def start_governor() -> SpinGovernor:
    """The process's one governor, started on first call (again after a fork)."""
    global _governor
    if _governor is None or not _governor.running:
        _governor = SpinGovernor().start()
    return _governor


def current_governor() -> SpinGovernor | None:
    return _governor


def _wait(setting: Any, environ: Mapping[str, str]) -> str:
    opt = environ.get("MMTF_CPU_SHARING")
    yours = [f"{k}={environ[k]}" for k in WAIT_ENV if k in environ]
    if _off(setting):
        return "libgomp's own (cpu_sharing.wait=off)"
    if opt is not None and _off(opt):
        return f"libgomp's own (MMTF_CPU_SHARING={opt})"
    if yours:
        return ", ".join(yours) + " (yours)"
    if not Path("/proc/stat").is_file():
        return "libgomp's own (no /proc/stat to govern by)"
    start_governor()
    return "governed"


# ---------------------------------------------------------------------------- malloc
def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is another one (musl, macOS)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL("libc.so.6").mallopt


def keep_freed_memory(environ: Mapping[str, str] | None = None,
                      mallopt: Callable[[int, int], int] | None = None) -> str:
    """Raise glibc's mmap and trim thresholds (see the module doc) unless the user chose
    otherwise; return what was done, in words.

    Args:
        environ: where to read the user's settings (default ``os.environ``).
        mallopt: the ``mallopt`` to call (default glibc's, looked up here).
    """
    env = os.environ if environ is None else environ
    yours = [f"{k}={env[k]}" for k in MALLOC_ENV if k in env]
    yours += [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")]
    preload = [lib for lib in env.get("LD_PRELOAD", "").replace(":", " ").split()
               if any(name in os.path.basename(lib) for name in OTHER_ALLOCATORS)]
    if _off(env.get("MMTF_MALLOC", "")):
        return f"glibc's defaults (MMTF_MALLOC={env['MMTF_MALLOC']})"
    if preload:
        return f"{os.path.basename(preload[0])} (LD_PRELOAD, yours)"
    if yours:
        return ", ".join(yours) + " (yours)"
    call = mallopt if mallopt is not None else _glibc_mallopt()
    if call is None:
        return "the C library's defaults (not glibc)"
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
        raise ConfigError(f"cpu_sharing.{unknown[0]}: not a setting; the settings are "
                          f"{', '.join(DEFAULTS)}.")
    s = {**DEFAULTS, **settings}
    if not (_off(s["wait"]) or s["wait"] == "govern"):
        raise ConfigError(f"cpu_sharing.wait={s['wait']!r}: govern or off (a static wait: export "
                          f"OMP_WAIT_POLICY=PASSIVE or GOMP_SPINCOUNT=<n> before the start).")
    count = s["threads"]
    if not (_off(count) or count in ("share", None) or (type(count) is int and count > 0)):
        raise ConfigError(f"cpu_sharing.threads={count!r}: share, off or a positive count.")
    if not (_off(s["malloc"]) or s["malloc"] == "keep"):
        raise ConfigError(f"cpu_sharing.malloc={s['malloc']!r}: keep or off.")
    opt = os.environ.get("MMTF_CPU_SHARING")
    if opt is not None and not _off(opt) and opt.strip().lower() not in ("", "govern"):
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

    Calling it again (the jobs of a sweep) keeps the running governor. A failing part is
    logged (warning, with its traceback) and left as it was; the others still start.

    Raises:
        ConfigError: a setting that is not one (before anything is changed).
    """
    s = _check(settings or {})
    loading = sys.modules.get("torch.utils.data")
    if loading is not None and loading.get_worker_info() is not None:
        return "not started in a DataLoader worker"
    parts: dict[str, Callable[[], str]] = {
        "wait": lambda: _wait(s["wait"], os.environ),
        "threads": lambda: _threads(s["threads"], processes, loader_workers),
        "malloc": lambda: ("glibc's defaults (cpu_sharing.malloc=off)" if _off(s["malloc"])
                           else keep_freed_memory()),
    }
    for key, start in parts.items():
        try:
            _decided[key] = start()
        except Exception as err:
            _decided[key] = f"left as it was ({type(err).__name__}: {err})"
            log.warning("cpu_sharing.%s=%s failed and was left as it was: %s", key, s[key], err,
                        exc_info=True)
    return describe()


def _torch_threads() -> str:
    """torch's thread count, "N (torch's default", where torch is loaded (not loaded here)."""
    torch = sys.modules.get("torch")
    return f"{torch.get_num_threads()} (torch's default" if torch else "(torch's default"


def _threads(setting: Any, processes: int, loader_workers: int) -> str:
    if _off(setting):
        return f"{_torch_threads()}; cpu_sharing.threads=off)"
    return set_threads(None if setting in ("share", None) else int(setting), processes=processes,
                       loader_workers=loader_workers)


def describe() -> str:
    """One line for the start log: threads, how they wait and what malloc keeps, as this
    process decided (a part :func:`share_cpu` has not started says so)."""
    threads = _decided.get("threads") or f"{_torch_threads()})"
    wait = _decided.get("wait", "libgomp's own (share_cpu not started)")
    if wait == "governed" and _governor is not None:
        wait = _governor.describe()
    malloc = _decided.get("malloc", "the C library's defaults (share_cpu not started)")
    return f"threads {threads}; OpenMP waits: {wait}; malloc: {malloc}"
