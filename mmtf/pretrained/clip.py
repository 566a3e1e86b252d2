"""CLIP's vision tower (Radford et al. 2021, arXiv:2103.00020) in mmtf's ``VisionEncoder``.

A config translation and a name table. The tower is a pre-LN ViT with a bias-free patch
convolution, a ``class_embedding``, a ``position_embedding`` that covers the class token, a
LayerNorm over the embedded tokens before the first block (``pre_layrnorm``, mmtf's
``embed_norm``), quick-GELU MLPs and LayerNorm eps 1e-5. Its ``post_layernorm`` applies to the
pooled class token only; the sequence (``last_hidden_state``, what a captioner cross-attends to)
has no final norm, so the mmtf encoder is built with ``final_norm=False``.

Read from a ``CLIPVisionModel`` folder (``model_type: clip_vision_model``, tensors under
``vision_model.``) or a whole ``CLIPModel`` folder (``model_type: clip``, the tower's config in
``vision_config``; the text tower is not read).

Export (``format=hf``, inside a ``VisionEncoderDecoderModel``): :func:`hf_config` and
:func:`hf_state_dict` write the tower as a ``CLIPVisionModel``; the folded class token goes back
with a zero class position, and ``post_layernorm``, which only the pooled output reads and
mmtf's encoder does not hold, is written as the identity (ones, zeros).

Shapes: c = hidden_size, p = patches, s = p + 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mmtf.errors import UserError
from mmtf.pretrained.hf import Source, block_map, require_config, split_back

if TYPE_CHECKING:
    from mmtf.encoders.vision import VisionEncoder

MODEL_TYPES = frozenset({"clip", "clip_vision_model"})
CONFIG_GROUP = "clip_vision"
# The name every CLIP vision tower's tensors contain once; its prefix is the tower's.
ANCHOR = "embeddings.class_embedding"
# CLIPVisionConfig's defaults, for configs that store only what differs from them.
DEFAULTS: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 3072,
                            "num_hidden_layers": 12, "num_attention_heads": 12,
                            "num_channels": 3, "image_size": 224, "patch_size": 32,
                            "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
# The original module of each role of a block (mmtf.pretrained.hf.block_map).
BLOCK = {"norm_self": "layer_norm1", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
         "v": "self_attn.v_proj", "out": "self_attn.out_proj", "norm_mlp": "layer_norm2",
         "fc_in": "mlp.fc1", "fc_out": "mlp.fc2"}
ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}


def tower_config(config: dict[str, Any]) -> dict[str, Any]:
    """The vision tower's settings: ``vision_config`` of a ``CLIPModel``, the top level of a
    ``CLIPVisionModel``, missing fields at their CLIPVisionConfig defaults."""
    node = config.get("vision_config") if config.get("model_type") == "clip" else config
    return {**DEFAULTS, **(node or {})}


def encoder_values(config: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The ``VisionEncoder`` settings a CLIP tower needs: ``{key: (value, its config field)}``."""
    tower = tower_config(config)
    where = "vision_config." if config.get("model_type") == "clip" else ""
    kind = f"model_type={config.get('model_type')!r}"

    def field(key: str) -> str:
        return f"{where}{key}={tower[key]!r}"

    size = tower["image_size"]
    act = tower["hidden_act"]
    return {
        "dim": (tower["hidden_size"], field("hidden_size")),
        "depth": (tower["num_hidden_layers"], field("num_hidden_layers")),
        "num_heads": (tower["num_attention_heads"], field("num_attention_heads")),
        "mlp_ratio": (tower["intermediate_size"] / tower["hidden_size"],
                      field("intermediate_size")),
        "mlp": (ACTIVATIONS.get(act, act), field("hidden_act")),
        "norm_eps": (tower["layer_norm_eps"], field("layer_norm_eps")),
        "patch_size": (tower["patch_size"], field("patch_size")),
        "in_channels": (tower["num_channels"], field("num_channels")),
        "image_size": ([size, size] if isinstance(size, int) else list(size),
                       field("image_size")),
        "num_kv_heads": (None, kind), "norm": ("layernorm", kind), "stem": ("patch", kind),
        "pos_embed": ("learned", kind), "cls_token": (True, kind), "patch_bias": (False, kind),
        "embed_norm": (True, kind), "final_norm": (False, kind), "bias": (True, kind),
        "mlp_bias": (True, kind), "causal": (False, kind),
    }


def weight_map(config: dict[str, Any], prefix: str) -> dict[str, Source]:
    """``{VisionEncoder name: CLIP name(s)}`` for the tower of ``config`` with tensors under
    ``prefix``; q/k/v become ``to_q`` and the fused ``to_kv``."""
    e = f"{prefix}embeddings."
    mapping: dict[str, Source] = {
        "patch_embed.weight": f"{e}patch_embedding.weight",
        "pos_embed": (f"{e}position_embedding.weight", _patch_positions),
        # The class token's position is a constant added to a constant: folded into the token.
        "cls_token": ((f"{e}class_embedding", f"{e}position_embedding.weight"), _folded_cls),
        "embed_norm.weight": f"{prefix}pre_layrnorm.weight",
        "embed_norm.bias": f"{prefix}pre_layrnorm.bias",
    }
    for i in range(tower_config(config)["num_hidden_layers"]):
        mapping.update(block_map(f"stack.blocks.{i}.", f"{prefix}encoder.layers.{i}.", BLOCK))
    return mapping


def hf_config(encoder: VisionEncoder) -> dict[str, Any]:
    """``config.json`` of ``encoder`` as a ``CLIPVisionModel``.

    Raises:
        UserError: the encoder is not in CLIP's configuration (the setting is named).
    """
    (gh, gw), block = encoder.grid, encoder.stack.blocks[0]
    if gh != gw:
        raise UserError(f"export format=hf: CLIP's position table is square, this encoder's "
                        f"grid is {gh}x{gw} (model.encoder.image_size).")
    config = {"model_type": "clip_vision_model", "architectures": ["CLIPVisionModel"],
              "hidden_size": encoder.dim, "intermediate_size": block.mlp.fc_in.out_features,
              "num_hidden_layers": encoder.stack.depth,
              "num_attention_heads": block.self_attn.num_heads,
              "num_channels": encoder.in_channels, "image_size": gh * encoder.patch_size,
              "patch_size": encoder.patch_size,
              "hidden_act": {"gelu_tanh": "gelu_new"}.get(block.mlp.kind, block.mlp.kind),
              "layer_norm_eps": block.norm_self.eps, "attention_dropout": 0.0}
    built = {**encoder.config, "image_size": [gh * encoder.patch_size] * 2}
    require_config("export format=hf", built, encoder_values(config), source="CLIP",
                   key_prefix="model.encoder")
    return config


def hf_state_dict(encoder: VisionEncoder, prefix: str = "") -> dict[str, Tensor]:
    """``encoder``'s weights under ``CLIPVisionModel``'s names (``{prefix}vision_model.*``, the
    inverse of :func:`weight_map`); see the module docstring."""
    state = {k: v.detach().cpu() for k, v in encoder.state_dict().items()}
    tower = f"{prefix}vision_model."
    out = split_back(state, weight_map(hf_config(encoder), tower))
    cls = state["cls_token"].reshape(-1)                                 # (1, 1, c) -> (c,)
    out[f"{tower}embeddings.class_embedding"] = cls
    out[f"{tower}embeddings.position_embedding.weight"] = torch.cat(
        [torch.zeros_like(cls)[None], state["pos_embed"][0]])           # (s, c)
    out[f"{tower}post_layernorm.weight"] = torch.ones_like(cls)
    out[f"{tower}post_layernorm.bias"] = torch.zeros_like(cls)
    return {k: v.contiguous() for k, v in out.items()}


def _patch_positions(table: Tensor) -> Tensor:
    return table[None, 1:]                                               # (s, c) -> (1, p, c)


def _folded_cls(token: Tensor, table: Tensor) -> Tensor:
    return (token + table[0]).reshape(1, 1, -1)                          # (1, 1, c)
