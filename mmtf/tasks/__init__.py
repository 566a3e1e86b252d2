"""Lightning glue: tasks that wrap mmtf models for training, evaluation and prediction.
:class:`SpeechTask` is imported on first use, so a captioning run loads no speech code."""

from __future__ import annotations

from typing import Any

from mmtf.tasks.base import Task
from mmtf.tasks.captioning import CaptioningTask
from mmtf.tasks.classification import ClassificationTask
from mmtf.tasks.contrastive import ContrastiveTask
from mmtf.tasks.prefix import PrefixLMTask
from mmtf.tasks.rebuild import build_task
from mmtf.tasks.resolve import resolve_tokenizer, stored_tokenizer


def __getattr__(name: str) -> Any:
    if name == "SpeechTask":
        from mmtf.tasks.speech import SpeechTask

        return SpeechTask
    raise AttributeError(f"module 'mmtf.tasks' has no attribute {name!r}")


__all__ = ["CaptioningTask", "ClassificationTask", "ContrastiveTask", "PrefixLMTask", "SpeechTask",
           "Task", "build_task", "resolve_tokenizer", "stored_tokenizer"]
