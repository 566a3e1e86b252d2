"""tests/forked.py: a forked child run as ``python [-m] target`` behaves as a real interpreter
does (the reference: the same program in a new interpreter, side by side)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.forked import alive, run_main

PROGRAM = textwrap.dedent("""
    import logging, os, sys, warnings
    import __main__
    print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()))
    print("env", os.environ.get("FORKED_PROBE"), "gone" if "FORKED_GONE" not in os.environ else "kept")
    print("spec", getattr(__main__.__spec__, "name", None), "name", __name__)
    print("handlers", logging.getLogger().handlers, "level", logging.getLogger().level)
    logging.getLogger("probe").warning("a logged warning")
    warnings.warn("a user warning", UserWarning)
    warnings.warn("a deprecation", DeprecationWarning)
    mode = sys.argv[1]
    if mode == "exit":
        sys.exit(int(sys.argv[2]))
    if mode == "message":
        sys.exit("goodbye")
    if mode == "raise":
        raise ValueError("boom")
    if mode in ("SIGKILL", "SIGTERM"):
        import signal
        os.kill(os.getpid(), getattr(signal, mode))
""")


def fresh(target: str | Path, args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, *(["-m", target] if isinstance(target, str) else [str(target)])]
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([*command, *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def program(tmp_path, monkeypatch) -> tuple[Path, Path]:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "forked_probe.py").write_text(PROGRAM)
    monkeypatch.setenv("FORKED_GONE", "1")
    return tmp_path, package / "forked_probe.py"


@pytest.mark.parametrize("args", [["exit", "0"], ["exit", "3"], ["message"], ["raise"],
                                  ["SIGKILL"], ["SIGTERM"]])
@pytest.mark.parametrize("as_module", [True, False], ids=["-m", "script"])
def test_a_forked_child_behaves_as_a_fresh_interpreter(program, args, as_module):
    root, script = program
    target: str | Path = "forked_probe" if as_module else script
    cwd = script.parent if as_module else root
    env = {"FORKED_PROBE": "seen", "FORKED_GONE": None}
    real = fresh(target, args, cwd, env)
    forked = run_main(target, args, cwd=cwd, env=env, timeout=60)
    assert forked.returncode == real.returncode
    assert forked.stdout == real.stdout
    # the same lines; a traceback's frames above the program's differ (runpy's, not the
    # interpreter's), so compare its last line there
    if args == ["raise"]:
        assert forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1] == "ValueError: boom"
        assert forked.stderr.splitlines()[:3] == real.stderr.splitlines()[:3]
    else:
        assert forked.stderr == real.stderr


def test_output_lines_reach_on_line_as_they_come_and_it_can_signal_the_child(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text("import time\nfor i in range(10000):\n    print('tick', i)\n"
                      "    time.sleep(0.01)\n")
    seen: list[str] = []

    def stop_at_third(line, process):
        seen.append(line)
        if line == "tick 2\n":
            process.send_signal(signal.SIGTERM)
        return True

    out = run_main(script, [], cwd=tmp_path, on_line=stop_at_third, merge_stderr=True)
    assert out.returncode == -signal.SIGTERM
    assert seen[:3] == ["tick 0\n", "tick 1\n", "tick 2\n"] and len(seen) < 100


def test_a_child_that_runs_too_long_is_killed_and_named(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(TimeoutError, match=r"sleep\.py  did not end within 2 s:\nstarted"):
        run_main(script, [], cwd=tmp_path, timeout=2)


# A program that starts a process which outlives it (as a DDP rank or a loader worker would),
# then ends: normally, or killed by a signal.
LEAVER = """\
import os, signal, sys, time
pid = os.fork()
if pid == 0:
    devnull = os.open(os.devnull, os.O_WRONLY)   # not holding the output pipes open
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_what_a_child_leaves_running_is_reported_and_killed_only_after_a_signal(tmp_path, end):
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    out = run_main(script, [end], cwd=tmp_path, timeout=30)
    grandchild = int(out.stdout.split()[0])
    try:
        assert out.returncode == (0 if end == "exit" else -signal.SIGKILL)
        assert out.left_behind == [grandchild]
        # an orphan of a kill is killed with it (SIGKILL lands within moments)
        deadline = time.monotonic() + 5
        while end == "kill" and alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert alive(grandchild) == (end == "exit")
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)



class _WritesOnCollection:
    """Garbage in a reference cycle that records which process collected it."""

    def __init__(self, path: Path) -> None:
        self.path, self.cycle = path, self

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def test_the_child_does_not_collect_the_workers_garbage(tmp_path):
    # What a loader iterator of an earlier test in a cycle would do: its __del__ acts on the
    # worker's loader processes. A fresh interpreter has none of it to collect.
    import gc

    record = tmp_path / "collected_by"
    script = tmp_path / "collect.py"
    script.write_text("import gc\ngc.collect()\nprint('collected')\n")
    gc.disable()                       # the garbage must still be there when the child forks
    try:
        _WritesOnCollection(record)
        out = run_main(script, [], cwd=tmp_path)
    finally:
        gc.enable()
    assert out.returncode == 0 and out.stdout == "collected\n", out.stderr
    assert not record.exists()         # the child did not run __del__
    gc.collect()
    assert record.read_text() == f"{os.getpid()}\n"
