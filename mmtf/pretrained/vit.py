"""Hugging Face ViT (Dosovitskiy et al. 2021) in mmtf's ``VisionEncoder``: the builder
:func:`vit_encoder`, a config translation and a name table.

A pre-LN ViT with biased layers, exact GELU, eps 1e-12 and a final LayerNorm (the pooler is not
read). The table fuses k/v into ``to_kv`` and folds the CLS position into the CLS token (export
writes a zero CLS position). Read from ``ViTModel``, ``ViTFor*`` (``vit.``) or a
``VisionEncoderDecoderModel``'s encoder. Why: docs/design/vision-gpt2-import.md.

Shapes: c = hidden_size, p = patches, s = p + 1."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mmtf.nn.transformer import MlpKind
from mmtf.pretrained.names import Link, Rule, block_links, export_tensors, link
from mmtf.pretrained.vision import (
    build_vision_encoder,
    hf_tower_config,
    resolved_sizes,
    tower_values,
)

if TYPE_CHECKING:
    from mmtf.encoders.vision import VisionEncoder

__all__ = ["resolved_sizes", "vit_encoder"]

ANCHOR = "embeddings.patch_embeddings.projection.weight"
# The original module of each role of a block (mmtf.pretrained.names.block_links).
BLOCK = {"norm_self": "layernorm_before", "q": "attention.attention.query",
         "k": "attention.attention.key", "v": "attention.attention.value",
         "out": "attention.output.dense", "norm_mlp": "layernorm_after",
         "fc_in": "intermediate.dense", "fc_out": "output.dense"}
# The same modules as transformers >= 5 names them at load time (its ViT renames the
# checkpoint's modules): the names a PEFT adapter made there uses (peft_module_name).
LIVE_BLOCK = {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj",
              "out": "attention.o_proj", "fc_in": "mlp.fc1", "fc_out": "mlp.fc2"}
_LIVE = {BLOCK[role]: live for role, live in LIVE_BLOCK.items()}
_LAYER = re.compile(r"(?:^|(?<=\.))encoder\.layer\.(\d+)\.(.+)$")
# ViTConfig's defaults of the fields a config may leave out.
DEFAULTS: dict[str, Any] = {"image_size": 224, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
                            "patch_size": 16, "num_channels": 3, "qkv_bias": True}


def vit_encoder(*, pretrained: str | Path | None = None, dim: int | None = 768,
                depth: int | None = 12, num_heads: int | None = 12,
                mlp_ratio: float | None = 4.0, mlp: MlpKind | None = "gelu",
                norm_eps: float | None = 1e-12, patch_size: int | None = 16,
                in_channels: int | None = 3, image_size: int | list[int] | None = 224,
                bias: bool | str | None = True, dropout: float = 0.0,
                attn_dropout: float = 0.0, activation_checkpointing: bool = False,
                freeze: bool = False) -> VisionEncoder:
    """A ``VisionEncoder`` in ViT's configuration, filled from ``pretrained``.

    Args:
        pretrained: a Hugging Face ViT folder or hub id (or a ``VisionEncoderDecoderModel``'s
            encoder), an mmtf export of such an encoder, or None (random weights).
        dim, ..., bias: the ``config.json`` fields of :func:`encoder_values` (``bias``: True,
            or "o" without ``qkv_bias``); None reads them, a value must equal them.
        dropout, attn_dropout, activation_checkpointing, freeze: as :class:`VisionEncoder`.

    Raises:
        UserError: see :func:`mmtf.pretrained.vision.build_vision_encoder`.
    """
    sizes = dict(dim=dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, mlp=mlp,
                 norm_eps=norm_eps, patch_size=patch_size, in_channels=in_channels,
                 image_size=image_size, bias=bias)
    return build_vision_encoder("vit", pretrained=pretrained, sizes=sizes, dropout=dropout,
                                attn_dropout=attn_dropout, freeze=freeze,
                                activation_checkpointing=activation_checkpointing)


def encoder_values(config: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The ``VisionEncoder`` settings a ViT needs: ``{key: (value, its config field)}``."""
    def field(key: str) -> str:
        return f"{key}={config.get(key)!r}"

    tower = {**DEFAULTS, **config}
    return tower_values(tower, field, f"model_type={config.get('model_type')!r}",
                        read={"bias": (True if tower["qkv_bias"] else "o", field("qkv_bias"))},
                        patch_bias=True, embed_norm=False, final_norm=True, mlp_bias=True,
                        causal=False)


def links(config: dict[str, Any], prefix: str) -> list[Link]:
    """The name table of the ViT of ``config`` with tensors under ``prefix``."""
    e = f"{prefix}embeddings."
    table = [link("patch_embed.weight", f"{e}patch_embeddings.projection.weight"),
             link("patch_embed.bias", f"{e}patch_embeddings.projection.bias"),
             link(("pos_embed", "cls_token"), (f"{e}cls_token", f"{e}position_embeddings"),
                  FOLDED_CLS),
             link("stack.norm.weight", f"{prefix}layernorm.weight"),
             link("stack.norm.bias", f"{prefix}layernorm.bias")]
    for i in range(config["num_hidden_layers"]):
        table += block_links(f"stack.blocks.{i}.", f"{prefix}encoder.layer.{i}.", BLOCK,
                             qkv_bias=config.get("qkv_bias", True))
    return table


def hf_config(encoder: VisionEncoder) -> dict[str, Any]:
    """``config.json`` of ``encoder`` as a ``ViTModel``.

    Raises:
        UserError: the encoder is not in ViT's configuration (the setting is named).
    """
    block = encoder.stack.blocks[0]
    return hf_tower_config(encoder, "ViT", model_type="vit", architectures=["ViTModel"],
                           qkv_bias=block.self_attn.to_q.bias is not None,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def part_links(part: str, module: VisionEncoder, prefix: str = "") -> list[Link]:
    """The name table of a built encoder in ViT's configuration (:mod:`mmtf.pretrained.peft`).

    Raises:
        UserError: the encoder is not in that configuration (:func:`hf_config`).
    """
    return links(hf_config(module), prefix)


def peft_module_name(name: str) -> str:
    """A block module's checkpoint name (``encoder.layer.3.attention.attention.query``) as the
    installed transformers names the module (``layers.3.attention.q_proj``), which is what a
    PEFT folder made there holds and what ``PeftModel.from_pretrained`` looks for (peft does
    not rename ViT adapters); other names are unchanged."""
    match = _LAYER.search(name)
    if match is None or match.group(2) not in _LIVE:
        return name
    return f"{name[:match.start()]}layers.{match.group(1)}.{_LIVE[match.group(2)]}"


def hf_state_dict(encoder: VisionEncoder, prefix: str = "") -> dict[str, Tensor]:
    """``encoder``'s weights under ``ViTModel``'s names (:func:`links`, the export direction)."""
    return export_tensors(encoder.state_dict(), links(hf_config(encoder), prefix))


def _load_positions(token: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
    # (1, 1, c) and (1, s, c) -> patch positions (1, p, c), CLS token + its position (1, 1, c)
    return table[:, 1:], token + table[:, :1]


def _save_positions(positions: Tensor, cls: Tensor) -> tuple[Tensor, Tensor]:
    # The folded token goes back as the token, with a zero CLS position.
    return cls, torch.cat([torch.zeros_like(cls), positions], dim=1)     # (1, 1, c), (1, s, c)


# The CLS position is a constant added to a constant: folded into the token.
FOLDED_CLS = Rule(_load_positions, _save_positions)
