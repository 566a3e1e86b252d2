"""CLAP score of generated captions: the cosine between each caption's text embedding and its
media's embedding, both from one contrastive checkpoint, averaged over the scored items.

``python -m mmtf.evaluate ckpt_path=<captioner> clap_ckpt=<contrastive ckpt>`` reports it as
``<split>/clap_score`` beside CIDEr-D and SPIDEr (and per item in ``predictions.jsonl``). The
media are each test item's file (a shard member decoded in memory) read as the contrastive
checkpoint reads its inputs (:mod:`mmtf.predict.embed`: its sample rate; audio longer than its
``max_seconds`` cropped to its start), not the captioner's crop. An image captioner with an
image-text checkpoint gets the same cosine as ``<split>/clip_score``: the raw mean cosine, not
Hessel et al.'s CLIPScore (2.5 * max(cos, 0)). Why: docs/design/retrieval-index.md

Shapes: n scored items, e = the embedding width.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mmtf.errors import UserError
from mmtf.predict.embed import require_contrastive
from mmtf.predict.inputs import Input
from mmtf.predict.model import Model, load
from mmtf.tasks import CaptioningTask

SCORE_NAMES = {"audio": "clap_score", "image": "clip_score"}


def clap_model(ckpt_path: str | os.PathLike, captioner: Any, *,
               device: str = "cpu") -> tuple[Model, str]:
    """The contrastive checkpoint that scores ``captioner``'s captions, and the score's name.

    Raises:
        UserError: the captioner writes no captions, the checkpoint is not contrastive, or it
            embeds another modality than the captioner reads.
    """
    if not isinstance(captioner, CaptioningTask):
        raise UserError(f"clap_ckpt={ckpt_path} scores generated captions, and a "
                        f"{type(captioner).__name__} checkpoint writes none; remove clap_ckpt.")
    model, _ = load(ckpt_path, device=device)
    require_contrastive(model.task, f"clap_ckpt={ckpt_path}")
    media, reads = model.task.modality, captioner.modality
    if media != reads:
        kind = "an audio-text (CLAP)" if reads == "audio" else "an image-text (CLIP)"
        raise UserError(f"clap_ckpt={ckpt_path} embeds {media} but the captioner reads {reads}; "
                        f"name {kind} contrastive checkpoint.")
    return model, SCORE_NAMES[media]


def media_input(item: Any, model: Model) -> Input:
    """What the embedding reads for a data item: its file, or a shard member decoded in memory
    (audio at the checkpoint's rate, images as RGB uint8)."""
    from mmtf.data.shards import ShardItem, read_member  # loaded here: shards are rare

    if not isinstance(item, ShardItem):
        return item.path

    data = read_member(item)
    if model.task.modality == "audio":
        from mmtf.data.audio import load_audio

        return load_audio(item.path, sample_rate=model.task.encoder.sample_rate, data=data,
                          where=item.where)
    from mmtf.data.image import load_image

    return load_image(item.path, data=data, where=item.where)


@torch.no_grad()
def caption_scores(model: Model, media: Sequence[Input], captions: Sequence[str], *,
                   batch_size: int = 16) -> Tensor:
    """(n,) cosine of each caption with its media input, ``batch_size`` pairs at a time."""
    if len(media) != len(captions):
        raise ValueError(f"caption_scores: {len(media)} media for {len(captions)} captions.")
    embed_media = model.embed_audio if model.task.modality == "audio" else model.embed_image
    out = []
    for start in range(0, len(media), batch_size):
        m = embed_media(list(media[start:start + batch_size]), batch_size=batch_size)  # (b, e)
        t = model.embed_text(list(captions[start:start + batch_size]),
                             batch_size=batch_size)                                # (b, e)
        out.append((m * t.to(m)).sum(-1).cpu())                                    # (b,)
    return torch.cat(out) if out else torch.zeros(0)


def items_by_id(datamodule: Any, split: str) -> dict[str, Any]:
    """The items of a split by the id their prediction rows carry: a mixture's ids are
    prefixed with the source's name (as :class:`~mmtf.data.mixture.MixtureDataset` does).

    Raises:
        UserError: one id names two different media files.
    """
    from mmtf.data.mixture import MixtureDataModule  # mixtures only

    if isinstance(datamodule, MixtureDataModule):
        pairs = [(f"{s.name}/{item.id}", item) for s in datamodule.members(split)
                 for item in s.module.items(split)]
    else:
        pairs = [(str(item.id), item) for item in datamodule.items(split)]
    out: dict[str, Any] = {}
    for key, item in pairs:
        seen = out.setdefault(key, item)
        if seen is not item and str(seen.path) != str(item.path):
            raise UserError(f"clap_ckpt: the {split} id {key!r} names two media files "
                            f"({seen.path}, {item.path}); the CLAP score needs one per id "
                            f"(give the items unique ids).")
    return out


def score_predictions(model: Model, name: str, rows: list[dict[str, Any]],
                      items: dict[str, Any], *, batch_size: int = 16) -> float:
    """Add ``name`` (the cosine) to each prediction row (``id``, ``prediction``) and return
    the mean over the rows; ``items``: :func:`items_by_id`.

    Raises:
        UserError: no rows, or a row whose id names no item.
    """
    if not rows:
        raise UserError(f"clap_ckpt: no generated captions to score ({name} needs the test "
                        f"run's predictions).")
    missing = [str(row["id"]) for row in rows if str(row["id"]) not in items]
    if missing:
        raise UserError(f"clap_ckpt: prediction id {missing[0]!r} names no item of the split "
                        f"({len(missing)} such); {name} needs each id's media file.")
    media = [media_input(items[str(row["id"])], model) for row in rows]
    captions = [str(row["prediction"]) for row in rows]
    scores = caption_scores(model, media, captions, batch_size=batch_size)        # (n,)
    for row, score in zip(rows, scores.tolist()):
        row[name] = score
    return float(scores.mean())


__all__ = ["SCORE_NAMES", "caption_scores", "clap_model", "items_by_id", "score_predictions"]
