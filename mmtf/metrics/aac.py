"""The ``aac`` metrics backend: every caption metric computed by aac-metrics (Labbé et al.), the
package the DCASE audio-captioning challenge scores with (SPIDEr, SPIDEr-FL).

``pip install 'mmtf[aac]'``. METEOR, SPICE and SPIDEr-FL need files from
``aac-metrics-download``; mmtf never downloads: a missing file makes the metric unavailable,
with the reason. Captions arrive tokenised by :func:`mmtf.metrics.ptb.ptb_words`, so both
backends score the same tokens (docs/design/generation-and-metrics.md)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

INSTALL_FIX = "install the backend with pip install 'mmtf[aac]'"
DOWNLOAD_FIX = ("run `aac-metrics-download` once on a machine with internet access (or set "
                "AAC_METRICS_CACHE_PATH / FENSE_DATA to where it wrote its files)")
_FER_MODEL = "echecker_clotho_audiocaps_base"


def _functional() -> Any:
    """``aac_metrics.functional`` (imported on first use: it loads transformers, ~10 s)."""
    import aac_metrics.functional as functional

    return functional


def _missing_install() -> str | None:
    try:
        import aac_metrics  # noqa: F401
    except ImportError:
        return f"metrics_backend=aac needs the aac-metrics package, which is not installed; " \
               f"{INSTALL_FIX}"
    return None


def _missing_java_files(name: str) -> str | None:
    """Why aac-metrics' METEOR or SPICE cannot run here, or None."""
    from aac_metrics.functional.meteor import FNAME_METEOR_JAR
    from aac_metrics.functional.spice import check_spice_install
    from aac_metrics.utils.globals import get_default_cache_path, get_default_java_path

    cache = get_default_cache_path()
    try:
        if name == "meteor":
            jar = Path(cache, FNAME_METEOR_JAR)
            if not jar.is_file():
                raise FileNotFoundError(f"no METEOR jar at {jar}")
        else:
            check_spice_install(cache)
    except (FileNotFoundError, NotADirectoryError) as exc:
        return f"aac-metrics' {name.upper()} files are missing ({exc}); {DOWNLOAD_FIX}"
    java = get_default_java_path()
    if not Path(java).is_file() and shutil.which(java) is None:
        return f"aac-metrics' {name.upper()} needs java ({java!r} not found); install a JRE"
    return None


def _missing_fluency_model() -> str | None:
    home = Path(os.environ.get("FENSE_DATA", Path(torch.hub.get_dir()) / "fense_data"))
    ckpt = home / f"{_FER_MODEL}.ckpt"
    if not ckpt.is_file():
        return (f"SPIDEr-FL needs the FENSE fluency-error detector ({ckpt} is missing); "
                f"{DOWNLOAD_FIX}")
    return None


def aac_scores(candidates: Sequence[str], references: Sequence[Sequence[str]],
               names: Sequence[str], *, timeout_s: float) -> tuple[dict[str, float],
                                                                   dict[str, str]]:
    """Score space-joined token strings with aac-metrics.

    Args:
        candidates, references: tokenised captions (one per item) and references, tokens
            joined by spaces.
        names: resolved metric names (``bleu_1`` ... ``spider_fl``).
        timeout_s: time limit of each Java metric.

    Returns:
        (scores, unavailable): metric -> float, and metric -> reason for the ones not computed.
    """
    wanted = set(names)
    missing = _missing_install()
    if missing is not None:
        return {}, {n: missing for n in names}
    functional = _functional()
    cands, refs = list(candidates), [list(r) for r in references]
    scores: dict[str, float] = {}
    unavailable: dict[str, str] = {}
    if any(n.startswith("bleu_") for n in wanted):
        corpus, _ = functional.bleu(cands, refs, n=4, return_1_to_n=True)
        scores.update({f"bleu_{k + 1}": float(v) for k, v in enumerate(corpus["bleu_1_to_4"])})
    if "rouge_l" in wanted:
        scores["rouge_l"] = float(functional.rouge_l(cands, refs)[0]["rouge_l"])
    if "cider_d" in wanted:
        if len(cands) < 2:     # aac-metrics' CIDEr-D refuses a corpus of one
            unavailable["cider_d"] = "aac-metrics' CIDEr-D needs at least 2 captions"
        else:
            scores["cider_d"] = float(functional.cider_d(cands, refs)[0]["cider_d"])
    if "meteor" in wanted:
        reason = _missing_java_files("meteor")
        if reason is None:
            scores["meteor"] = float(functional.meteor(cands, refs, timeout=int(timeout_s))[0]
                                     ["meteor"])
        else:
            unavailable["meteor"] = reason
    spice_names = wanted & {"spice", "spider", "spider_fl"}
    if spice_names:
        reason = _missing_java_files("spice")
        fl_reason = _missing_fluency_model() if "spider_fl" in wanted else None
        if reason is not None:
            unavailable.update({n: reason for n in spice_names})
        elif len(cands) < 2:
            unavailable.update({n: "aac-metrics' SPIDEr needs at least 2 captions"
                                for n in spice_names})
        else:
            if "spider_fl" in wanted and fl_reason is None:
                corpus, _ = functional.spider_fl(cands, refs, timeout=int(timeout_s),
                                                 device="cpu")
            else:
                corpus, _ = functional.spider(cands, refs, timeout=int(timeout_s))
                if fl_reason is not None:
                    unavailable["spider_fl"] = fl_reason
            scores.update({n: float(corpus[n]) for n in spice_names if n in corpus})
    return scores, unavailable
