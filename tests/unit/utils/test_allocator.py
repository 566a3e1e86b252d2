"""mmtf.utils.allocator: glibc keeps the memory a step frees unless the user chose otherwise."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmtf.utils.allocator import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD,
    TRIM_THRESHOLD,
    keep_freed_memory,
)

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


class RecordingMallopt:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


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
    assert "keeps freed memory" in how and "MMTF_MALLOC=0" in how


@pytest.mark.parametrize(("env", "said"), [
    ({"MMTF_MALLOC": "0"}, "MMTF_MALLOC=0"),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "MALLOC_TRIM_THRESHOLD_=1000000 (yours)"),
    ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.mmap_threshold=65536"},
     "glibc.malloc.mmap_threshold=65536 (yours)"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "libjemalloc.so.2"),
])
def test_the_users_choice_wins(env, said):
    mallopt = RecordingMallopt()
    how = keep_freed_memory(env, mallopt)
    assert mallopt.calls == [] and said in how


def test_other_tunables_do_not_count_as_a_malloc_choice():
    mallopt = RecordingMallopt()
    keep_freed_memory({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, mallopt)
    assert len(mallopt.calls) == 2


def test_a_refused_threshold_is_said():
    assert "refused" in keep_freed_memory({}, RecordingMallopt(answer=0))


# Ten 4 MiB blocks malloc'ed, touched and freed, five times: the pattern of a step's
# temporaries. glibc's defaults hand the freed heap top back (40 MiB > its trim threshold), so
# every round faults its pages in again.
ROUNDS = r"""
import ctypes, json, resource, sys
import mmtf
from mmtf.utils.allocator import describe_allocator
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
print(json.dumps({"faults": faults, "how": describe_allocator()}))
"""


def _rounds(extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "MMTF_MALLOC")}
    out = subprocess.run([sys.executable, "-c", ROUNDS], env={**env, **extra_env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_import_mmtf_stops_the_refaulting_of_freed_memory():
    pages = 10 * (4 << 20) // os.sysconf("SC_PAGE_SIZE")
    kept, default = _rounds({}), _rounds({"MMTF_MALLOC": "0"})
    assert "keeps freed memory" in kept["how"] and "MMTF_MALLOC=0" in default["how"]
    # glibc's defaults: most pages fault in again in every later round
    assert min(default["faults"][2:]) > pages // 2, default
    # mmtf's: the first round faults them in, the later rounds reuse them
    assert kept["faults"][0] > pages // 2 and max(kept["faults"][2:]) < pages // 20, kept
