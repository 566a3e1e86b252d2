"""The projection head of an embedding (CLIP / CLAP): pooled features (b, i) -> (b, o).

One builder for every tower: the text encoder's own head (``model.text_encoder.pooling.head``,
:func:`mmtf.encoders.text.projection_head`) and the contrastive task's media and text heads
(``model.head``, ``model.text_head``).

Shapes: b rows, i input width, h hidden width, o output width.
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from mmtf.errors import ConfigError
from mmtf.nn.linear import Linear

HeadKind = Literal["none", "linear", "mlp"]
HEAD_KINDS: tuple[str, ...] = ("none", "linear", "mlp")

__all__ = ["HEAD_KINDS", "HeadKind", "projection"]


def projection(kind: str, in_dim: int, out_dim: int, hidden: int | None = None, *,
               bias: bool = True, owner: str, key: str, out_key: str) -> nn.Module:
    """A projection head (b, in_dim) -> (b, out_dim).

    Args:
        kind: "linear", "mlp" (in -> hidden -> out, GELU between, biased) or "none"
            (identity: ``in_dim`` must equal ``out_dim``).
        hidden: the MLP's hidden width; None = ``in_dim``.
        bias: the linear head's bias (a text encoder's head has none, as CLIP's text
            projection and as its exports expect).
        owner, key, out_key: for messages: the class, the config key of ``kind`` and of the
            output width.

    Raises:
        ConfigError: an unknown kind, or "none" between different widths.
    """
    if kind == "linear":
        return Linear(in_dim, out_dim, bias=bias)
    if kind == "mlp":
        width = hidden or in_dim
        return nn.Sequential(Linear(in_dim, width), nn.GELU(), Linear(width, out_dim))
    if kind == "none":
        if in_dim != out_dim:
            raise ConfigError(f"{owner}: {key}=none but the width before it ({in_dim}) is not "
                              f"{out_key} ({out_dim}); set {key}=linear or mlp, or "
                              f"{out_key}={in_dim}.")
        return nn.Identity()
    raise ConfigError(f"{owner}: {key} ({kind!r}) must be one of {', '.join(HEAD_KINDS)}.")
