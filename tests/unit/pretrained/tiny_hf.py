"""Tiny tokenizer folders in the Hugging Face layout, built locally (never downloaded).

A byte-level BPE trained with `tokenizers` on a few captions, with the special tokens of the
family appended after the learned vocabulary as GPT-2 and Whisper have them, and the
``tokenizer_config.json`` that names them as ``save_pretrained`` writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = ["a dog barks at the cat", "rain falls on a tin roof", "birds sing in tall trees",
          "people talk near the busy road", "water drips into a metal bucket"] * 4
ENDOFTEXT = "<|endoftext|>"
WHISPER_SPECIALS = [ENDOFTEXT, "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>",
                    "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                    "<|notimestamps|>"]
WHISPER_PROMPT = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


def write_tokenizer(folder: Path, *, family: str = "whisper", vocab_size: int = 300) -> Tokenizer:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` into ``folder``; return the
    tokenizer. ``family``: "whisper" (eos = pad = <|endoftext|>, the Whisper specials) or
    "gpt2" (bos = eos = unk = <|endoftext|>, no pad)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    specials = WHISPER_SPECIALS if family == "whisper" else [ENDOFTEXT]
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    if family == "whisper":
        config["pad_token"] = ENDOFTEXT
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok
