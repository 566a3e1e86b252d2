"""Hugging Face ViT (Dosovitskiy et al. 2021) in mmtf's ``VisionEncoder``, and the loader of
every pretrained vision folder (ViT here, CLIP's tower in :mod:`mmtf.pretrained.clip`).

A config translation and a name table. HF's ViT is a pre-LN ViT with a biased patch
convolution, a CLS token, a position table that covers the CLS position, biased q/k/v/out and
MLP layers, exact GELU, LayerNorm eps 1e-12 and a final LayerNorm (``last_hidden_state``; the
pooler is not read). Two rewrites, written once in the table: q/k/v become ``to_q`` and the fused
``to_kv`` (key rows, then value rows), and the CLS position is added to the CLS token (a constant
plus a constant: the same sum HF computes, and what mmtf's CLS token, which has no position,
holds). Why: see docs/design/vision-gpt2-import.md.

Read from a ``ViTModel`` folder (tensors unprefixed), a ``ViTFor*`` one (``vit.``), or the
encoder of a ``VisionEncoderDecoderModel`` folder (``encoder.``, config under ``encoder``).

Shapes: c = hidden_size, p = patches, s = p + 1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from mmtf.errors import UserError
from mmtf.pretrained import clip
from mmtf.pretrained.hf import (
    Source,
    block_map,
    copy_weights,
    open_hf_model,
    original_names,
    require_config,
    split_back,
)

if TYPE_CHECKING:
    from mmtf.encoders.vision import VisionEncoder

MODEL_TYPES = frozenset({"vit"})
CONFIG_GROUP = "vit"
ANCHOR = "embeddings.patch_embeddings.projection.weight"
ENCODER_DECODER = "vision-encoder-decoder"
# The original module of each role of a block (mmtf.pretrained.hf.block_map).
BLOCK = {"norm_self": "layernorm_before", "q": "attention.attention.query",
         "k": "attention.attention.key", "v": "attention.attention.value",
         "out": "attention.output.dense", "norm_mlp": "layernorm_after",
         "fc_in": "intermediate.dense", "fc_out": "output.dense"}
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "quick_gelu": "quick_gelu"}
OWNER = "VisionEncoder.load_pretrained"


def load_hf_vision(encoder: VisionEncoder, source: str | Path) -> None:
    """Fill ``encoder`` from a Hugging Face ViT or CLIP folder or hub id.

    Every setting that shapes the computation is compared with ``config.json`` first and every
    tensor name and shape before any copy, so a refused folder changes nothing.

    Raises:
        UserError: a missing file, a folder of another architecture (the ``model_type`` or
            ``encoder.model_type`` field), a setting of ``model.encoder`` that differs from the
            folder's (both values and the overrides that fix it), a missing tensor.
    """
    model = open_hf_model(source, model_types={*MODEL_TYPES, *clip.MODEL_TYPES, ENCODER_DECODER},
                          owner=OWNER)
    config = model.config
    if model.model_type == ENCODER_DECODER:
        config = model.field("encoder", owner=OWNER)
    family = FAMILIES.get(config.get("model_type"))
    if family is None:
        field = "encoder.model_type" if model.model_type == ENCODER_DECODER else "model_type"
        raise UserError(f"{OWNER}: {model.source}/config.json has {field}="
                        f"{config.get('model_type')!r}, but the vision encoder reads "
                        f"{', '.join(repr(t) for t in sorted(FAMILIES))}; point "
                        f"model.encoder.pretrained at a ViT or CLIP folder.")
    built = {**encoder.config, "image_size": [encoder.grid[0] * encoder.patch_size,
                                              encoder.grid[1] * encoder.patch_size]}
    require_config(OWNER, built, family.encoder_values(config), source=model.source,
                   key_prefix="model.encoder",
                   hint=f", or use model/encoder={family.config_group}, which sets them")
    prefix = model.prefix(family.anchor, owner=OWNER)
    mapping = family.weight_map(config, prefix)
    copy_weights(encoder, model.tensors(original_names(mapping)), mapping, owner=OWNER,
                 source=model.source)


def encoder_values(config: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The ``VisionEncoder`` settings a ViT needs: ``{key: (value, its config field)}``."""
    kind = f"model_type={config.get('model_type')!r}"

    def field(key: str) -> str:
        return f"{key}={config.get(key)!r}"

    size = config.get("image_size", 224)
    act = config.get("hidden_act", "gelu")
    qkv_bias = config.get("qkv_bias", True)
    return {
        "dim": (config.get("hidden_size"), field("hidden_size")),
        "depth": (config.get("num_hidden_layers"), field("num_hidden_layers")),
        "num_heads": (config.get("num_attention_heads"), field("num_attention_heads")),
        "mlp_ratio": (config.get("intermediate_size", 0) / config.get("hidden_size", 1),
                      field("intermediate_size")),
        "mlp": (ACTIVATIONS.get(act, act), field("hidden_act")),
        "norm_eps": (config.get("layer_norm_eps", 1e-12), field("layer_norm_eps")),
        "patch_size": (config.get("patch_size", 16), field("patch_size")),
        "in_channels": (config.get("num_channels", 3), field("num_channels")),
        "image_size": ([size, size] if isinstance(size, int) else list(size),
                       field("image_size")),
        "bias": (True if qkv_bias else "o", field("qkv_bias")),
        "num_kv_heads": (None, kind), "norm": ("layernorm", kind), "stem": ("patch", kind),
        "pos_embed": ("learned", kind), "cls_token": (True, kind), "patch_bias": (True, kind),
        "embed_norm": (False, kind), "final_norm": (True, kind), "mlp_bias": (True, kind),
        "causal": (False, kind),
    }


def weight_map(config: dict[str, Any], prefix: str) -> dict[str, Source]:
    """``{VisionEncoder name: ViT name(s)}`` for the ViT of ``config`` with tensors under
    ``prefix``."""
    e = f"{prefix}embeddings."
    mapping: dict[str, Source] = {
        "patch_embed.weight": f"{e}patch_embeddings.projection.weight",
        "patch_embed.bias": f"{e}patch_embeddings.projection.bias",
        "pos_embed": (f"{e}position_embeddings", _patch_positions),
        "cls_token": ((f"{e}cls_token", f"{e}position_embeddings"), _folded_cls),
        "stack.norm.weight": f"{prefix}layernorm.weight",
        "stack.norm.bias": f"{prefix}layernorm.bias",
    }
    for i in range(config["num_hidden_layers"]):
        mapping.update(block_map(f"stack.blocks.{i}.", f"{prefix}encoder.layer.{i}.", BLOCK,
                                 qkv_bias=config.get("qkv_bias", True)))
    return mapping


def hf_config(encoder: VisionEncoder) -> dict[str, Any]:
    """``config.json`` of ``encoder`` as a ``ViTModel``.

    Raises:
        UserError: the encoder is not in ViT's configuration (the setting is named).
    """
    dim, (gh, gw) = encoder.dim, encoder.grid
    block = encoder.stack.blocks[0]
    if gh != gw:
        raise UserError(f"export format=hf: ViT's position table is square, this encoder's "
                        f"grid is {gh}x{gw} (model.encoder.image_size).")
    config = {"model_type": "vit", "architectures": ["ViTModel"], "hidden_size": dim,
              "num_hidden_layers": encoder.stack.depth,
              "num_attention_heads": block.self_attn.num_heads,
              "intermediate_size": block.mlp.fc_in.out_features,
              "hidden_act": {"gelu_tanh": "gelu_new"}.get(block.mlp.kind, block.mlp.kind),
              "layer_norm_eps": block.norm_self.eps, "image_size": gh * encoder.patch_size,
              "patch_size": encoder.patch_size, "num_channels": encoder.in_channels,
              "qkv_bias": block.self_attn.to_q.bias is not None, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0}
    built = {**encoder.config, "image_size": [gh * encoder.patch_size] * 2}
    require_config("export format=hf", built, encoder_values(config), source="ViT",
                   key_prefix="model.encoder")
    return config


def hf_state_dict(encoder: VisionEncoder, prefix: str = "") -> dict[str, Tensor]:
    """``encoder``'s weights under ``ViTModel``'s names (the inverse of :func:`weight_map`): the
    folded CLS token goes back as the token with a zero CLS position; ``to_kv`` is split."""
    state = {k: v.detach().cpu() for k, v in encoder.state_dict().items()}
    out = split_back(state, weight_map(hf_config(encoder), prefix))
    e = f"{prefix}embeddings."
    cls = state["cls_token"]                                             # (1, 1, c)
    out[f"{e}cls_token"] = cls
    out[f"{e}position_embeddings"] = torch.cat([torch.zeros_like(cls), state["pos_embed"]],
                                               dim=1)                   # (1, s, c)
    return {k: v.contiguous() for k, v in out.items()}


def _patch_positions(table: Tensor) -> Tensor:
    return table[:, 1:]                                                  # (1, s, c) -> (1, p, c)


def _folded_cls(token: Tensor, table: Tensor) -> Tensor:
    return token + table[:, :1]                                          # (1, 1, c)


class Family(NamedTuple):
    """What the loader needs of one vision family: its conf/model/encoder group, the tensor name
    that locates its prefix, its config translation and its name table."""

    config_group: str
    anchor: str
    encoder_values: Callable[[dict[str, Any]], dict[str, tuple[Any, str]]]
    weight_map: Callable[[dict[str, Any], str], dict[str, Source]]


FAMILIES: dict[str, Family] = {
    **{t: Family(CONFIG_GROUP, ANCHOR, encoder_values, weight_map) for t in MODEL_TYPES},
    **{t: Family(clip.CONFIG_GROUP, clip.ANCHOR, clip.encoder_values, clip.weight_map)
       for t in clip.MODEL_TYPES},
}
