"""Zero-shot use of a pretrained LLM folder: text (or conversations) in, continuations out.

:class:`PretrainedLM` holds a :class:`~mmtf.decoders.lm.CausalLM`, the folder's tokenizer and
(on first use) its chat template. ``generate_text`` takes plain strings (tokenized as
transformers' ``tokenizer(text)`` does, the tokenizer's own specials included) or
conversations (lists of ``{"role", "content"}``, rendered with the chat template and its
generation prompt, tokenized without added specials as ``apply_chat_template`` does), batches
them with left padding and returns the generated text only, cut at the first stop id
(``eos_token_id`` of the tokenizer, ``config.json`` and ``generation_config.json``), special
tokens dropped. ``mmtf.load(<LLM folder>)`` returns one. Why: docs/design/llm-decoders.md.

Shapes: b prompts, p padded prompt length, t generated tokens, v vocab.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mmtf.decoders.generation import GenerationConfig
from mmtf.decoders.lm import CausalLM
from mmtf.errors import ConfigError, UserError
from mmtf.hub import resolve_source
from mmtf.pretrained.llm import llm_decoder
from mmtf.text import PretrainedTokenizer
from mmtf.text.chat import ChatTemplate, encode_rendered

Conversation = Sequence[Mapping[str, Any]]
PromptItem = str | Conversation
# Settings of zero-shot use when the call and the folder give none.
DEFAULT_GENERATION: dict[str, Any] = {"strategy": "greedy", "max_new_tokens": 64}


class PretrainedLM(nn.Module):
    """A pretrained LLM with its tokenizer, for text generation and scoring.

    Args:
        lm: the model.
        tokenizer: the folder's tokenizer.
        folder: where the chat template is read from (None: no conversations).
        stop_ids: every id that ends a continuation (the first is generation's eos).
        generation: default generation settings (:class:`GenerationConfig` fields).
    """

    modality = "text"

    def __init__(self, lm: CausalLM, tokenizer: PretrainedTokenizer, *,
                 folder: Path | None = None, stop_ids: Sequence[int] = (),
                 generation: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.lm, self.tokenizer, self.folder = lm, tokenizer, folder
        self.stop_ids = tuple(dict.fromkeys([tokenizer.eos_id, *stop_ids]))
        self.generation: dict[str, Any] = {**DEFAULT_GENERATION, **(generation or {})}
        self.run_config = {"pretrained": None if folder is None else str(folder)}
        self._chat_template: ChatTemplate | None = None

    @classmethod
    def from_folder(cls, source: str | Path, **generation: Any) -> PretrainedLM:
        """Read an LLM folder or hub id (weights, tokenizer, stop ids).

        Raises:
            UserError: an unsupported family (named with the supported list), a missing
                ``tokenizer.json``, or weights that do not match ``config.json``.
        """
        folder = resolve_source(source, owner=f"ckpt_path={source}")
        lm = llm_decoder(pretrained=folder).eval()
        tokenizer = PretrainedTokenizer.from_folder(folder)
        stops: list[int] = []
        for name in ("generation_config.json", "config.json"):
            path = folder / name
            if path.is_file():
                value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
                stops += value if isinstance(value, list) else [] if value is None else [value]
        task = cls(lm, tokenizer, folder=folder, stop_ids=stops, generation=generation)
        task.check_generation()
        return task

    # ------------------------------------------------------------------ generation settings
    def update_generation(self, overrides: Mapping[str, Any]) -> None:
        """Merge generation settings (``mmtf.load(..., **generation)``, the predict CLI)."""
        self.generation.update(overrides)
        self.check_generation()

    def generation_state(self) -> Any:
        return dict(self.generation)

    def restore_generation(self, state: Any) -> None:
        self.generation = dict(state)

    def check_generation(self) -> None:
        """The settings are :class:`GenerationConfig` options (compile excepted)."""
        try:
            GenerationConfig.build(**self.generation)
        except TypeError as err:
            raise ConfigError(str(err)) from None

    # ------------------------------------------------------------------ text in, ids out
    @property
    def chat_template(self) -> ChatTemplate:
        """The folder's chat template, read on first use.

        Raises:
            UserError: the model was not loaded from a folder, or the folder has no template.
        """
        if self._chat_template is None:
            if self.folder is None:
                raise UserError("generate_text: conversations need the model folder's chat "
                                "template; load the model with mmtf.load(<folder>).")
            self._chat_template = ChatTemplate.from_folder(self.folder)
        return self._chat_template

    def encode_prompts(self, items: Sequence[PromptItem]) -> tuple[Tensor, Tensor]:
        """Left-padded ids (b, p) and their attention mask (b, p) (1 = real) of plain strings
        and conversations.

        Raises:
            UserError: an item that is neither a string nor a list of role/content messages,
                or an empty prompt.
        """
        rows = [self._encode(i, item) for i, item in enumerate(items)]
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows],
                            dtype=torch.long)
        device = self.lm.embed.weight.device
        return ids.to(device), mask.to(device)                               # (b, p) each

    def _encode(self, i: int, item: PromptItem) -> list[int]:
        """Ids of one prompt as transformers encodes it: special tokens spelled in the text
        (a template's ``<|im_start|>``) are those tokens, unlike in mmtf's caption targets."""
        if isinstance(item, str):
            text, add_special = item, True
        elif _is_conversation(item):
            text = self.chat_template.render(list(item), add_generation_prompt=True)
            add_special = False
        else:
            raise UserError(f"generate_text: item {i} ({type(item).__name__}) is neither a "
                            f"string nor a conversation (a list of {{'role', 'content'}} "
                            f"messages).")
        ids = encode_rendered(self.tokenizer, text, add_special_tokens=add_special).ids
        if not ids:
            raise UserError(f"generate_text: item {i} encodes to no tokens; give some text.")
        return ids

    @torch.no_grad()
    def generate_text(self, prompts_or_conversations: Sequence[PromptItem] | PromptItem, *,
                      batch_size: int = 8, **generation: Any) -> list[str] | list[list[str]]:
        """Continue each prompt; return the generated text only.

        Args:
            prompts_or_conversations: strings and/or conversations (one of either alone is
                taken as a list of one).
            batch_size: prompts per left-padded batch.
            **generation: :class:`GenerationConfig` overrides for this call (``strategy=
                "beam"``, ``num_beams``, ``max_new_tokens``, ``temperature``, ...).

        Returns:
            One string per prompt, or a list of ``num_return_sequences`` strings per prompt.

        Raises:
            UserError: a bad item, or a prompt plus ``max_new_tokens`` longer than the
                model's positions.
        """
        items = prompts_or_conversations
        if isinstance(items, str) or (_is_conversation(items) and len(items) > 0):
            items = [items]
        items = list(items)
        if not items:
            return []
        settings = {**self.generation, **generation}
        config = GenerationConfig.build(**settings)
        out: list[Any] = []
        for start in range(0, len(items), batch_size):
            ids, mask = self.encode_prompts(items[start:start + batch_size])
            result = self.lm.generate(ids, mask, config=config, eos_id=self.stop_ids[0])
            tokens = result.tokens                                      # (b, t) or (b, n, t)
            texts = [self.decode(row) for row in tokens.reshape(-1, tokens.shape[-1])]
            n = tokens.shape[1] if tokens.dim() == 3 else 1
            out += texts if n == 1 else [texts[i:i + n] for i in range(0, len(texts), n)]
        return out

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """Generated ids as text: cut at the first stop id, special tokens dropped (as
        transformers' ``decode(..., skip_special_tokens=True)``)."""
        ids = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
        stops = set(self.stop_ids)
        end = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return self.tokenizer.backend.decode(ids[:end], skip_special_tokens=True)

    @torch.no_grad()
    def lm_logits(self, input_ids: Tensor | Sequence[Sequence[int]],
                  attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits of every position, (B, T, vocab), to score text.

        Args:
            input_ids: (B, T) ids (left-padded when rows differ in length).
            attention_mask: (B, T), 1 = a real token; None = all real.
        """
        device = self.lm.embed.weight.device
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
        if ids.dim() == 1:
            ids = ids[None]
        return self.lm(ids, attention_mask)                                  # (B, T, v)

    def export_parts(self) -> dict[str, nn.Module]:
        return {"decoder": self.lm}


def _is_conversation(item: Any) -> bool:
    return (isinstance(item, Sequence) and not isinstance(item, str) and len(item) > 0
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in item))


def is_llm_folder(source: str | Path) -> bool:
    """Whether ``source`` is a local folder whose ``config.json`` names a supported LLM family
    (a hub id is resolved only by :meth:`PretrainedLM.from_folder`)."""
    from mmtf.pretrained.llm import MODEL_TYPES

    path = Path(source).expanduser() / "config.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("model_type") in MODEL_TYPES
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


__all__ = ["PretrainedLM", "is_llm_folder"]
