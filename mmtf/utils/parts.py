"""Where the flat constructor keys of configs written before issue #39 went.

Encoders and decoders take their transformer block options (:class:`mmtf.nn.BlockOptions`), the
audio front end (:class:`~mmtf.encoders.audio.LogMelFrontEnd`) and SpecAugment as parts instead
of dozens of flat keywords. Run configs, checkpoints and export folders written before hold the
flat keys; :func:`upgrade_config` moves them into the parts, so they still build the same module
(same ``state_dict`` keys, same values). :func:`flatten_parts` is the way back: an encoder's
``config`` stays flat, the form export folders of either age are compared against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BLOCK = ("num_kv_heads", "mlp_ratio", "mlp", "norm", "norm_eps", "dropout", "attn_dropout",
         "bias", "mlp_bias")
FRONTEND = ("sample_rate", "n_mels", "n_fft", "hop_length", "win_length", "f_min", "f_max",
            "feature_norm", "feature_mean", "feature_std", "features", "pad_to_seconds")
SPEC_AUGMENT = ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width",
                "time_mask_mode", "time_mask_fraction", "time_mask_multiplicity")
# part name -> (its _target_, the flat keys it took over), per constructor that has parts.
_BLOCK = {"block": ("mmtf.nn.BlockOptions", BLOCK)}
PARTS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "mmtf.encoders.AudioEncoder": {
        **_BLOCK, "frontend": ("mmtf.encoders.audio.LogMelFrontEnd", FRONTEND),
        "spec_augment": ("mmtf.encoders.audio.SpecAugment", SPEC_AUGMENT)},
    "mmtf.encoders.VisionEncoder": _BLOCK,
    "mmtf.decoders.TextDecoder": _BLOCK,
}
PARTS["mmtf.encoders.audio.AudioEncoder"] = PARTS["mmtf.encoders.AudioEncoder"]
PARTS["mmtf.encoders.vision.VisionEncoder"] = PARTS["mmtf.encoders.VisionEncoder"]
PARTS["mmtf.decoders.text.TextDecoder"] = PARTS["mmtf.decoders.TextDecoder"]


def upgrade_config(node: Any) -> Any:
    """``node`` (a config tree of dicts and lists) with every pre-#39 flat key of a constructor
    in :data:`PARTS` moved into its part; anything else is returned as it is.

    Raises:
        ValueError: a node holds a flat key and the part that replaced it (one config, two
            values): the message names both.
    """
    if isinstance(node, list):
        return [upgrade_config(v) for v in node]
    if not isinstance(node, Mapping):
        return node
    node = {k: upgrade_config(v) for k, v in node.items()}
    for part, (target, keys) in PARTS.get(str(node.get("_target_")), {}).items():
        flat = {k: node.pop(k) for k in keys if k in node}
        if not flat:
            continue
        if part in node:
            raise ValueError(f"{node['_target_']}: {', '.join(flat)} are the pre-#39 flat "
                             f"form of {part}.*, and the config also has {part}; keep only "
                             f"{part}.{next(iter(flat))}.")
        node[part] = {"_target_": target, **flat}
    return node


def nest(target: str, **flat: Any) -> dict[str, Any]:
    """Constructor keywords for ``target`` from flat ones (the pretrained builders' form)."""
    return {k: v for k, v in upgrade_config({"_target_": target, **flat}).items()
            if k != "_target_"}


def flatten_parts(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flat form of a (possibly upgraded) constructor config: each part's keys inlined."""
    flat = dict(config)
    for part in ("block", "frontend", "spec_augment"):
        if isinstance(flat.get(part), Mapping):
            flat.update({k: v for k, v in flat.pop(part).items() if k != "_target_"})
    return flat
