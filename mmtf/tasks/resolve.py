"""The tokenizer of a run, resolved once by the entry point and handed to the task and the data
module (as litgpt's ``data.connect(tokenizer=...)``). Why: docs/design/tokenizer-ownership.md
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import CheckpointError, ConfigError
from mmtf.text import Tokenizer, build_tokenizer

log = logging.getLogger("mmtf.tasks")


def stored_tokenizer(checkpoint: Mapping[str, Any]) -> Tokenizer | None:
    """The tokenizer an mmtf checkpoint carries (``checkpoint["mmtf"]["tokenizer"]``, written by
    :meth:`mmtf.tasks.Task.on_save_checkpoint`); None when it has none (classification)."""
    stored = (checkpoint.get("mmtf") or {}).get("tokenizer")
    return Tokenizer.from_json_str(stored) if stored else None


def resolve_tokenizer(spec: Mapping[str, Any] | None, *,
                      train_captions: Callable[[], Iterable[str]],
                      ckpt_path: str | os.PathLike | None = None) -> Tokenizer:
    """The one tokenizer of a run: a resumed run's checkpoint's (its weights were trained on
    those ids), else the one ``spec`` builds. Deterministic, so every DDP rank gets the same.

    Args:
        spec: the ``tokenizer`` config node (:func:`mmtf.text.build_tokenizer`).
        train_captions: the training captions; called only when ``spec`` trains.
        ckpt_path: the checkpoint the run resumes from, or None.

    Raises:
        CheckpointError: the checkpoint carries no tokenizer.
        ConfigError: no ``spec`` on a fresh run, or a bad one.
    """
    if ckpt_path is not None:
        tokenizer = stored_tokenizer(load_checkpoint(ckpt_path, mmap=True))
        if tokenizer is None:
            raise CheckpointError(f"{ckpt_path} carries no tokenizer (checkpoint['mmtf']"
                                  f"['tokenizer']); it was not written by a CaptioningTask.")
        log.info("[tokenizer] the resumed checkpoint's (%d tokens); the tokenizer.* settings "
                 "are not used", tokenizer.vocab_size)
        return tokenizer
    if spec is None:
        raise ConfigError("a captioning run needs a tokenizer but the config has no tokenizer "
                          "node; select one with tokenizer=bpe | char | pretrained | saved.")
    return build_tokenizer(dict(spec), train_captions)


def check_same_tokenizer_on_every_rank(tokenizer: Tokenizer, strategy: Any) -> None:
    """Refuse to train when the ranks resolved different tokenizers. Collective: every rank
    of ``strategy`` (a Lightning strategy) calls it and raises alike.

    Raises:
        ConfigError: rank 0's tokenizer differs from another rank's.
    """
    digest = hashlib.sha256(tokenizer.to_json_str().encode()).hexdigest()
    same = strategy.broadcast(digest, src=0) == digest
    if not strategy.reduce_boolean_decision(same, all=True):
        raise ConfigError(
            "the DDP ranks resolved different tokenizers (their token ids would differ); give "
            "every rank the same tokenizer: tokenizer=saved tokenizer.path=<a JSON written by "
            "rank 0's Tokenizer.save>, or resume from a checkpoint.")
