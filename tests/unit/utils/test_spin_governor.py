"""mmtf.utils.spin_governor: libgomp's full spin alone, its throttled wait beside other work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mmtf.utils import spin_governor
from mmtf.utils.spin_governor import BUSY_CORES, SpinGovernor, loaded_libgomp


class FakeTeam:
    made: list[tuple[str, int]] = []

    def __init__(self, libgomp: str, size: int) -> None:
        FakeTeam.made.append((libgomp, size))
        self.ended = False

    def end(self) -> None:
        self.ended = True


class Ticks:
    """A /proc/stat whose other processes use ``other`` cores' worth in each next interval."""

    def __init__(self, cores: int) -> None:
        self.cores, self.busy, self.total, self.own = cores, 0, 0, 0

    def __call__(self) -> tuple[int, int, int]:
        return self.busy, self.total, self.own

    def advance(self, other: float, own: float = 1.0) -> None:
        ticks = 100 * self.cores                   # one interval of all cores
        self.total += ticks
        self.own += int(100 * own)
        self.busy += int(100 * (own + other))


@pytest.fixture
def governor(monkeypatch):
    FakeTeam.made = []
    monkeypatch.setattr(spin_governor, "_Team", FakeTeam)
    cores = len(os.sched_getaffinity(0))
    ticks = Ticks(cores)
    gov = SpinGovernor(sample=ticks, libgomp=lambda: "/lib/libgomp.so.1")
    return gov, ticks, cores


def test_it_throttles_beside_work_and_returns_to_the_spin_after_two_quiet_samples(governor):
    gov, ticks, cores = governor
    ticks.advance(other=0.1)
    gov.step()
    assert not gov.throttled and gov.other_load == pytest.approx(0.1)
    ticks.advance(other=BUSY_CORES + 0.3)          # own work is not counted as other
    gov.step()
    assert gov.throttled and FakeTeam.made == [("/lib/libgomp.so.1", cores + 1)]
    team = gov._team
    for other in (0.1, 0.6, 0.1):                  # not two quiet samples in a row
        ticks.advance(other=other)
        gov.step()
        assert gov.throttled
    ticks.advance(other=0.0)
    gov.step()
    assert not gov.throttled and team.ended and gov.switches == 2
    assert len(FakeTeam.made) == 1


def test_without_a_loaded_libgomp_there_is_nothing_to_throttle(governor, monkeypatch):
    gov, ticks, _ = governor
    gov._libgomp = lambda: None
    ticks.advance(other=2.0)
    gov.step()
    assert not gov.throttled and FakeTeam.made == []


# The real libgomp: a parallel region, then a pause in which libgomp's worker spins (full spin)
# or sleeps almost at once (throttled). The CPU the process burns in the pauses tells them apart.
PROBE = r"""
import json, os, time
import mmtf
import torch
from mmtf.utils.spin_governor import SpinGovernor, loaded_libgomp
torch.set_num_threads(2)
x = torch.ones(2_000_000)

def burnt_per_pause():
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(100):
        x.add_(1.0)                                   # one parallel region on 2 threads
        time.sleep(0.004)
    return time.process_time() - cpu0

tasks = lambda: len(os.listdir("/proc/self/task"))
busy = iter([(0, 0, 0)] + [(200 * k, 200 * k, 0) for k in range(1, 10)])  # others: all cores
gov = SpinGovernor(sample=lambda: next(busy))
burnt_per_pause()
spin, before = burnt_per_pause(), tasks()
gov.step()
throttled, during = burnt_per_pause(), tasks()
gov.release()
for _ in range(200):                                  # the team's threads exit after the helper
    if tasks() == before:
        break
    time.sleep(0.01)
after = tasks()
print(json.dumps({"libgomp": loaded_libgomp(), "spin": spin, "throttled": throttled,
                  "tasks": [before, during, after], "cores": len(os.sched_getaffinity(0))}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="libgomp and /proc: Linux")
def test_the_helper_team_really_throttles_libgomps_spin():
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MMTF_OMP_WAIT")}
    env["MMTF_CPU_SHARING"] = "0"                     # no governor of its own: the test drives one
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["libgomp"] and "libgomp" in os.path.basename(got["libgomp"])
    before, during, after = got["tasks"]
    # the helper thread and its team's cores workers exist only while throttled
    assert during == before + 1 + got["cores"] and after == before, got
    # full spin: the worker spins through much of each 4 ms pause; throttled: it sleeps at once
    assert got["throttled"] < 0.5 * got["spin"], got


def test_no_libgomp_is_found_in_a_process_without_torch():
    code = "from mmtf.utils.spin_governor import loaded_libgomp; print(loaded_libgomp())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "None", out.stderr
    # this pytest process has torch, so its libgomp is found
    import torch  # noqa: F401

    assert loaded_libgomp() is not None or sys.platform != "linux"


def test_the_start_log_says_the_governors_state():
    gov = SpinGovernor(sample=lambda: None, libgomp=lambda: None)
    assert "now full spin, 0 switches" in gov.describe()
