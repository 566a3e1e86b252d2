"""A stand-in for the instruction data module (issue 41, data side), used only to run
``experiment=audio_qa_llm`` before that module is merged: the built-in question set's batches
(each question already a chat, ``messages``) rewritten into the prefix batch contract of
:class:`mmtf.tasks.PrefixLMTask`.

Every split holds each question under its 4 rotations of the options
(:func:`mmtf.metrics.aqa.rotate_item`): training draws one at random per epoch (the
"caption" slot of the sampler), validation and test ask all four, which the task scores as the
shuffle-robust accuracy.

    PYTHONPATH=experiments/audio_qa_llm python -m mmtf.train experiment=audio_qa_llm \\
        data._target_=chat_qa.ChatQADataModule 'safe_targets=[chat_qa]'
"""

from __future__ import annotations

from typing import Any

import torch

from mmtf.data.datasets import QADataset
from mmtf.metrics.aqa import format_messages
from mmtf.synthetic import SyntheticQADataModule
from mmtf.text.chat import ChatTemplate, encode_conversation, encode_rendered

ROTATIONS = 4


class ChatQADataModule(SyntheticQADataModule):
    """The built-in question set as chat items (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokenizer: Any = None
        self.chat_template: ChatTemplate | None = None
        self.media_token = "<|audio|>"

    # ------------------------------------------------------------------ the text side
    def tokenizer_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        return spec

    def train_captions(self) -> list[str]:
        """Every turn of the training chats: what the BPE is trained on."""
        return [m["content"] for it in self.items("train")
                for m in format_messages(it.question, it.choices, it.answer)]

    def connect(self, tokenizer: Any, chat_template: ChatTemplate | None = None,
                media_token: str = "<|audio|>") -> None:
        self.tokenizer, self.chat_template, self.media_token = (tokenizer, chat_template,
                                                                media_token)

    # ------------------------------------------------------------------ rotations
    def _dataset(self, split: str, crop: str) -> QADataset:
        return QADataset(self.items(split), rotations=ROTATIONS,
                         **self._media_kwargs(split, crop))

    def _num_captions(self, split: str) -> list[int]:
        return [ROTATIONS] * len(self.items(split))

    def _policy(self, split: str) -> str:
        return "random" if split == "train" else "all"

    def _collate(self, split: str):
        inner = super()._collate(split)
        return lambda examples: self._chat_batch(inner(examples), split)

    def _chat_batch(self, batch: dict[str, Any], split: str) -> dict[str, Any]:
        items = [encode_conversation(self.chat_template, self.tokenizer, messages,
                                     media_token=self.media_token)
                 for messages in batch["messages"]]
        width = max(len(it.input_ids) for it in items)
        ids = torch.full((len(items), width), self.tokenizer.pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros(len(items), width, dtype=torch.bool)
        for i, it in enumerate(items):                   # right padding for training
            n = len(it.input_ids)
            ids[i, :n], labels[i, :n], mask[i, :n] = (torch.tensor(it.input_ids),
                                                      torch.tensor(it.labels), True)
        audio, lengths = batch["audio"], batch["audio_lengths"]
        out = {"media": audio, "media_mask": torch.arange(audio.shape[1])[None] < lengths[:, None],
               "input_ids": ids, "attention_mask": mask, "labels": labels,
               "ids": [str(i) for i in batch["ids"]], "_skipped": batch.get("_skipped", [])}
        if split != "train":
            prompts = [encode_rendered(self.tokenizer, self.chat_template.render(
                messages[:1], add_generation_prompt=True)).ids for messages in batch["messages"]]
            p = max(map(len, prompts))
            out["prompt_ids"] = torch.tensor([[self.tokenizer.pad_id] * (p - len(r)) + r
                                              for r in prompts])          # left padding
            out["prompt_mask"] = torch.tensor([[False] * (p - len(r)) + [True] * len(r)
                                               for r in prompts])
            for key in ("choices", "answer", "question_type", "rotation"):
                out[key] = batch[key]
        return out
