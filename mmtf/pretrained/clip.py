"""CLIP's vision tower (Radford et al. 2021, arXiv:2103.00020) in mmtf's ``VisionEncoder``: the
builder :func:`clip_vision_encoder`, a config translation and a name table, read both ways.

A pre-LN ViT with a bias-free patch conv, a class token whose position is folded in,
``pre_layrnorm`` (``embed_norm``), quick-GELU and eps 1e-5. ``post_layernorm`` touches only the
pooled token, so the encoder has ``final_norm=False`` and the export writes it as the identity.
Read from a ``CLIPVisionModel`` or a whole ``CLIPModel`` folder (the text tower is not read).

Shapes: c = hidden_size, p = patches, s = p + 1."""

from __future__ import annotations

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

__all__ = ["clip_vision_encoder", "resolved_sizes"]

# The name every CLIP vision tower's tensors contain once; its prefix is the tower's.
ANCHOR = "embeddings.class_embedding"
# CLIPVisionConfig's defaults, for configs that store only what differs from them.
DEFAULTS: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 3072,
                            "num_hidden_layers": 12, "num_attention_heads": 12,
                            "num_channels": 3, "image_size": 224, "patch_size": 32,
                            "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
# The original module of each role of a block (mmtf.pretrained.names.block_links).
BLOCK = {"norm_self": "layer_norm1", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
         "v": "self_attn.v_proj", "out": "self_attn.out_proj", "norm_mlp": "layer_norm2",
         "fc_in": "mlp.fc1", "fc_out": "mlp.fc2"}


def clip_vision_encoder(*, pretrained: str | Path | None = None, dim: int | None = 768,
                        depth: int | None = 12, num_heads: int | None = 12,
                        mlp_ratio: float | None = 4.0, mlp: MlpKind | None = "quick_gelu",
                        norm_eps: float | None = 1e-5, patch_size: int | None = 32,
                        in_channels: int | None = 3, image_size: int | list[int] | None = 224,
                        dropout: float = 0.0, attn_dropout: float = 0.0,
                        activation_checkpointing: bool = False,
                        freeze: bool = False) -> VisionEncoder:
    """A ``VisionEncoder`` in the configuration of CLIP's vision tower, filled from
    ``pretrained``.

    Args:
        pretrained: a ``CLIPVisionModel`` or ``CLIPModel`` folder or hub id (or a
            ``VisionEncoderDecoderModel``'s encoder), an mmtf export, or None (random weights).
        dim, ..., image_size: the tower's ``config.json`` fields of :func:`encoder_values`;
            None reads them, a value must equal them.
        dropout, attn_dropout, activation_checkpointing, freeze: as :class:`VisionEncoder`.

    Raises:
        UserError: see :func:`mmtf.pretrained.vision.build_vision_encoder`.
    """
    sizes = dict(dim=dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, mlp=mlp,
                 norm_eps=norm_eps, patch_size=patch_size, in_channels=in_channels,
                 image_size=image_size, bias=True)
    return build_vision_encoder("clip", pretrained=pretrained, sizes=sizes, dropout=dropout,
                                attn_dropout=attn_dropout, freeze=freeze,
                                activation_checkpointing=activation_checkpointing)


def tower_config(config: dict[str, Any]) -> dict[str, Any]:
    """The vision tower's settings: ``vision_config`` of a ``CLIPModel``, the top level of a
    ``CLIPVisionModel``, missing fields at their CLIPVisionConfig defaults."""
    node = config.get("vision_config") if config.get("model_type") == "clip" else config
    return {**DEFAULTS, **(node or {})}


def encoder_values(config: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The ``VisionEncoder`` settings a CLIP tower needs: ``{key: (value, its config field)}``."""
    tower = tower_config(config)
    where = "vision_config." if config.get("model_type") == "clip" else ""
    return tower_values(tower, lambda key: f"{where}{key}={tower[key]!r}",
                        f"model_type={config.get('model_type')!r}", patch_bias=False,
                        embed_norm=True, final_norm=False, bias=True, mlp_bias=True,
                        causal=False)


def links(config: dict[str, Any], prefix: str) -> list[Link]:
    """The name table of the tower of ``config`` with tensors under ``prefix``; q/k/v become
    ``to_q`` and the fused ``to_kv``."""
    e = f"{prefix}embeddings."
    table = [link("patch_embed.weight", f"{e}patch_embedding.weight"),
             link(("pos_embed", "cls_token"),
                  (f"{e}class_embedding", f"{e}position_embedding.weight"), FOLDED_CLS),
             link("embed_norm.weight", f"{prefix}pre_layrnorm.weight"),
             link("embed_norm.bias", f"{prefix}pre_layrnorm.bias")]
    for i in range(tower_config(config)["num_hidden_layers"]):
        table += block_links(f"stack.blocks.{i}.", f"{prefix}encoder.layers.{i}.", BLOCK)
    return table


def hf_config(encoder: VisionEncoder) -> dict[str, Any]:
    """``config.json`` of ``encoder`` as a ``CLIPVisionModel``.

    Raises:
        UserError: the encoder is not in CLIP's configuration (the setting is named).
    """
    return hf_tower_config(encoder, "CLIP", model_type="clip_vision_model",
                           architectures=["CLIPVisionModel"], attention_dropout=0.0)


def part_links(part: str, module: VisionEncoder, prefix: str = "") -> list[Link]:
    """The name table of a built encoder in CLIP's configuration (:mod:`mmtf.pretrained.peft`).

    Raises:
        UserError: the encoder is not in that configuration (:func:`hf_config`).
    """
    return links(hf_config(module), prefix)


def hf_state_dict(encoder: VisionEncoder, prefix: str = "") -> dict[str, Tensor]:
    """``encoder``'s weights under ``CLIPVisionModel``'s names (``{prefix}vision_model.*``, the
    export direction of :func:`links`); see the module docstring."""
    tower = f"{prefix}vision_model."
    out = export_tensors(encoder.state_dict(), links(hf_config(encoder), tower))
    cls = out[f"{tower}embeddings.class_embedding"]
    out[f"{tower}post_layernorm.weight"] = torch.ones_like(cls)
    out[f"{tower}post_layernorm.bias"] = torch.zeros_like(cls)
    return out


def _load_positions(token: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
    # (c,) and (s, c) -> patch positions (1, p, c), class token + its position (1, 1, c)
    return table[None, 1:], (token + table[0]).reshape(1, 1, -1)


def _save_positions(positions: Tensor, cls: Tensor) -> tuple[Tensor, Tensor]:
    # The folded token goes back as the token, with a zero class position.
    token = cls.reshape(-1)                                              # (c,)
    return token, torch.cat([torch.zeros_like(token)[None], positions[0]])   # (c,), (s, c)


# The class token's position is a constant added to a constant: folded into the token.
FOLDED_CLS = Rule(_load_positions, _save_positions)
