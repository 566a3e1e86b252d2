"""Constructor parts (block, front end, SpecAugment, patch, batches, loader, crop, transforms)
and the flat keys they replaced.

Stored run configs, checkpoints and exports may hold the flat keys; :func:`upgrade_config`
moves them into the parts so they build the same module. :func:`flatten_parts` is the way
back: an encoder's ``config`` stays flat, the form exports of either age are compared in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

BLOCK = ("num_kv_heads", "mlp_ratio", "mlp", "norm", "norm_eps", "dropout", "attn_dropout",
         "bias", "mlp_bias")
FRONTEND = ("sample_rate", "n_mels", "n_fft", "hop_length", "win_length", "f_min", "f_max",
            "feature_norm", "feature_mean", "feature_std", "features", "pad_to_seconds")
SPEC_AUGMENT = ("freq_masks", "freq_mask_width", "time_masks", "time_mask_width",
                "time_mask_mode", "time_mask_fraction", "time_mask_multiplicity")
PATCH = ("patch_size", "in_channels", "stem", "stem_convs", "stem_norm", "patch_bias")
BATCHES = ("batch_size", "eval_batch_size", "max_seconds_per_batch", "max_pixels_per_batch",
           "eval_max_seconds_per_batch", "eval_max_pixels_per_batch", "bucketing",
           "bucket_size", "drop_last")
LOADER = ("num_workers", "pin_memory", "persistent_workers")
CROP = {"train_crop": "train", "eval_crop": "eval"}
TRANSFORMS = {"train_transforms": "train", "eval_transforms": "eval"}
# Class name -> {part: (its _target_ or None for a plain mapping, the flat keys it took over,
# or flat key -> its name in the part)}. By class name: every import path and every
# *DataModule subclass is covered.
_BLOCK = {"block": ("mmtf.nn.BlockOptions", BLOCK)}
PARTS: dict[str, dict[str, tuple[str | None, tuple[str, ...] | dict[str, str]]]] = {
    "AudioEncoder": {**_BLOCK, "frontend": ("mmtf.encoders.audio.LogMelFrontEnd", FRONTEND),
                     "spec_augment": ("mmtf.encoders.audio.SpecAugment", SPEC_AUGMENT)},
    "VisionEncoder": {**_BLOCK, "patch": ("mmtf.encoders.vision.PatchOptions", PATCH)},
    "TextDecoder": _BLOCK,
    # Born with its parts: no flat keys to move, listed so flatten_parts inlines them.
    "TextEncoder": {**_BLOCK, "embedding": ("mmtf.nn.EmbeddingOptions", ()),
                    "pooling": ("mmtf.encoders.text.PoolingOptions", ())},
    "DataModule": {"batches": ("mmtf.data.datamodule.BatchOptions", BATCHES),
                   "loader": ("mmtf.data.datamodule.LoaderOptions", LOADER),
                   "crop": (None, CROP), "transforms": (None, TRANSFORMS)},
}


def _parts(target: Any) -> dict[str, tuple[str | None, tuple[str, ...] | dict[str, str]]]:
    name = str(target).rsplit(".", 1)[-1]
    return PARTS.get("DataModule" if name.endswith("DataModule") else name, {})


def moved_keys(target: Any) -> dict[str, str]:
    """The old flat keys of ``target`` (a ``_target_``) -> where they are now
    (``n_mels`` -> ``frontend.n_mels``): what a config error suggests for an old key."""
    out = {}
    for part, (_, keys) in _parts(target).items():
        names = keys if isinstance(keys, dict) else {k: k for k in keys}
        out.update({old: f"{part}.{new}" for old, new in names.items()})
    return out


def upgrade_config(node: Any) -> Any:
    """``node`` (a config tree) with every old flat key of a constructor in :data:`PARTS`
    moved into its part and a data module's ``image_cache_mb`` renamed ``media_cache_mb``.

    Raises:
        ValueError: a flat key beside the part that replaced it, or ``image_cache_mb`` beside
            another ``media_cache_mb``; the message names the key to keep.
    """
    if isinstance(node, list):
        return [upgrade_config(v) for v in node]
    if not isinstance(node, Mapping):
        return node
    node = {k: upgrade_config(v) for k, v in node.items()}
    target = node.get("_target_")
    for part, (part_target, keys) in _parts(target).items():
        names = keys if isinstance(keys, dict) else {k: k for k in keys}
        moved = [old for old in names if old in node]
        if not moved:
            continue
        if part in node:
            raise ValueError(f"{target}: {', '.join(moved)} are the pre-#39 flat form of "
                             f"{part}.*, and the config also has {part}; keep only "
                             f"{part}.{names[moved[0]]}.")
        flat = {names[old]: node.pop(old) for old in moved}
        node[part] = {"_target_": part_target, **flat} if part_target else flat
    old_cache = node.pop("image_cache_mb", None) if "batches" in _parts(target) else None
    if old_cache is not None:
        if node.get("media_cache_mb") and node["media_cache_mb"] != old_cache:
            raise ValueError(f"{target}: data.image_cache_mb ({old_cache}) is the old name of "
                             f"data.media_cache_mb ({node['media_cache_mb']}); keep only "
                             f"data.media_cache_mb.")
        node["media_cache_mb"] = old_cache
    return node


def nest(target: str, **flat: Any) -> dict[str, Any]:
    """Constructor keywords for ``target`` from flat ones (the pretrained builders' form)."""
    return {k: v for k, v in upgrade_config({"_target_": target, **flat}).items()
            if k != "_target_"}


def flatten_parts(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flat form of a (possibly upgraded) constructor config: each part's keys inlined."""
    flat = dict(config)
    for part in {p for parts in PARTS.values() for p in parts}:
        if isinstance(flat.get(part), Mapping):
            flat.update({k: v for k, v in flat.pop(part).items() if k != "_target_"})
    return flat


def as_part(cls: type[T], value: T | Mapping[str, Any] | None) -> T:
    """``value`` as the part ``cls``: a mapping of its fields (a config node, whose
    ``_target_`` is dropped: a ``_recursive_: false`` node arrives uninstantiated) or None
    (the defaults) converted."""
    if isinstance(value, cls):
        return value
    return cls(**{k: v for k, v in (value or {}).items() if k != "_target_"})
