"""A tiny chat setup for the instruction-data tests: a `tokenizers` BPE whose every word is one
token (so ids can be worked out by hand), the media placeholders as special tokens, and a
ChatML-like template; plus writers of tiny instruction sets."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from mmtf.text.chat import ChatTemplate
from mmtf.text.pretrained import PretrainedTokenizer
from tests.unit.data.conftest import sine, write_audio

SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|audio|>", "<|image|>"]
# ChatML without a system default: "<|im_start|>role\ncontent<|im_end|>\n" per turn, then the
# generation prompt "<|im_start|>assistant\n".
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ["user", "assistant", "system", "describe", "the", "sound", "a", "dog", "barks", "twice",
         "far", "away", "what", "is", "this", "more", "detail", "it", ".", "?", "(", ")", ","]


def words_of(texts: Iterable[str]) -> list[str]:
    """The word and punctuation pieces the tokenizer's Whitespace pre-tokenizer cuts."""
    return [w for t in texts for w in re.findall(r"\w+|[^\w\s]+", t)]


def tiny_tokenizer(texts: Iterable[str] = ()) -> PretrainedTokenizer:
    """A BPE trained until every piece of ``texts`` (and :data:`WORDS`) is one token."""
    corpus = sorted(set(words_of([*WORDS, *(w.capitalize() for w in WORDS), *texts])))
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(corpus * 2, trainers.BpeTrainer(
        vocab_size=5000, min_frequency=1, special_tokens=SPECIALS, show_progress=False))
    for piece in corpus:
        assert len(backend.encode(piece, add_special_tokens=False).ids) == 1, piece
    end = backend.token_to_id("<|im_end|>")
    return PretrainedTokenizer(tokenizer=backend, pad_id=0, bos_id=backend.token_to_id(
        "<|im_start|>"), eos_id=end, unk_id=1, source="tiny chat bpe")


def template() -> ChatTemplate:
    return ChatTemplate(TEMPLATE, origin="tiny ChatML template")


def ids_of(tokenizer: PretrainedTokenizer, tokens: Sequence[str]) -> list[int]:
    """Hand-written token strings -> ids (each must be in the vocabulary)."""
    ids = [tokenizer.token_to_id(t) for t in tokens]
    assert None not in ids, [t for t, i in zip(tokens, ids) if i is None]
    return ids


def write_clips(root: Path, names: Sequence[str], seconds: Sequence[float]) -> None:
    """Sine clips ``root/audio/<name>.wav`` of the given lengths (16 kHz)."""
    for k, (name, s) in enumerate(zip(names, seconds)):
        write_audio(root / "audio" / f"{name}.wav", sine(s, 16000, hz=300.0 + 50 * k))


def write_split(root: Path, split: str, lines: Sequence[dict | str]) -> Path:
    path = root / f"{split}.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def chat(user: str, answer: str, **assistant) -> list[dict]:
    return [{"role": "user", "content": user},
            {"role": "assistant", "content": answer, **assistant}]
