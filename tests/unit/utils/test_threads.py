"""mmtf.utils.threads: how OpenMP threads wait and how many each process runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mmtf.utils import threads
from mmtf.utils.threads import (
    CHOSEN,
    SHORT_SPIN,
    WAIT_POLICY,
    other_cpu_load,
    parallel_jobs,
    set_threads,
    share_cpu,
    threads_per_process,
)


def test_by_default_the_wait_is_governed_and_no_variable_is_set():
    for load in (0.0, 2.0):
        env: dict[str, str] = {}
        how = share_cpu(env, other_load=load)
        assert env == {} and how.startswith("governed")


@pytest.mark.parametrize(("load", "expected"), [
    (2.0, {"OMP_WAIT_POLICY": WAIT_POLICY}), (0.6, {"OMP_WAIT_POLICY": WAIT_POLICY}),
    (0.1, {"GOMP_SPINCOUNT": SHORT_SPIN}), (None, {"GOMP_SPINCOUNT": SHORT_SPIN})])
def test_auto_sleeps_next_to_other_work_and_spins_briefly_alone(load, expected, monkeypatch):
    monkeypatch.setattr(threads, "other_cpu_load", lambda: load)   # None: no /proc to read
    env = {"MMTF_CPU_SHARING": "auto"}
    how = share_cpu(env)
    key, value = next(iter(expected.items()))
    assert env == {**expected, CHOSEN: f"{key}={value}", "MMTF_CPU_SHARING": "auto"}
    assert ("no /proc/stat" in how) if load is None else f"used {load:.1f} of" in how


@pytest.mark.parametrize(("opt", "expected"), [("passive", {"OMP_WAIT_POLICY": WAIT_POLICY}),
                                               ("spin", {"GOMP_SPINCOUNT": SHORT_SPIN})])
def test_mmtf_cpu_sharing_can_fix_the_choice(opt, expected):
    env = {"MMTF_CPU_SHARING": opt}
    how = share_cpu(env, other_load=0.0)
    assert {k: v for k, v in env.items() if k in expected} == expected
    assert f"MMTF_CPU_SHARING={opt}" in how


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"},
                                  {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "5"}])
def test_share_cpu_keeps_the_users_wait_policy(user):
    env = dict(user)
    how = share_cpu(env, other_load=2.0)
    assert env == user and how.endswith("(yours)") and all(f"{k}={v}" in how for k, v in user.items())


@pytest.mark.parametrize("off", ["0", "off", "False"])
def test_share_cpu_can_be_turned_off(off):
    env = {"MMTF_CPU_SHARING": off}
    assert "libgomp's default" in share_cpu(env) and "OMP_WAIT_POLICY" not in env


def test_an_inherited_mmtf_choice_is_kept_and_not_called_the_users():
    parent = {"MMTF_CPU_SHARING": "auto"}
    share_cpu(parent, other_load=0.0)
    child = dict(parent)
    how = share_cpu(child, other_load=2.0)        # the child does not re-decide
    assert child == parent and "inherited" in how
    child["GOMP_SPINCOUNT"] = "5"                 # changed by the user since: theirs
    assert share_cpu(child, other_load=0.0).endswith("(yours)")


def test_other_cpu_load_sees_a_busy_process():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)                           # past its start-up
        load = other_cpu_load(0.3)
    finally:
        busy.kill()
        busy.wait()
    # At least most of the spinning core (more if the rest of the machine computes too).
    assert load is not None and load >= 0.5, load


def test_import_mmtf_governs_a_fresh_interpreter_and_sets_no_variable():
    code = ("import os, sys; import mmtf; assert 'torch' not in sys.modules; "
            "from mmtf.utils.spin_governor import current_governor; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), "
            "current_governor() is not None)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", CHOSEN, "MMTF_CPU_SHARING")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None", "True"], out.stdout
    env["GOMP_SPINCOUNT"] = "300000"                  # the user's choice: left alone, no governor
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["None", "300000", "False"], out.stderr


@pytest.mark.parametrize(("cores", "processes", "workers", "expected"), [
    (2, 1, 0, 2), (2, 2, 0, 1), (2, 1, 2, 1), (16, 2, 2, 6), (16, 4, 0, 4), (3, 2, 0, 1),
    (64, 8, 4, 4), (1, 4, 4, 1)])
def test_the_processes_threads_add_up_to_the_cores(cores, processes, workers, expected):
    n = threads_per_process(cores, processes=processes, loader_workers=workers)
    assert n == expected
    # Never more than the cores, unless one thread each is already too many.
    assert n == 1 or processes * (n + workers) <= cores


def test_parallel_jobs_reads_joblib_style_launchers():
    assert parallel_jobs(None) == 1
    assert parallel_jobs({"_target_": "hydra._internal.core_plugins.basic_launcher"}) == 1
    assert parallel_jobs({"n_jobs": 3}) == 3
    assert parallel_jobs({"n_jobs": -1}) == threads.available_cores()


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_set_threads_respects_omp_num_threads(restore_threads):
    torch.set_num_threads(1)
    env = {"OMP_NUM_THREADS": "1"}
    assert "yours" in set_threads(None, processes=1, environ=env)
    assert torch.get_num_threads() == 1 and env == {"OMP_NUM_THREADS": "1"}


def test_set_threads_takes_its_share_and_tells_its_children(restore_threads, monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    env: dict[str, str] = {}
    how = set_threads(None, processes=2, loader_workers=1, environ=env)
    assert torch.get_num_threads() == 1 and env["OMP_NUM_THREADS"] == "1"
    assert how == "1 (4 cores / 2 processes - 1 loader workers)"
    assert set_threads(2, environ=env) == "2 (cpu_threads)" and torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="cpu_threads=0"):
        set_threads(0, environ={})
