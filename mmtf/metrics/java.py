"""METEOR 1.5 and SPICE 1.0, the two Java metrics of the COCO caption evaluation.

Run from their jars as pycocoevalcap does, when the jars are on disk (nothing is downloaded):
METEOR needs ``java`` and ``meteor-1.5.jar`` + ``data/paraphrase-en.gz`` (shipped by
pycocoevalcap; loading takes ~10-30 s per call); SPICE needs ``spice-1.0.jar`` and the Stanford
CoreNLP 3.6.0 jars under ``lib/`` (put there by hand). Subprocesses get an argument list and a
time limit; each runner returns a score or raises :class:`MetricUnavailable` with the reason."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path


class MetricUnavailable(RuntimeError):
    """A metric cannot be computed here; the message says why and how to enable it."""


def _pycocoevalcap_dir() -> Path:
    spec = importlib.util.find_spec("pycocoevalcap")
    if spec is None or not spec.submodule_search_locations:
        raise MetricUnavailable(
            "the pycocoevalcap package (which ships the jar) is not installed; "
            "pip install pycocoevalcap (it is in mmtf's [dev] extra)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise MetricUnavailable("no `java` on PATH; install a Java runtime (e.g. openjdk-17-jre)")
    return java


def meteor_command() -> tuple[list[str], Path]:
    """The METEOR command line and its working directory, or MetricUnavailable."""
    java = _java()
    root = _pycocoevalcap_dir() / "meteor"
    for needed in (root / "meteor-1.5.jar", root / "data" / "paraphrase-en.gz"):
        if not needed.is_file():
            raise MetricUnavailable(f"{needed} is missing from the pycocoevalcap install")
    cmd = [java, "-jar", "-Xmx2G", str(root / "meteor-1.5.jar"), "-", "-", "-stdio",
           "-l", "en", "-norm"]
    return cmd, root


def spice_command() -> tuple[list[str], Path]:
    """The SPICE command prefix and its working directory, or MetricUnavailable."""
    java = _java()
    root = _pycocoevalcap_dir() / "spice"
    jar = root / "spice-1.0.jar"
    missing = [p for p in (jar, root / "lib" / "stanford-corenlp-3.6.0.jar",
                           root / "lib" / "stanford-corenlp-3.6.0-models.jar") if not p.is_file()]
    if missing:
        raise MetricUnavailable(
            f"SPICE needs {', '.join(str(p) for p in missing)}; pycocoevalcap downloads the "
            f"Stanford CoreNLP 3.6.0 jars at first use and mmtf never downloads at run time: "
            f"copy them there to enable SPICE"
        )
    return [java, "-jar", "-Xmx8G", str(jar)], root


def _clean(text: str) -> str:
    # "|||" separates fields in METEOR's protocol and newlines end a request.
    return " ".join(text.replace("|||", " ").split())


def meteor(candidates: Sequence[str], references: Sequence[Sequence[str]],
           timeout_s: float = 900.0) -> float:
    """Corpus METEOR 1.5 of tokenised, space-joined captions (see the module docstring)."""
    cmd, cwd = meteor_command()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err)
        timer = threading.Timer(timeout_s, proc.kill)  # readline would otherwise wait forever
        timer.start()
        try:
            stats = []
            for cand, refs in zip(candidates, references):
                line = " ||| ".join(["SCORE", *(_clean(r) for r in refs), _clean(cand)])
                stats.append(_request(proc, line + "\n"))
            _request(proc, " ||| ".join(["EVAL", *stats]) + "\n", read=False)
            for _ in stats:  # one score per item, then the corpus score
                _readline(proc)
            score = float(_readline(proc))
        except (OSError, ValueError) as exc:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-500:]
            killed = " (killed after timeout_s)" if not timer.is_alive() else ""
            raise MetricUnavailable(f"METEOR failed{killed}: {exc}; stderr: {tail}") from exc
        finally:
            timer.cancel()
            if proc.stdin:
                proc.stdin.close()
            proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
    return score


def _request(proc: subprocess.Popen, line: str, read: bool = True) -> str:
    proc.stdin.write(line.encode("utf-8"))
    proc.stdin.flush()
    return _readline(proc) if read else ""


def _readline(proc: subprocess.Popen) -> str:
    out = proc.stdout.readline().decode("utf-8").strip()
    if not out:
        raise ValueError("METEOR closed its output early")
    return out


def spice(candidates: Sequence[str], references: Sequence[Sequence[str]],
          timeout_s: float = 1800.0) -> float:
    """Corpus SPICE (mean of per-item F-scores) of tokenised, space-joined captions."""
    prefix, cwd = spice_command()
    with tempfile.TemporaryDirectory(prefix="mmtf-spice-") as tmp:
        in_path, out_path = Path(tmp) / "in.json", Path(tmp) / "out.json"
        items = [{"image_id": i, "test": c, "refs": list(r)}
                 for i, (c, r) in enumerate(zip(candidates, references))]
        in_path.write_text(json.dumps(items), encoding="utf-8")
        cmd = [*prefix, str(in_path), "-out", str(out_path), "-subset", "-silent"]
        try:
            subprocess.run(cmd, cwd=cwd, check=True, timeout=timeout_s,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            results = json.loads(out_path.read_text(encoding="utf-8"))
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr or b"").decode(errors="replace")[-500:]
            raise MetricUnavailable(f"SPICE exited with {exc.returncode}: {tail}") from exc
        except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
            raise MetricUnavailable(f"SPICE failed: {exc}") from exc
    scores = [_to_float(item["scores"]["All"]["f"]) for item in results]
    return sum(scores) / len(scores)


def _to_float(x: object) -> float:
    try:
        return float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan  # pycocoevalcap's float_convert: a missing F-score is NaN
