"""mmtf.utils.cpu_sharing: nothing at import; the CLIs start it; each part has an off switch;
threads bounded by the usable CPUs; a failure is logged once and undone."""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmtf.errors import ConfigError, UserError
from mmtf.utils import cpu_sharing
from mmtf.utils.cpu_sharing import (
    BUSY_CORES,
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    SpinGovernor,
    cgroup_cpu_limit,
    keep_freed_memory,
    loaded_libgomp,
    parallel_jobs,
    set_threads,
    share_cpu,
    threads_per_process,
    usable_cores,
)

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
USER_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MMTF_CPU_SHARING", "MMTF_MALLOC",
            "OMP_NUM_THREADS", "GLIBC_TUNABLES", "LD_PRELOAD", *cpu_sharing.MALLOC_ENV)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV}
    return {**env, **extra}


# ---------------------------------------------------------------------------- import is inert
INERT = r"""
import ctypes, json, os, sys, threading, warnings
looked_up = []
class Recording(ctypes.CDLL):                     # who asks a C library for mallopt / GOMP_*
    def __getattr__(self, name):
        looked_up.append(name)
        return super().__getattr__(name)
    def __getitem__(self, name):
        looked_up.append(name)
        return super().__getitem__(name)
ctypes.CDLL = Recording
# Third-party packages first: what they do at import is theirs, not mmtf's.
import torch, lightning, hydra, omegaconf, torchdata.stateful_dataloader  # noqa
def state():
    env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "MALLOC_", "KMP_"))}
    return {"threads": threading.active_count(), "env": env,
            "filters": [repr(f) for f in warnings.filters], "torch_threads": torch.get_num_threads()}
before = state()
import mmtf, mmtf.train, mmtf.predict, mmtf.evaluate, mmtf.export  # noqa
import mmtf.inspect.__main__  # noqa
print(json.dumps({"before": before, "after": state(),
                  "mmtf_lookups": [n for n in looked_up if n == "mallopt" or n.startswith("GOMP")],
                  "names": [t.name for t in threading.enumerate()]}))
"""


@pytest.mark.slow
def test_importing_mmtf_changes_nothing_in_the_process():
    out = subprocess.run([sys.executable, "-c", INERT], env=clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] == got["before"], got
    assert got["mmtf_lookups"] == [] and not any("mmtf" in n for n in got["names"]), got


# ---------------------------------------------------------------------------- share_cpu
class FakeGovernor:
    started: list[FakeGovernor] = []

    def __init__(self) -> None:
        self.running = False

    def start(self) -> FakeGovernor:
        self.running = True
        FakeGovernor.started.append(self)
        return self

    def describe(self) -> str:
        return "governed (fake)"


class RecordingMallopt:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


@pytest.fixture
def fresh(monkeypatch):
    """A process in which share_cpu never ran: no user settings, a fake governor and mallopt."""
    for key in USER_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(cpu_sharing, "_decided", {})
    monkeypatch.setattr(cpu_sharing, "_governor", None)
    monkeypatch.setattr(cpu_sharing, "SpinGovernor", FakeGovernor)
    FakeGovernor.started = []
    mallopt = RecordingMallopt()
    monkeypatch.setattr(cpu_sharing, "keep_freed_memory",
                        functools.partial(keep_freed_memory, mallopt=mallopt))
    monkeypatch.setattr(cpu_sharing, "usable_cores", lambda: 4)
    threads = torch.get_num_threads()
    yield mallopt
    torch.set_num_threads(threads)


def test_share_cpu_starts_every_part_by_default(fresh):
    how = share_cpu()
    assert len(FakeGovernor.started) == 1 and len(fresh.calls) == 2
    assert torch.get_num_threads() == 4 and os.environ["OMP_NUM_THREADS"] == "4"
    assert how.startswith("threads 4 (4 cores / 1 process); OpenMP waits: governed (fake); "
                          "malloc: glibc keeps freed memory"), how
    share_cpu()                                   # the next job of a sweep: the same governor
    assert len(FakeGovernor.started) == 1


@pytest.mark.parametrize("part", ["wait", "threads", "malloc"])
@pytest.mark.parametrize("off", ["off", False])
def test_each_part_has_an_off_switch(fresh, part, off):
    torch.set_num_threads(1)
    how = share_cpu({part: off})
    assert (FakeGovernor.started == []) == (part == "wait")
    assert (fresh.calls == []) == (part == "malloc")
    assert (torch.get_num_threads() == 1) == (part == "threads")
    assert f"cpu_sharing.{part}=off" in how


@pytest.mark.parametrize(("env", "said"), [
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "OpenMP waits: OMP_WAIT_POLICY=PASSIVE (yours)"),
    ({"GOMP_SPINCOUNT": "10000"}, "OpenMP waits: GOMP_SPINCOUNT=10000 (yours)"),
    ({"MMTF_CPU_SHARING": "0"}, "OpenMP waits: libgomp's own (MMTF_CPU_SHARING=0)")])
def test_the_users_wait_setting_turns_the_governor_off(fresh, monkeypatch, env, said):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert said in share_cpu() and FakeGovernor.started == []


def test_the_users_thread_count_wins_over_the_share_and_a_count_over_both(fresh, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    assert "threads 1 (OMP_NUM_THREADS=1, yours)" in share_cpu()
    assert torch.get_num_threads() == 1
    assert "threads 3 (cpu_sharing.threads)" in share_cpu({"threads": 3})
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize(("settings", "env", "names"), [
    ({"wait": "passive"}, {}, "OMP_WAIT_POLICY=PASSIVE"),
    ({"threads": 0}, {}, "cpu_sharing.threads=0"),
    ({"threads": "many"}, {}, "cpu_sharing.threads='many'"),
    ({"malloc": "jemalloc"}, {}, "cpu_sharing.malloc='jemalloc'"),
    ({"spin": 1}, {}, "cpu_sharing.spin"),
    ({}, {"MMTF_CPU_SHARING": "passive"}, "export OMP_WAIT_POLICY=PASSIVE")])
def test_a_bad_setting_is_a_config_error_before_anything_changes(fresh, monkeypatch, settings,
                                                                 env, names):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=re.escape(names)):
        share_cpu(settings)
    assert FakeGovernor.started == [] and fresh.calls == [] and "OMP_NUM_THREADS" not in os.environ


def test_it_does_not_start_in_a_loader_worker():
    class Probe(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> str:
            return share_cpu()

    loader = torch.utils.data.DataLoader(Probe(), num_workers=1, batch_size=None,
                                         multiprocessing_context="fork")
    assert list(loader) == ["not started in a DataLoader worker"]


# ---------------------------------------------------------------------------- the CLIs start it
def test_the_train_cli_starts_it_with_its_config(fresh, monkeypatch, tmp_path):
    import mmtf.train
    from tests.integration.conftest import compose_train, tiny_overrides

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop                                # after the start, before any data or fit

    monkeypatch.setattr(mmtf.train, "connect_tokenizer", stop)
    for extra, governed, threads in ((), 1, 4), (("cpu_sharing.wait=off",
                                                  "cpu_sharing.threads=2"), 0, 2):
        FakeGovernor.started = []
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        cfg = compose_train(tiny_overrides("image_classification", tmp_path / "data", *extra),
                            tmp_path / f"run{governed}")
        assert set(cfg.cpu_sharing) == {"wait", "threads", "malloc"}   # in the run's config
        with pytest.raises(Stop):
            mmtf.train.train(cfg)
        assert len(FakeGovernor.started) == governed and torch.get_num_threads() == threads


def test_the_old_cpu_threads_key_is_mapped():
    from mmtf.train import renamed_keys

    assert renamed_keys(["x", "cpu_threads=3", "cpu_threads=null", "seed=1"]) == [
        "x", "cpu_sharing.threads=3", "cpu_sharing.threads=share", "seed=1"]


@pytest.mark.parametrize(("module", "body", "config", "args"), [
    ("mmtf.evaluate", "evaluate", "eval", ["split=oops"]),
    ("mmtf.predict", "print_predictions", "predict", ["inputs=[missing.wav]"]),
    ("mmtf.export", "_export", "export", ["out=x"]),
    ("mmtf.inspect.__main__", "_inspect", "inspect", []),
    ("mmtf.retrieve", "retrieve", "retrieve", ["query=a dog barks", "media=x"])])
def test_the_other_clis_start_it_with_their_config(monkeypatch, tmp_path, module, body, config,
                                                   args):
    import importlib

    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from mmtf.utils.config_dir import CONF_DIR

    cli = importlib.import_module(module)
    seen = []
    monkeypatch.setattr(cli, "share_cpu", seen.append)
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose(config, overrides=[f"ckpt_path={tmp_path / 'missing.ckpt'}", *args,
                                         "cpu_sharing.malloc=off"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
    with pytest.raises(UserError):               # the missing checkpoint (or the bad split)
        getattr(cli, body)(cfg)
    assert seen == [cfg.cpu_sharing] and cfg.cpu_sharing.malloc == "off"


# ---------------------------------------------------------------------------- the usable CPUs
def test_a_cgroup_v2_quota_is_the_lowest_along_the_path(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "a" / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "a" / "b" / "cpu.max").write_text("max 100000\n")
    membership = tmp_path / "cgroup"
    membership.write_text("0::/a/b\n")
    assert cgroup_cpu_limit(tmp_path, membership) == 1.5
    (tmp_path / "a" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path, membership) is None


def test_a_cgroup_v1_quota_is_read(tmp_path):
    folder = tmp_path / "cpu,cpuacct" / "docker" / "x"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("250000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    membership = tmp_path / "cgroup"
    membership.write_text("5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n")
    assert cgroup_cpu_limit(tmp_path, membership) == 2.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")          # no quota
    assert cgroup_cpu_limit(tmp_path, membership) is None
    assert cgroup_cpu_limit(tmp_path, tmp_path / "absent") is None   # not Linux


@pytest.mark.parametrize(("affinity", "quota", "expected"), [
    (8, None, 8), (8, 2.5, 3), (8, 0.2, 1), (2, 16.0, 2)])
def test_usable_cores_are_the_affinity_capped_by_the_quota(monkeypatch, affinity, quota, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(cpu_sharing, "cgroup_cpu_limit", lambda: quota)
    assert usable_cores() == expected
    assert parallel_jobs({"n_jobs": -1}) == expected


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


def test_set_threads_takes_its_share_and_tells_its_children(fresh):
    env: dict[str, str] = {}
    how = set_threads(None, processes=2, loader_workers=1, environ=env)
    assert torch.get_num_threads() == 1 and env["OMP_NUM_THREADS"] == "1"
    assert how == "1 (4 cores / 2 processes - 1 loader workers)"
    assert set_threads(2, environ=env) == "2 (cpu_sharing.threads)"
    assert torch.get_num_threads() == 2


# ---------------------------------------------------------------------------- the spin governor
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
        self.total += 100 * self.cores             # one interval of all cores
        self.own += int(100 * own)
        self.busy += int(100 * (own + other))


@pytest.fixture
def governor(monkeypatch):
    FakeTeam.made = []
    monkeypatch.setattr(cpu_sharing, "_Team", FakeTeam)
    cores = len(os.sched_getaffinity(0))
    ticks = Ticks(cores)
    gov = SpinGovernor(sample=ticks, libgomp=lambda: "/lib/libgomp.so.1")
    gov.step()                                     # the first sample: no interval yet
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


def test_without_a_loaded_libgomp_there_is_nothing_to_throttle(governor):
    gov, ticks, _ = governor
    gov._libgomp = lambda: None
    ticks.advance(other=2.0)
    gov.step()
    assert not gov.throttled and FakeTeam.made == []


def _run_until_it_stops(gov: SpinGovernor) -> None:
    gov.interval = 0.001
    gov.start()
    gov._thread.join(10)
    assert not gov.running


def test_a_failing_sample_is_logged_once_and_the_team_ended(governor, caplog):
    gov, ticks, _ = governor
    ticks.advance(other=2.0)
    gov.step()
    team = gov._team
    assert gov.throttled

    def broken() -> tuple[int, int, int]:
        raise OSError("/proc/stat: gone")

    gov._sample = broken
    with caplog.at_level(logging.WARNING, logger=cpu_sharing.__name__):
        _run_until_it_stops(gov)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is not None
    assert "OSError: /proc/stat: gone" in warnings[0].getMessage()
    assert team.ended and not gov.throttled                 # libgomp as it was found
    assert "the spin governor failed: OSError" in gov.describe()


@pytest.mark.skipif(not GLIBC, reason="a C library that is not libgomp: glibc's")
def test_a_library_that_is_no_libgomp_fails_once_and_changes_nothing(caplog):
    ticks = Ticks(len(os.sched_getaffinity(0)))

    def busy() -> tuple[int, int, int]:
        ticks.advance(other=2.0)
        return ticks()

    gov = SpinGovernor(sample=busy, libgomp=lambda: "libc.so.6")   # no GOMP_parallel there
    gov.step()
    with pytest.raises(AttributeError, match="GOMP_parallel"):
        gov.step()                                 # step itself raises: nothing swallowed
    gov._last = None
    with caplog.at_level(logging.WARNING, logger=cpu_sharing.__name__):
        _run_until_it_stops(gov)                   # the thread logs it, once, and ends
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "GOMP_parallel" in warnings[0].getMessage()
    assert not gov.throttled and gov.switches == 0


def test_a_failing_part_is_logged_and_the_others_still_start(fresh, monkeypatch, caplog):
    monkeypatch.setattr(cpu_sharing, "keep_freed_memory",
                        functools.partial(keep_freed_memory, mallopt=RecordingMallopt(answer=0)))
    with caplog.at_level(logging.WARNING, logger=cpu_sharing.__name__):
        how = share_cpu()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cpu_sharing.malloc=keep failed" in warnings[0].getMessage()
    assert "malloc: left as it was (OSError: mallopt refused the mmap and trim threshold)" in how
    assert len(FakeGovernor.started) == 1 and torch.get_num_threads() == 4


# The real libgomp: a parallel region, then a pause in which libgomp's worker spins (full spin)
# or sleeps almost at once (throttled). The CPU the process burns in the pauses tells them apart.
PROBE = r"""
import json, os, time
import torch
from mmtf.utils.cpu_sharing import SpinGovernor, loaded_libgomp
torch.set_num_threads(2)
x = torch.ones(2_000_000)

def burnt_per_pause():
    cpu0 = time.process_time()
    for _ in range(100):
        x.add_(1.0)                                   # one parallel region on 2 threads
        time.sleep(0.004)
    return time.process_time() - cpu0

tasks = lambda: len(os.listdir("/proc/self/task"))
busy = iter([(0, 0, 0)] + [(200 * k, 200 * k, 0) for k in range(1, 10)])  # others: all cores
gov = SpinGovernor(sample=lambda: next(busy))
gov.step()
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
    out = subprocess.run([sys.executable, "-c", PROBE], env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["libgomp"] and "libgomp" in os.path.basename(got["libgomp"])
    before, during, after = got["tasks"]
    # the helper thread and its team's cores workers exist only while throttled
    assert during == before + 1 + got["cores"] and after == before, got
    # full spin: the worker spins through much of each 4 ms pause; throttled: it sleeps at once
    assert got["throttled"] < 0.5 * got["spin"], got


def test_no_libgomp_is_found_in_a_process_without_torch():
    code = "from mmtf.utils.cpu_sharing import loaded_libgomp; print(loaded_libgomp())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "None", out.stderr
    assert loaded_libgomp() is not None or sys.platform != "linux"   # this process has torch


# ---------------------------------------------------------------------------- malloc
@pytest.mark.skipif(not Path("/usr/include/malloc.h").exists(), reason="no glibc headers")
def test_the_mallopt_parameters_are_glibcs():
    header = Path("/usr/include/malloc.h").read_text()
    for name, value in (("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD),
                        ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD)):
        assert re.search(rf"#define\s+{name}\s+{value}\b", header), name


def test_by_default_both_thresholds_are_raised():
    mallopt = RecordingMallopt()
    how = keep_freed_memory({}, mallopt)
    assert sorted(mallopt.calls) == sorted([(M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                            (M_TRIM_THRESHOLD, TRIM_THRESHOLD)])
    # glibc caps its own dynamic threshold at 32 MiB on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
    assert MMAP_THRESHOLD == 32 * 1024 * 1024 and TRIM_THRESHOLD >= MMAP_THRESHOLD
    assert "keeps freed memory" in how


@pytest.mark.parametrize(("env", "said"), [
    ({"MMTF_MALLOC": "0"}, "MMTF_MALLOC=0"),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "MALLOC_TRIM_THRESHOLD_=1000000 (yours)"),
    ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.mmap_threshold=65536"},
     "glibc.malloc.mmap_threshold=65536 (yours)"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "libjemalloc.so.2"),
])
def test_the_users_malloc_choice_wins(env, said):
    mallopt = RecordingMallopt()
    how = keep_freed_memory(env, mallopt)
    assert mallopt.calls == [] and said in how


def test_other_tunables_do_not_count_as_a_malloc_choice():
    mallopt = RecordingMallopt()
    keep_freed_memory({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, mallopt)
    assert len(mallopt.calls) == 2


# Ten 4 MiB blocks malloc'ed, touched and freed, five times: the pattern of a step's
# temporaries. glibc's defaults hand the freed heap top back (40 MiB > its trim threshold), so
# every round faults its pages in again.
ROUNDS = r"""
import ctypes, json, resource, sys
from mmtf.utils.cpu_sharing import share_cpu
how = share_cpu({"wait": "off", "threads": "off", "malloc": sys.argv[1]}).split("malloc: ")[1]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size, faults = 4 << 20, []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(10)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in reversed(blocks):
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"faults": faults, "how": how}))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_share_cpu_stops_the_refaulting_of_freed_memory():
    def rounds(malloc: str) -> dict:
        out = subprocess.run([sys.executable, "-c", ROUNDS, malloc], env=clean_env(),
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    pages = 10 * (4 << 20) // os.sysconf("SC_PAGE_SIZE")
    kept, default = rounds("keep"), rounds("off")
    assert "keeps freed memory" in kept["how"] and "cpu_sharing.malloc=off" in default["how"]
    # glibc's defaults: most pages fault in again in every later round
    assert min(default["faults"][2:]) > pages // 2, default
    # mmtf's: the first round faults them in, the later rounds reuse them
    assert kept["faults"][0] > pages // 2 and max(kept["faults"][2:]) < pages // 20, kept
