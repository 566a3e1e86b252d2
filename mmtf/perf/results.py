"""The experiments' record of every run: one JSON line appended to ``<folder>/results.jsonl``.

:func:`append_result` adds UTC time, git commit, CPU description and command line to a
benchmark's result object and appends it; the experiment's README holds only the current table."""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from mmtf.perf.device import describe_cpu
from mmtf.utils.run_info import git_state

RESULTS_FILE = "results.jsonl"
# mmtf.perf.monitor's first line of a run: CPU flags, threads, precision, kernels.
_RUN_PERF_MARK, _RUN_PERF_KEY = "[perf]", "cpu capability"


def run_perf_line(log_text: str) -> str | None:
    """A training run's first ``[perf]`` line (CPU flags, threads, precision, kernels) from
    its log text, without the logging prefix; None if the log has none."""
    for line in log_text.splitlines():
        if _RUN_PERF_MARK in line and _RUN_PERF_KEY in line:
            return line[line.index(_RUN_PERF_MARK) + len(_RUN_PERF_MARK):].strip()
    return None


def append_result(folder: str | Path, result: dict[str, Any]) -> dict[str, Any]:
    """Append ``result`` plus ``date``, ``commit``, ``dirty``, ``cpu`` and ``command`` to
    ``folder/results.jsonl`` (``folder``: the experiment's directory or a file inside it, e.g.
    ``__file__``); returns ``result`` unchanged, so ``print(json.dumps(append_result(...)))``
    prints what the script printed before."""
    folder = Path(folder).resolve()
    if folder.is_file():
        folder = folder.parent
    git = git_state(folder)
    record = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "commit": git.get("commit", git.get("error")), "dirty": git.get("dirty"),
              "cpu": describe_cpu(), "command": shlex.join([Path(sys.executable).name, *sys.argv]),
              **result}
    with (folder / RESULTS_FILE).open("a") as out:
        out.write(json.dumps(record) + "\n")
    return result
