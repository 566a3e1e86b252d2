"""Captioning metrics as in the COCO caption evaluation: BLEU, ROUGE-L, CIDEr-D, METEOR, SPICE.

``caption_metrics`` scores a corpus, ``CaptionMetrics`` accumulates an epoch (DDP-aware),
``event_sequence_accuracy`` scores the synthetic sets, ``retrieval_metrics`` /
``RetrievalMetrics`` score cross-modal retrieval (R@k, mAP@k); unavailable metrics are reported
with the reason, never as 0 (see :mod:`mmtf.metrics.caption`). Multiple-choice audio
questions: ``AQAAccuracy`` / ``aqa_scores`` (shuffle-robust accuracy, :mod:`mmtf.metrics.aqa`)."""

from mmtf.metrics.aqa import AQAAccuracy, aqa_scores, parse_choice, rotate_item
from mmtf.metrics.bleu import corpus_bleu
from mmtf.metrics.caption import (
    ALL_METRICS,
    FAST_METRICS,
    CaptionMetrics,
    CaptionRow,
    CaptionScores,
    caption_metrics,
)
from mmtf.metrics.cider import cider_d_scores, corpus_cider_d
from mmtf.metrics.event import event_sequence_accuracy
from mmtf.metrics.java import MetricUnavailable
from mmtf.metrics.ptb import ptb_words
from mmtf.metrics.retrieval import RetrievalMetrics, retrieval_metrics
from mmtf.metrics.rouge import corpus_rouge_l

__all__ = [
    "ALL_METRICS",
    "AQAAccuracy",
    "FAST_METRICS",
    "CaptionMetrics",
    "CaptionRow",
    "CaptionScores",
    "MetricUnavailable",
    "RetrievalMetrics",
    "aqa_scores",
    "caption_metrics",
    "cider_d_scores",
    "corpus_bleu",
    "corpus_cider_d",
    "corpus_rouge_l",
    "event_sequence_accuracy",
    "parse_choice",
    "ptb_words",
    "retrieval_metrics",
    "rotate_item",
]
