"""The builder the vision families (:mod:`~mmtf.pretrained.vit`, :mod:`~mmtf.pretrained.clip`)
share: a Hugging Face folder (or a ``VisionEncoderDecoderModel``'s encoder) into a
``VisionEncoder``, from the family's ``encoder_values``, ``ANCHOR`` and ``links``; sizes read
from or checked against ``config.json``, every name and shape checked before copying."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mmtf.encoders.vision import VisionEncoder
from mmtf.errors import UserError
from mmtf.hub import CONFIG_FILE, HFModel, is_export, open_hf_model
from mmtf.pretrained import FAMILIES, family_module
from mmtf.pretrained.names import copy_weights, fill_sizes, original_names, require_config
from mmtf.utils.parts import nest

ENCODER_DECODER = "vision-encoder-decoder"
# The families whose folders hold a vision tower this builder reads.
VISION_FAMILIES = ("vit", "clip")
# What the YAML of a vision family sets: sizes, read from config.json when null.
SIZE_KEYS = ("dim", "depth", "num_heads", "mlp_ratio", "mlp", "norm_eps", "patch_size",
             "in_channels", "image_size", "bias")
# config.json's hidden_act -> the VisionEncoder's mlp (and back for the export, gelu_tanh ->
# gelu_new).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "quick_gelu": "quick_gelu"}


def build_vision_encoder(family: str, *, pretrained: str | Path | None, sizes: dict[str, Any],
                         dropout: float, attn_dropout: float, freeze: bool,
                         activation_checkpointing: bool = False) -> VisionEncoder:
    """A ``VisionEncoder`` of ``family``'s architecture, filled from ``pretrained``.

    Args:
        family: the builder's family (:data:`mmtf.pretrained.FAMILIES`); its module provides
            ``ANCHOR``, ``encoder_values`` and ``links``.
        pretrained: a Hugging Face folder or hub id of ``family``, an mmtf export of such an
            encoder (its sizes are the YAML's), or None (random weights).
        sizes: the builder's :data:`SIZE_KEYS`; None = from ``config.json``.

    Raises:
        UserError: a missing file or tensor, a folder of another architecture, a size that
            differs from ``config.json``, or a null size without a Hugging Face folder.
    """
    entry, module = FAMILIES[family], family_module(family)
    owner = f"model.encoder ({entry.builders['encoder']})"
    kind = sorted(entry.model_types)[-1]
    fixed = {k: v for k, (v, _) in module.encoder_values({"model_type": kind}).items()
             if k not in SIZE_KEYS}
    hf = config = None
    needed = None
    if pretrained is not None and not is_export(pretrained):
        hf, config = _open(family, pretrained, owner)
        needed = module.encoder_values(config)
    size = sizes["image_size"]                            # 224 and [224, 224] are one grid
    given = {**sizes, "image_size": [size] * 2 if isinstance(size, int) else size}
    sizes = fill_sizes(owner, given, needed, pretrained=pretrained, fixed=fixed,
                       source=hf.source if hf is not None else str(pretrained),
                       key_prefix="model.encoder")
    if isinstance(size, int):
        sizes["image_size"] = size                        # as the YAML wrote it
    export = pretrained if hf is None else None
    encoder = VisionEncoder(**nest(
        "mmtf.encoders.VisionEncoder", **fixed, **sizes, dropout=dropout,
        attn_dropout=attn_dropout, activation_checkpointing=activation_checkpointing,
        pretrained=export))
    if hf is not None:
        _copy(encoder, family, hf, config, owner)
    if freeze:
        encoder.freeze()
    return encoder


def load_vision(encoder: VisionEncoder, family: str, source: str | Path) -> None:
    """Fill an already built ``encoder`` from ``family``'s folder or hub id: every setting is
    compared with ``config.json`` first and every tensor name and shape before any copy, so a
    refused folder changes nothing.

    Raises:
        UserError: as :func:`build_vision_encoder`.
    """
    owner = f"model.encoder ({FAMILIES[family].builders['encoder']})"
    hf, config = _open(family, source, owner)
    built = {**encoder.config, "image_size": [encoder.grid[0] * encoder.patch_size,
                                              encoder.grid[1] * encoder.patch_size]}
    require_config(owner, built, family_module(family).encoder_values(config), source=hf.source,
                   key_prefix="model.encoder")
    _copy(encoder, family, hf, config, owner)


def _copy(encoder: VisionEncoder, family: str, hf: HFModel, config: dict[str, Any],
          owner: str) -> None:
    module = family_module(family)
    table = module.links(config, hf.prefix(module.ANCHOR, owner=owner))
    copy_weights(encoder, hf.tensors(original_names(table)), table, owner=owner,
                 source=hf.source)


def resolved_sizes(part: str, module: VisionEncoder) -> dict[str, Any]:
    """The sizes a built encoder was given (null ones read from ``config.json``), by builder
    argument; recorded in a run's config so checkpoints rebuild without the folder."""
    return {k: module.config[k] for k in SIZE_KEYS}


def _open(family: str, source: str | Path, owner: str) -> tuple[HFModel, dict[str, Any]]:
    """The folder and its encoder's config; another vision family's folder is refused with
    the config group that reads it."""
    vision = {name: FAMILIES[name] for name in VISION_FAMILIES}
    types = {t for entry in vision.values() for t in entry.model_types}
    model = open_hf_model(source, model_types={*types, ENCODER_DECODER}, owner=owner)
    config, field = model.config, "model_type"
    if model.model_type == ENCODER_DECODER:
        config, field = model.field("encoder", owner=owner), "encoder.model_type"
    kind = config.get("model_type")
    if kind in vision[family].model_types:
        return model, config
    other = next((e for e in vision.values() if kind in e.model_types), None)
    fix = (f"use model/encoder={other.config_groups['encoder']}, which reads it" if other
           else "point model.encoder.pretrained at a folder of this family")
    reads = " or ".join(repr(t) for t in sorted(vision[family].model_types))
    raise UserError(f"{owner}: {model.source}/{CONFIG_FILE} has {field}={kind!r}, but this "
                    f"loader reads {reads}; {fix}.")


def tower_values(tower: Mapping[str, Any], field: Callable[[str], str], kind: str, *,
                 read: Mapping[str, tuple[Any, str]] | None = None,
                 **fixed: Any) -> dict[str, tuple[Any, str]]:
    """A family's ``encoder_values``: the sizes of a ViT-shaped tower from its config fields
    ``tower`` (``field`` names one in messages), the family's ``read`` settings, then the
    settings the architecture fixes (``fixed``, after those every family shares)."""
    size, act = tower.get("image_size"), tower.get("hidden_act")
    return {
        "dim": (tower.get("hidden_size"), field("hidden_size")),
        "depth": (tower.get("num_hidden_layers"), field("num_hidden_layers")),
        "num_heads": (tower.get("num_attention_heads"), field("num_attention_heads")),
        "mlp_ratio": (tower.get("intermediate_size", 0) / tower.get("hidden_size", 1),
                      field("intermediate_size")),
        "mlp": (ACTIVATIONS.get(act, act), field("hidden_act")),
        "norm_eps": (tower.get("layer_norm_eps"), field("layer_norm_eps")),
        "patch_size": (tower.get("patch_size"), field("patch_size")),
        "in_channels": (tower.get("num_channels"), field("num_channels")),
        "image_size": ([size, size] if isinstance(size, int) else list(size),
                       field("image_size")),
        **(read or {}),
        **{key: (value, kind) for key, value in dict(
            num_kv_heads=None, norm="layernorm", stem="patch", pos_embed="learned",
            cls_token=True, **fixed).items()},
    }


def hf_tower_config(encoder: VisionEncoder, source: str, **config: Any) -> dict[str, Any]:
    """``config.json`` of ``encoder`` as ``source``'s tower: ``config`` with the sizes, checked
    against every setting of ``encoder`` (a family's ``hf_config``).

    Raises:
        UserError: the encoder is not in that configuration (the setting is named).
    """
    (gh, gw), block = encoder.grid, encoder.stack.blocks[0]
    if gh != gw:
        raise UserError(f"export format=hf: {source}'s position table is square, this "
                        f"encoder's grid is {gh}x{gw} (model.encoder.image_size).")
    config.update(
        hidden_size=encoder.dim, num_hidden_layers=encoder.stack.depth,
        num_attention_heads=block.self_attn.num_heads,
        intermediate_size=block.mlp.fc_in.out_features,
        hidden_act={"gelu_tanh": "gelu_new"}.get(block.mlp.kind, block.mlp.kind),
        layer_norm_eps=block.norm_self.eps, image_size=gh * encoder.patch_size,
        patch_size=encoder.patch_size, num_channels=encoder.in_channels)
    built = {**encoder.config, "image_size": [gh * encoder.patch_size] * 2}
    values = family_module({"ViT": "vit", "CLIP": "clip"}[source]).encoder_values(config)
    require_config("export format=hf", built, values, source=source,
                   key_prefix="model.encoder")
    return config
