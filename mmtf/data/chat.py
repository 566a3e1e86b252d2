"""Items as chats for a prefix LLM: the conversations of an item, encoded with the task's chat
template and tokenizer into training ids, unshifted labels and generation prompts.

An item has one or several *variants* (the sampler's caption slot picks one):

- an instruction item (``messages``): its conversation, once;
- a caption item with an instruction (``data.instruction`` or its own): one chat per
  reference caption, ``user: <|audio|>\\n<instruction>`` / ``assistant: <caption>``, so
  ``caption_policy`` decides as for captioning: ``random`` trains one caption per item per
  epoch, ``all`` every (item, caption) pair;
- a multiple-choice item has ``rotations`` variants (its options rotated,
  :func:`mmtf.metrics.aqa.rotate_item`): in training (``data.train_rotations``) the caption
  slot trains one rotation per item per epoch, so the right letter moves between epochs and no
  letter is learnt as an answer; in validation and test (``data.rotations``) every rotation is
  asked and scored;
- in validation and test every other item has one: the first caption's chat (its loss),
  scored against all its references.

Why the sampler's caption slot: docs/design/instruction-data.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from mmtf.data.formats.base import CaptionItem
from mmtf.errors import UserError
from mmtf.metrics.aqa import rotate_item
from mmtf.text.chat import ChatTemplate, encode_conversation, encode_rendered

Message = dict[str, Any]


class ChatExample(NamedTuple):
    """One encoded variant of an item.

    Attributes:
        input_ids: (t,) int64, the whole conversation rendered by the template.
        labels: (t,) int64, unshifted: the token on trained assistant tokens, -100 elsewhere.
        prompt_ids: (p,) int64, the conversation before its last assistant turn with the
            generation prompt (what generation continues); None in training.
        choices: a multiple-choice variant's options in its letter order (else None).
        rotation: that variant's rotation (else None).
        references: a rotated variant's own answer (``(D) <answer>``); None = the item's
            references.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    prompt_ids: np.ndarray | None
    choices: tuple[str, ...] | None = None
    rotation: int | None = None
    references: tuple[str, ...] | None = None


def caption_chat(placeholder: str, instruction: str, caption: str) -> list[Message]:
    """The two-turn chat of a caption: the media and the instruction, then the caption."""
    return [{"role": "user", "content": f"{placeholder}\n{instruction}"},
            {"role": "assistant", "content": caption}]


def item_chats(item: CaptionItem, *, placeholder: str, instruction: str | None, train: bool,
               rotations: int = 1) -> list[tuple[list[Message], tuple[str, ...] | None,
                                                 int | None]]:
    """The variants of ``item`` as ``(messages, choices, rotation)`` (see the module doc):
    a multiple-choice item's first ``rotations`` rotations (0 = as written).

    Raises:
        UserError: a caption item and no instruction (naming ``data.instruction``).
    """
    if item.messages is not None:
        if item.qa is None:
            return [(list(item.messages), None, None)]
        qa = item.qa
        if rotations > len(qa.choices):
            key = "data.train_rotations" if train else "data.rotations"
            raise UserError(f"{item.where}: {key}={rotations} but the question has "
                            f"{len(qa.choices)} options, so rotations would repeat; set "
                            f"{key} <= {len(qa.choices)}.")
        fields = {"id": item.id, "question_type": qa.question_type, "question": qa.question,
                  "choices": list(qa.choices), "answer": qa.answer}
        out: list[tuple[list[Message], tuple[str, ...] | None, int | None]] = \
            [(list(item.messages), qa.choices, 0)]
        for r in range(1, rotations):
            variant = rotate_item(fields, r)
            out.append((variant["messages"], tuple(variant["choices"]), r))
        return out
    text = item.instruction or instruction
    if not text:
        raise UserError(f"{item.where}: a caption item trained as a chat needs an instruction; "
                        f"set data.instruction (e.g. data.instruction=\"Describe the sound.\"; in a "
                        f"mixture data.sources.<name>.instruction), or use an instruction set "
                        f"(data=instruction).")
    captions = item.captions if train else item.captions[:1]
    return [(caption_chat(placeholder, text, c), None, None) for c in captions]


def prompt_messages(messages: Sequence[Message]) -> list[Message]:
    """The conversation before its last assistant turn (``train`` flags dropped): what the
    generation prompt is rendered after."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return [{k: v for k, v in m.items() if k != "train"} for m in messages[:last]]


def encode_items(items: Sequence[CaptionItem], *, template: ChatTemplate, tokenizer: Any,
                 placeholder: str, instruction: str | None, train: bool, max_tokens: int,
                 rotations: int = 1) -> list[list[ChatExample]]:
    """Every variant of every item, encoded (``[item][variant]``).

    Args:
        template, tokenizer: the task's (:class:`ChatTemplate`, a ``tokenizers``-backed
            tokenizer holding ``placeholder`` as one token).
        placeholder: the media placeholder (``<|audio|>``).
        instruction: the caption items' user turn (``data.instruction``).
        train: training variants (no prompts) or evaluation's.
        max_tokens: the longest conversation allowed (``data.max_chat_tokens``).
        rotations: multiple-choice variants per item (``data.train_rotations`` in training,
            ``data.rotations`` in evaluation).

    Raises:
        UserError: an item without an instruction, a conversation the template or tokenizer
            refuses (:func:`encode_conversation`), or one over ``max_tokens`` (naming the item).
    """
    out = []
    for item in items:
        variants = []
        for messages, choices, rotation in item_chats(item, placeholder=placeholder,
                                                      instruction=instruction, train=train,
                                                      rotations=rotations):
            ids = encode_conversation(template, tokenizer, messages, media_token=placeholder,
                                      where=item.where)
            if len(ids.input_ids) > max_tokens:
                raise UserError(f"{item.where}: the conversation is {len(ids.input_ids)} tokens "
                                f"once rendered, more than data.max_chat_tokens={max_tokens}; "
                                f"raise data.max_chat_tokens (the LLM must hold it plus the "
                                f"media positions) or shorten the item.")
            prompt = None
            if not train:
                text = template.render(prompt_messages(messages), add_generation_prompt=True)
                prompt = np.asarray(encode_rendered(tokenizer, text).ids, dtype=np.int64)
            variants.append(ChatExample(
                np.asarray(ids.input_ids, dtype=np.int64), np.asarray(ids.labels, dtype=np.int64),
                prompt, choices, rotation,
                (messages[-1]["content"],) if rotation else None))
        out.append(variants)
    return out


def chat_texts(item: CaptionItem, placeholder: str, instruction: str | None) -> list[str]:
    """The text of an item a fresh tokenizer trains on: its turns (placeholder removed) or its
    captions and instruction."""
    if item.messages is not None:
        return [m["content"].replace(placeholder, " ").strip() for m in item.messages]
    text = item.instruction or instruction
    return [*item.captions, *([text] if text else [])]


def question_fields(items: Sequence[CaptionItem], prefix: str = "") -> list[dict[str, Any]]:
    """The multiple-choice items among ``items`` as :class:`mmtf.metrics.aqa.AQAAccuracy` takes
    them (``id`` as batches carry it, ``question_type``, ``choices``, ``answer``; rotation 0)."""
    return [{"id": prefix + item.id, "question_type": item.qa.question_type,
             "question": item.qa.question, "choices": list(item.qa.choices),
             "answer": item.qa.answer} for item in items if item.qa is not None]


__all__ = ["ChatExample", "caption_chat", "chat_texts", "encode_items", "item_chats",
           "prompt_messages", "question_fields"]
