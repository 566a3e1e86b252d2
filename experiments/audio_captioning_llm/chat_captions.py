"""A stand-in for the instruction data module (issue 41, data side), used only to run
``experiment=audio_captioning_llm`` before that module is merged: the built-in caption set's
batches rewritten into the prefix batch contract of :class:`mmtf.tasks.PrefixLMTask`.

Each caption becomes ``user: <|audio|>\\n<instruction>`` / ``assistant: <caption>`` rendered with
the task's chat template (:func:`mmtf.text.chat.encode_conversation`); validation and test
batches also carry the left-padded prompt (the user turn and the generation prompt). The
caption text is the tokenizer's decoding of the batch's ids (mmtf's BPE lower-cases anyway).

    PYTHONPATH=experiments/audio_captioning_llm python -m mmtf.train \\
        experiment=audio_captioning_llm data._target_=chat_captions.ChatCaptionDataModule \\
        'safe_targets=[chat_captions]'
"""

from __future__ import annotations

from typing import Any

import torch

from mmtf.synthetic import SyntheticCaptionDataModule
from mmtf.text.chat import ChatTemplate, encode_conversation, encode_rendered


class ChatCaptionDataModule(SyntheticCaptionDataModule):
    """The built-in caption set as chat items (see the module docstring)."""

    def __init__(self, *, instruction: str = "Describe the sound.", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.instruction = instruction
        self.chat_template: ChatTemplate | None = None
        self.media_token = "<|audio|>"

    def connect(self, tokenizer: Any, chat_template: ChatTemplate | None = None,
                media_token: str = "<|audio|>") -> None:
        super().connect(tokenizer)
        self.chat_template, self.media_token = chat_template, media_token

    def _collate(self, split: str):
        inner = super()._collate(split)
        return lambda examples: self._chat_batch(inner(examples), split)

    def _chat_batch(self, batch: dict[str, Any], split: str) -> dict[str, Any]:
        user = {"role": "user", "content": f"{self.media_token}\n{self.instruction}"}
        captions = self.tokenizer.decode_batch(batch["tokens"].tolist())
        k = len(captions) // len(batch["ids"])          # captions per item, item-major
        items = [encode_conversation(self.chat_template, self.tokenizer,
                                     [user, {"role": "assistant", "content": c}],
                                     media_token=self.media_token) for c in captions]
        width = max(len(it.input_ids) for it in items)
        pad = self.tokenizer.pad_id
        ids = torch.full((len(items), width), pad, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros(len(items), width, dtype=torch.bool)
        for i, it in enumerate(items):                   # right padding for training
            n = len(it.input_ids)
            ids[i, :n], labels[i, :n], mask[i, :n] = (torch.tensor(it.input_ids),
                                                      torch.tensor(it.labels), True)
        audio, lengths = batch["audio"], batch["audio_lengths"]
        if k > 1:
            audio, lengths = audio.repeat_interleave(k, 0), lengths.repeat_interleave(k, 0)
        out = {"media": audio, "media_mask": torch.arange(audio.shape[1])[None] < lengths[:, None],
               "input_ids": ids, "attention_mask": mask, "labels": labels,
               "ids": [str(i) for i in batch["ids"] for _ in range(k)],
               "_skipped": batch.get("_skipped", [])}
        if split != "train":
            prompt = encode_rendered(self.tokenizer, self.chat_template.render(
                [user], add_generation_prompt=True)).ids
            b = len(batch["ids"])
            out.update(prompt_ids=torch.tensor([prompt] * b),      # one prompt: no padding
                       prompt_mask=torch.ones(b, len(prompt), dtype=torch.bool),
                       references=batch["references"])
        return out
