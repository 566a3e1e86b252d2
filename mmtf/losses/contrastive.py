"""Symmetric InfoNCE of a dual encoder: media and caption embeddings, several captions per item,
negatives from the whole global batch across DDP ranks, a learnable temperature.

Similarities are ``logits = s * m @ t.T`` between L2-normalised media rows ``m`` (M, e) and
caption rows ``t`` (T, e), with CLIP's parameterisation of the scale: ``s = exp(logit_scale)``,
``logit_scale`` initialised to ``log(1 / 0.07)`` and ``s`` clamped at 100 (Radford et al. 2021).

Positives are rows and columns with the same item key (:func:`item_keys` of the items' ids):
every caption of an item is a positive of its media row, and a clip that occurs twice in a
global batch is one item, not its own negative. With ``P`` the positive mask (M, T), the loss is
the multi-positive softmax of supervised contrastive learning (Khosla et al. 2020, ``L_out``):
each anchor's cross-entropy against the uniform distribution over its positives, averaged per
anchor, in both directions::

    l_mt(i) = - sum_j P_ij / |P_i.| * log softmax_j(logits_i.)      (media i -> captions)
    l_tm(j) = - sum_i P_ij / |P_.j| * log softmax_i(logits_.j)      (caption j -> media)
    loss    = (mean_i l_mt(i) + mean_j l_tm(j)) / 2

With one caption per item it is CLIP's loss. Why this form: docs/design/contrastive-loss.md.

Global batch: each rank's embeddings are all-gathered with gradients to the local rows
(:func:`mmtf.utils.distributed.all_gather_rows`, whose backward sums every rank's gradient on
them). Each rank's objective is built so that the ranks' objectives sum to ``W * loss`` (W
ranks); DDP averages the parameter gradients over the ranks, which gives exactly the gradient of
``loss`` on one process holding the global batch (the temperature's included).

Shapes: M / T media / caption rows of the global batch, m / t this rank's, e embedding width.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.utils.distributed import all_gather_rows, world

__all__ = ["ContrastiveLoss", "item_keys", "multi_positive_nce"]


def item_keys(ids: Sequence[Any]) -> Tensor:
    """One int64 key per item id: equal ids give equal keys in every process (Python's ``hash``
    of a str is salted per process, so it cannot be compared across ranks).

    Returns:
        (n,) long, the first 8 bytes of the blake2b digest of ``str(id)``.
    """
    return torch.tensor([int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8).digest(),
                                        "little", signed=True) for i in ids], dtype=torch.long)


def anchor_losses(logits: Tensor, positives: Tensor) -> Tensor:
    """Each row's cross-entropy against the uniform distribution over its positives.

    Args:
        logits: (r, c) float; positives: (r, c) bool, at least one True per row.

    Returns:
        (r,) ``-sum_j P_ij log softmax(logits_i)_j / |P_i|``.
    """
    logp = logits.log_softmax(dim=1)                                         # (r, c)
    hits = positives.sum(dim=1)                                              # (r,)
    return -torch.where(positives, logp, 0.0).sum(dim=1) / hits.to(logp.dtype)


def multi_positive_nce(logits: Tensor, positives: Tensor) -> Tensor:
    """The symmetric multi-positive loss of a whole (M, T) similarity matrix (module docstring):
    ``(mean of the media rows' losses + mean of the caption columns' losses) / 2``."""
    return 0.5 * (anchor_losses(logits, positives).mean()
                  + anchor_losses(logits.T, positives.T).mean())


def check_positives(positives: Tensor, media_keys: Tensor, text_count: int) -> None:
    """A global batch the loss is defined on: at least two items, each media row with a caption
    and each caption with its media row.

    Raises:
        UserError: one item only (nothing to contrast with). ValueError: a media row without
            a caption or a caption without its media (the keys do not pair them).
    """
    items = int(torch.unique(media_keys).numel())
    if items < 2:
        raise UserError(f"contrastive loss: the global batch holds {items} item ("
                        f"{media_keys.numel()} media row(s), {text_count} caption(s) of it), so "
                        f"there is no negative to contrast with; raise data.batches.batch_size "
                        f"to >= 2, and set data.batches.drop_last=true if the last batch holds "
                        f"one item.")
    if not bool(positives.any(dim=1).all()):
        raise ValueError("contrastive loss: a media row has no caption with its key in the "
                         "global batch; pass every item's captions with its media.")
    if not bool(positives.any(dim=0).all()):
        raise ValueError("contrastive loss: a caption's key matches no media row in the global "
                         "batch; pass its item's media too.")


class ContrastiveLoss(nn.Module):
    """Symmetric multi-positive InfoNCE with CLIP's learnable temperature (module docstring).

    Args:
        temperature: initial temperature; ``logit_scale`` starts at ``log(1 / temperature)``.
        max_scale: the scale ``exp(logit_scale)`` is clamped at this (CLIP: 100).
        learn_temperature: train ``logit_scale`` (else it stays at its initial value).
        local_loss: each rank computes only its own rows' and columns' losses against the global
            batch (open_clip's ``local_loss``: (m + t) x global work instead of M x T); the value
            returned is still the global loss and the gradients are the same.
    """

    def __init__(self, *, temperature: float = 0.07, max_scale: float = 100.0,
                 learn_temperature: bool = True, local_loss: bool = False) -> None:
        super().__init__()
        if not temperature > 0.0 or not max_scale > 1.0 or 1.0 / temperature > max_scale:
            raise UserError(f"ContrastiveLoss: temperature ({temperature}) must be > 0 and "
                            f"1 / temperature <= max_scale ({max_scale}, > 1); e.g. 0.07 and 100.")
        self.max_scale, self.local_loss = float(max_scale), local_loss
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)),
                                        requires_grad=learn_temperature)

    def extra_repr(self) -> str:
        return f"max_scale={self.max_scale}, local_loss={self.local_loss}"

    def scale(self) -> Tensor:
        """``exp(logit_scale)`` clamped at ``max_scale`` (no gradient past the clamp)."""
        return self.logit_scale.exp().clamp(max=self.max_scale)

    @torch.no_grad()
    def clamp_(self) -> None:
        """Clamp ``logit_scale`` into [0, log(max_scale)] in place, as CLIP does after each
        optimizer step: past the clamp it gets no gradient, but Adam's momentum would still
        move it further away."""
        self.logit_scale.clamp_(0.0, math.log(self.max_scale))

    def forward(self, media: Tensor, text: Tensor, media_keys: Tensor, text_keys: Tensor, *,
                gather: bool = True) -> Tensor:
        """The loss of this rank's rows against the global batch.

        Args:
            media: (m, e) media embeddings; text: (t, e) caption embeddings (normalised here).
            media_keys: (m,) long item key of each media row; text_keys: (t,) of each caption's
                item (:func:`item_keys`).
            gather: negatives from every rank (collective: all ranks call it); False = this
                rank's rows only (validation batches, which ranks may not hold alike).

        Returns:
            The scalar loss of the global batch (every rank returns the same value).

        Raises:
            UserError: the global batch holds one item. ValueError: mismatched shapes or keys.
        """
        if media.dim() != 2 or text.dim() != 2 or media.shape[1] != text.shape[1]:
            raise ValueError(f"ContrastiveLoss: media (m, e) and text (t, e) must share e, got "
                             f"{tuple(media.shape)} and {tuple(text.shape)}.")
        if media_keys.shape != media.shape[:1] or text_keys.shape != text.shape[:1]:
            raise ValueError(f"ContrastiveLoss: one key per row: media_keys "
                             f"{tuple(media_keys.shape)} for {media.shape[0]} media rows, "
                             f"text_keys {tuple(text_keys.shape)} for {text.shape[0]} captions.")
        size = world()[0] if gather else 1
        dtype = torch.promote_types(torch.promote_types(media.dtype, text.dtype), torch.float32)
        with torch.autocast(media.device.type, enabled=False):   # logits, softmax in >= fp32
            media = F.normalize(media.to(dtype), dim=-1)
            text = F.normalize(text.to(dtype), dim=-1)
            media_all, media_at = all_gather_rows(media, grad=True) if size > 1 else (media, 0)
            text_all, text_at = all_gather_rows(text, grad=True) if size > 1 else (text, 0)
            keys_m = all_gather_rows(media_keys)[0] if size > 1 else media_keys     # (M,)
            keys_t = all_gather_rows(text_keys)[0] if size > 1 else text_keys       # (T,)
            positives = keys_m[:, None] == keys_t[None, :]                          # (M, T)
            check_positives(positives, keys_m, keys_t.numel())
            scale = self.scale()
            if not self.local_loss or size == 1:
                # Every rank computes the whole loss; the gather's backward sums the W equal
                # gradients on each rank's rows and DDP's mean divides by W again.
                return multi_positive_nce(scale * media_all @ text_all.T, positives)
            m, t = media.shape[0], text.shape[0]
            rows = scale * media @ text_all.T                                       # (m, T)
            cols = scale * text @ media_all.T                                       # (t, M)
            own_m = anchor_losses(rows, positives[media_at:media_at + m]).sum()
            own_t = anchor_losses(cols, positives[:, text_at:text_at + t].T).sum()
            # Summed over the ranks these are W * loss, as in the branch above.
            objective = size * 0.5 * (own_m / positives.shape[0] + own_t / positives.shape[1])
            value = objective.detach().clone()
            dist.all_reduce(value)
            # The global loss as the value, this rank's objective for the gradient.
            return objective + (value / size - objective).detach()
