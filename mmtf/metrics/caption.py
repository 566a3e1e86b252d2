"""Captioning metrics for a corpus: BLEU-1..4, ROUGE-L, CIDEr-D, METEOR, SPICE, SPIDEr.

:func:`caption_metrics` scores candidates the way pycocoevalcap does: captions tokenised by
:func:`ptb_words`, BLEU / ROUGE-L / CIDEr-D in Python (bit-for-bit its formulas), METEOR / SPICE
by their Java jars when present. A metric that cannot be computed is never reported as 0: it is
listed in ``scores.unavailable`` (metric -> reason). ``backend="aac"``
(``model.metrics_backend``) uses aac-metrics instead (:mod:`mmtf.metrics.aac`).
:class:`CaptionMetrics` accumulates pairs over an epoch; its ``compute()`` is collective under
DDP (call it on every rank) and gives the same numbers on every rank."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal, NamedTuple

from mmtf.errors import UserError
from mmtf.metrics import java
from mmtf.metrics.aac import aac_scores
from mmtf.metrics.bleu import corpus_bleu
from mmtf.metrics.cider import corpus_cider_d
from mmtf.metrics.event import event_sequence_accuracy
from mmtf.metrics.ptb import ptb_words
from mmtf.metrics.rouge import corpus_rouge_l
from mmtf.metrics.wer import ASR_METRICS, UtteranceErrors, error_rates
from mmtf.text.normalize import get_normalizer
from mmtf.utils.distributed import broadcast_object, gather_objects, world

log = logging.getLogger(__name__)

ALL_METRICS: tuple[str, ...] = ("bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider_d",
                                "meteor", "spice", "spider", "spider_fl")
_GROUPS = {"bleu": ("bleu_1", "bleu_2", "bleu_3", "bleu_4")}
FAST_METRICS: tuple[str, ...] = ("bleu", "rouge_l", "cider_d")  # no Java, no subprocess
Backend = Literal["mmtf", "aac"]
BACKENDS: tuple[str, ...] = ("mmtf", "aac")
SPIDER_FL_REASON = (
    "SPIDEr-FL needs the FENSE fluency-error detector, a neural checkpoint the mmtf backend does "
    "not run; set model.metrics_backend=aac (pip install 'mmtf[aac]', then aac-metrics-download "
    "once where the machine is online)"
)
_warned: set[str] = set()


class CaptionScores(dict):
    """The scores (metric -> float) plus ``unavailable``: metric -> why it was not computed."""

    def __init__(self, scores: dict[str, float], unavailable: dict[str, str]) -> None:
        super().__init__(scores)
        self.unavailable = dict(unavailable)


def resolve_metrics(metrics: Sequence[str] | None) -> list[str]:
    """Expand metric names (``"bleu"`` -> ``bleu_1..bleu_4``; None -> all) and check them."""
    if metrics is None:
        return list(ALL_METRICS)
    if isinstance(metrics, str):
        metrics = [metrics]
    out: list[str] = []
    for name in metrics:
        names = _GROUPS.get(name, (name,))
        if names[0] not in ALL_METRICS:
            raise ValueError(
                f"caption_metrics: metrics contains unknown name ({name!r}); choose from "
                f"{['bleu', *ALL_METRICS]} (transcripts: {list(ASR_METRICS)}) or pass "
                f"metrics=None for all."
            )
        out += [n for n in names if n not in out]
    return out


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`; a ValueError naming the key otherwise."""
    if backend not in BACKENDS:
        raise UserError(f"model.metrics_backend ({backend!r}) must be one of {list(BACKENDS)}: "
                         f"'mmtf' (built in) or 'aac' (aac-metrics, pip install 'mmtf[aac]').")
    return backend


def check_inputs(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> None:
    """Raise a ValueError/TypeError naming the argument when the inputs are malformed."""
    if isinstance(candidates, str) or isinstance(references, str):
        raise TypeError("caption_metrics: candidates and references must be lists, not one str.")
    if len(candidates) != len(references):
        raise ValueError(
            f"caption_metrics: len(candidates) ({len(candidates)}) != len(references) "
            f"({len(references)}); pass one list of references per candidate."
        )
    if len(candidates) == 0:
        raise ValueError("caption_metrics: candidates is empty; there is nothing to score.")
    for i, (cand, refs) in enumerate(zip(candidates, references)):
        if not isinstance(cand, str):
            raise TypeError(
                f"caption_metrics: candidates[{i}] must be a str, got {type(cand).__name__}."
            )
        if isinstance(refs, str):
            raise TypeError(
                f"caption_metrics: references[{i}] must be a list of strings, got a str; "
                f"wrap a single reference as [ref]."
            )
        if len(refs) == 0:
            raise ValueError(f"caption_metrics: references[{i}] is empty; each candidate "
                             f"needs at least one reference.")
        for j, ref in enumerate(refs):
            if not isinstance(ref, str):
                raise TypeError(f"caption_metrics: references[{i}][{j}] must be a str, got "
                                f"{type(ref).__name__}.")


def caption_metrics(
    candidates: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    metrics: Sequence[str] | None = None,
    tokenize: bool = True,
    java_timeout_s: float = 900.0,
    backend: Backend = "mmtf",
) -> CaptionScores:
    """Score a corpus of captions.

    Args:
        metrics: names to compute (``bleu`` or ``bleu_1..bleu_4``, ``rouge_l``, ``cider_d``,
            ``meteor``, ``spice``, ``spider``, ``spider_fl``); None = all. METEOR starts a JVM
            per call: validate per epoch with :data:`FAST_METRICS`.
        tokenize: run :func:`ptb_words`; False splits pre-tokenised captions on whitespace.
        java_timeout_s: time limit for each Java metric.
        backend: "mmtf" or "aac" (:mod:`mmtf.metrics.aac`).

    Returns:
        A :class:`CaptionScores`: metric -> float, with ``.unavailable`` (metric -> reason).

    Raises:
        ValueError, TypeError: malformed inputs or an unknown metric name.
    """
    names = resolve_metrics(metrics)
    check_backend(backend)
    check_inputs(candidates, references)
    split = ptb_words if tokenize else str.split
    cand_tok = [split(c) for c in candidates]
    refs_tok = [[split(r) for r in refs] for refs in references]
    if backend == "aac":
        scores, unavailable = aac_scores([" ".join(t) for t in cand_tok],
                                         [[" ".join(t) for t in refs] for refs in refs_tok],
                                         names, timeout_s=java_timeout_s)
    else:
        scores, unavailable = _mmtf_scores(cand_tok, refs_tok, names, java_timeout_s)
    for name, reason in unavailable.items():
        if name not in _warned:
            _warned.add(name)
            log.warning("caption_metrics: %s unavailable: %s", name, reason)
    return CaptionScores({n: float(scores[n]) for n in names if n in scores},
                         {n: unavailable[n] for n in names if n in unavailable})


def _mmtf_scores(cand_tok: list[list[str]], refs_tok: list[list[list[str]]], names: list[str],
                 java_timeout_s: float) -> tuple[dict[str, float], dict[str, str]]:
    scores: dict[str, float] = {}
    unavailable: dict[str, str] = {}
    if any(n.startswith("bleu_") for n in names):
        bleu = corpus_bleu(cand_tok, refs_tok, max_n=4)
        scores.update({f"bleu_{k + 1}": bleu[k] for k in range(4)})
    if "rouge_l" in names:
        scores["rouge_l"] = corpus_rouge_l(cand_tok, refs_tok)
    if {"cider_d", "spider"} & set(names):
        scores["cider_d"] = corpus_cider_d(cand_tok, refs_tok)

    # The Java metrics read the same tokenised text, joined by spaces (as in pycocoevalcap).
    cand_str = [" ".join(t) for t in cand_tok]
    refs_str = [[" ".join(t) for t in refs] for refs in refs_tok]
    if "meteor" in names:
        try:
            scores["meteor"] = java.meteor(cand_str, refs_str, timeout_s=java_timeout_s)
        except java.MetricUnavailable as exc:
            unavailable["meteor"] = str(exc)
    if {"spice", "spider"} & set(names):
        try:
            scores["spice"] = java.spice(cand_str, refs_str, timeout_s=java_timeout_s)
        except java.MetricUnavailable as exc:
            unavailable["spice"] = str(exc)
    if "spider" in names:
        if "spice" in scores:
            scores["spider"] = (scores["cider_d"] + scores["spice"]) / 2
        else:
            unavailable["spider"] = f"SPIDEr = (CIDEr-D + SPICE) / 2 needs SPICE: {unavailable['spice']}"
    if "spider_fl" in names:
        unavailable["spider_fl"] = SPIDER_FL_REASON
    return scores, unavailable


class CaptionRow(NamedTuple):
    """One scored item: its key (id), the generated caption and its references."""

    key: Hashable | None
    prediction: str
    references: list[str]


class CaptionMetrics:
    """Accumulates captions over an epoch; gathers them across DDP ranks and scores them.

    Not a ``torchmetrics.Metric``: its state is python strings, which torchmetrics' tensor
    sync cannot carry (:meth:`gather` gathers python objects).

    Args:
        metrics, tokenize, java_timeout_s, backend: as :func:`caption_metrics`.
        normalizer: the text normalizer of ``wer`` / ``cer`` (:mod:`mmtf.text.normalize`).

    Attributes:
        unavailable, rows, errors: of the last :meth:`compute`: metric -> reason; the gathered,
            de-duplicated :class:`CaptionRow` s (the same on every rank); with ``wer`` / ``cer``,
            the per-utterance :class:`~mmtf.metrics.wer.UtteranceErrors` (against each item's
            first reference) in the order of ``rows``.
    """

    def __init__(self, *, metrics: Sequence[str] | None = None, tokenize: bool = True,
                 java_timeout_s: float = 900.0, backend: Backend = "mmtf",
                 normalizer: str = "whisper_english") -> None:
        names = [metrics] if isinstance(metrics, str) else metrics
        # wer / cer score transcripts (mmtf.metrics.wer); the rest are caption metrics.
        self.asr_metrics = [n for n in names or () if n in ASR_METRICS]
        caption_names = [n for n in names or () if n not in ASR_METRICS]
        self.metrics = resolve_metrics(None if names is None else caption_names)
        get_normalizer(normalizer)             # an unknown name fails when the task is built
        self.normalizer = normalizer
        self.errors: list[UtteranceErrors] = []
        self.backend = check_backend(backend)
        self.tokenize = tokenize
        self.java_timeout_s = java_timeout_s
        self.unavailable: dict[str, str] = {}
        self.rows: list[CaptionRow] = []
        self.reset()

    def reset(self) -> None:
        """Forget every accumulated caption (call at the end of each epoch)."""
        self._items: list[CaptionRow] = []

    def __len__(self) -> int:
        return len(self._items)

    def update(self, candidates: Sequence[str], references: Sequence[Sequence[str]],
               keys: Sequence[Hashable] | None = None) -> None:
        """Add a batch.

        Args:
            candidates: generated captions of the batch.
            references: the reference captions of each item.
            keys: optional item ids (file names, or ints / a 1-D tensor). Under DDP a
                DistributedSampler pads the last batch with repeated items; with keys,
                :meth:`gather` keeps one copy of each key, so every item is scored once.
        """
        if len(candidates) or len(references):  # an empty batch is allowed and adds nothing
            check_inputs(candidates, references)
        if keys is not None and len(keys) != len(candidates):
            raise ValueError(f"CaptionMetrics.update: len(keys) ({len(keys)}) != "
                             f"len(candidates) ({len(candidates)}).")
        if hasattr(keys, "tolist"):  # a tensor of ids: tensors hash by identity, ints by value
            keys = keys.tolist()
        keys = keys if keys is not None else [None] * len(candidates)
        self._items += [CaptionRow(k, c, list(r)) for k, c, r in zip(keys, candidates, references)]

    def gather(self) -> list[CaptionRow]:
        """All ranks' rows, in rank order, later copies of a key removed.

        Collective under DDP (every rank must call it); a local read otherwise.
        """
        rows = [row for part in gather_objects(self._items) for row in part]
        seen: set[Hashable] = set()
        unique = []
        for row in rows:
            if row.key is not None:
                if row.key in seen:
                    continue
                seen.add(row.key)
            unique.append(CaptionRow(*row))
        return unique

    def compute(self, event_parser: Callable[[str], Any] | None = None) -> dict[str, float]:
        """Gather, score on rank 0, return the same scores on every rank (collective under DDP);
        sets :attr:`unavailable` and :attr:`rows`.

        Args:
            event_parser: caption -> event sequence; given, the scores include
                ``event_accuracy`` (:func:`~mmtf.metrics.event.event_sequence_accuracy`).

        Raises:
            ValueError: nothing was accumulated (on any rank).
        """
        self.rows = rows = self.gather()
        result = None
        if world()[1] == 0:
            try:
                result = (self._score(rows, event_parser), None)
            except Exception as exc:  # re-raised on every rank below, so no rank hangs
                result = (None, exc)
        scores, error = broadcast_object(result)
        if error is not None:
            if not rows:
                raise ValueError("CaptionMetrics.compute: no captions were accumulated; call "
                                 "update() before compute().") from error
            raise error
        scores, self.unavailable, self.errors = scores
        return scores

    def _score(self, rows: list[CaptionRow], event_parser: Callable[[str], Any] | None,
               ) -> tuple[dict[str, float], dict[str, str], list[UtteranceErrors]]:
        predictions = [row.prediction for row in rows]
        references = [row.references for row in rows]
        scores: dict[str, float] = {}
        unavailable: dict[str, str] = {}
        errors: list[UtteranceErrors] = []
        if self.metrics:
            result = caption_metrics(predictions, references, metrics=self.metrics,
                                     tokenize=self.tokenize, java_timeout_s=self.java_timeout_s,
                                     backend=self.backend)
            scores, unavailable = dict(result), result.unavailable
        if self.asr_metrics:
            check_inputs(predictions, references)
            rates = error_rates(predictions, [refs[0] for refs in references],
                                normalizer=self.normalizer, ids=[row.key for row in rows])
            scores.update(rates.scores(self.asr_metrics))
            errors = rates.utterances
        if event_parser is not None:
            scores["event_accuracy"] = event_sequence_accuracy(predictions, references,
                                                               event_parser)
        return scores, unavailable, errors
