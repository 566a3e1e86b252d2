"""Switch libgomp between its full spin (alone) and its throttled wait (beside other work) at run time.

libgomp's threads spin 300,000 times after each parallel region before they sleep: the fastest
wait on idle cores, and ~4-13x slower than the fair share next to another busy process
(experiments/cpu_sharing). ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` are read once, when torch
loads libgomp, so no environment variable can follow a machine whose load changes during a run.

One rule of libgomp does (documented with ``GOMP_SPINCOUNT``): while it manages more threads
than the process has CPUs, every wait spins only 100 times (``gomp_throttled_spin_count_var``),
about as gentle as ``OMP_WAIT_POLICY=PASSIVE``. libgomp counts its threads on every wait, so a
process can move between the two waits at any time by owning more threads or not.
:class:`SpinGovernor` samples ``/proc/stat`` every :data:`INTERVAL` seconds; while other
processes use at least :data:`BUSY_CORES` of this process's cores it keeps a helper thread whose
own OpenMP team (``GOMP_parallel`` of ``cores + 1`` threads running ``free(NULL)``, then docked
asleep) lifts libgomp's count above the CPUs; when the cores are quiet again for two samples the
helper ends, libgomp frees its team and the full spin is back. The helper's threads only sleep,
and no computation changes: only speed depends on this, never a number a run computes.

Started by ``import mmtf`` (:func:`mmtf.utils.threads.share_cpu`) unless the user chose a wait
setting; it acts only once a libgomp is loaded (found in ``/proc/self/maps``: the one torch
loaded, never a second copy), so it also governs a process that imported torch first.

Why: see docs/design/cpu-sharing.md ("Governed spin").
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

INTERVAL = 0.5
# Cores' worth of other processes' work from which waits are throttled, and below which (for
# two samples in a row) the full spin returns.
BUSY_CORES = 0.5
QUIET_CORES = 0.25


def loaded_libgomp() -> str | None:
    """Path of the libgomp this process has loaded (torch's), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith("libgomp"):
                    return path
    except OSError:
        pass
    return None


def _ticks() -> tuple[int, int, int] | None:
    """(busy, total) clock ticks of this process's cores since boot, and its own ticks."""
    from mmtf.utils.threads import _cpu_ticks, _own_ticks  # the reader share_cpu's auto uses

    try:
        return (*_cpu_ticks(os.sched_getaffinity(0)), _own_ticks())
    except (OSError, AttributeError, ValueError, IndexError):
        return None


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

        def own_team() -> None:
            gomp.GOMP_parallel(noop, None, size, 0)
            started.set()
            self._release.wait()                    # the thread's exit frees its team

        self._thread = threading.Thread(target=own_team, name="mmtf-spin-governor-team",
                                        daemon=True)
        self._thread.start()
        started.wait(5.0)

    def end(self) -> None:
        self._release.set()
        self._thread.join(5.0)


class SpinGovernor:
    """Throttle libgomp's waits while other processes compute on this process's cores.

    Args:
        interval: seconds between load samples.
        sample: returns ``(busy, total, own)`` ticks (default: ``/proc``); for tests.
        libgomp: returns the loaded libgomp's path or None (default: ``/proc/self/maps``).
    """

    def __init__(self, interval: float = INTERVAL,
                 sample: Callable[[], tuple[int, int, int] | None] = _ticks,
                 libgomp: Callable[[], str | None] = loaded_libgomp) -> None:
        self.interval = interval
        self._sample = sample
        self._libgomp = libgomp
        self._team: _Team | None = None
        self._quiet = 0
        self._last = sample()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.switches = 0
        self.other_load = 0.0

    @property
    def throttled(self) -> bool:
        return self._team is not None

    def step(self) -> None:
        """Take one load sample and throttle or release."""
        now = self._sample()
        if now is None or self._last is None:
            self._last = now
            return
        busy = now[0] - self._last[0]
        total = now[1] - self._last[1]
        own = now[2] - self._last[2]
        self._last = now
        if total <= 0:
            return
        cores = max(1, len(os.sched_getaffinity(0)))
        self.other_load = cores * max(0, busy - own) / total
        if self._team is None and self.other_load >= BUSY_CORES:
            path = self._libgomp()
            if path is not None:
                self._team = _Team(path, cores + 1)
                self.switches += 1
            self._quiet = 0
        elif self._team is not None:
            self._quiet = self._quiet + 1 if self.other_load < QUIET_CORES else 0
            if self._quiet >= 2:
                self.release()

    def release(self) -> None:
        if self._team is not None:
            self._team.end()
            self._team = None
            self.switches += 1
        self._quiet = 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:               # a governor must never take the run down with it
                return

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
        state = "throttled" if self.throttled else "full spin"
        return (f"governed (libgomp's full spin alone, its throttled 100-spin wait while other "
                f"processes use >= {BUSY_CORES} cores; now {state}, {self.switches} switches)")


_governor: SpinGovernor | None = None


def start_governor() -> SpinGovernor:
    """The process's one governor, started on first call (again after a fork)."""
    global _governor
    if _governor is None or _governor._thread is None or not _governor._thread.is_alive():
        _governor = SpinGovernor().start()
    return _governor


def current_governor() -> SpinGovernor | None:
    return _governor
