"""Lightning glue: tasks that wrap mmtf models for training, evaluation and prediction."""

from mmtf.tasks.base import Task
from mmtf.tasks.captioning import CaptioningTask
from mmtf.tasks.classification import ClassificationTask
from mmtf.tasks.rebuild import build_task
from mmtf.tasks.resolve import resolve_tokenizer, stored_tokenizer

__all__ = ["CaptioningTask", "ClassificationTask", "Task", "build_task", "resolve_tokenizer",
           "stored_tokenizer"]
