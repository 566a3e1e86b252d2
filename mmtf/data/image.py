"""Image decoding and transform pipelines shared by every mmtf image dataset.

Images are decoded with PIL and converted to RGB (alpha dropped; 16/32-bit integer modes scaled,
float modes clipped, since PIL's ``convert("RGB")`` would clip 16-bit images to white).
Transforms are torchvision ``transforms.v2`` lists; the output is float32.
:func:`pretrained_image_transform` rebuilds a pretrained tower's ``preprocessor_config.json``
preprocessing; :func:`record_image_processors` stores it in the run's config.

Shapes: (3, h, w) per image; uint8 after decoding, float32 after the pipeline."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torchvision.transforms import v2

from mmtf.data.errors import check_media_file
from mmtf.errors import DataError, UserError, require_file
from mmtf.hub import resolve_source

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
                    ".gif")


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert a PIL image of any mode to 8-bit RGB (see the module docstring)."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I"):  # I;16, I;16B, I;16L, I (32-bit int, usually 16-bit data)
        arr = np.asarray(img).astype(np.float64)
        arr = np.clip(np.round(arr / 257.0), 0, 255).astype(np.uint8)  # 65535 -> 255
        return Image.fromarray(arr).convert("RGB")
    if img.mode == "F":
        arr = np.asarray(img).astype(np.float64)
        scale = 255.0 if np.nanmax(arr, initial=0.0) <= 1.0 else 1.0
        arr = np.clip(np.round(np.nan_to_num(arr) * scale), 0, 255).astype(np.uint8)
        return Image.fromarray(arr).convert("RGB")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # PIL warns when a paletted image with transparency goes to RGB
    return img.convert("RGB")


def load_image(path: str | os.PathLike, *, where: str | None = None,
               data: bytes | None = None) -> Tensor:
    """Decode one image file (any format PIL reads) to an RGB (3, h, w) uint8 tensor;
    ``path``, ``where``, ``data`` as :func:`mmtf.data.audio.load_audio`.

    Raises:
        DataError: the file is missing, empty or cannot be decoded (also truncated files).
    """
    if data is None:
        path = Path(path)
        check_media_file(path, where)
    elif not data:
        raise DataError.make("empty_file", path, "member is empty (0 bytes)",
                             "rewrite the shard or remove the sample", where)
    try:
        with Image.open(path if data is None else io.BytesIO(data)) as img:
            img.load()  # decode now: a truncated file fails here, not in the transform
            rgb = to_rgb(img)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise DataError.make("unreadable_image", path, f"cannot be decoded as an image ({e})",
                             "re-encode it (e.g. as PNG/JPEG) or remove it from the index",
                             where) from None
    return v2.functional.pil_to_tensor(rgb)  # (3, h, w) uint8


def build_transform(transforms: Sequence[Any] | None) -> Callable[[Tensor], Tensor]:
    """Compose ``data.transforms.train`` / ``eval`` (``transforms.v2`` objects or Hydra
    ``_target_`` dicts; None: only to float) into one (3, h, w) uint8 -> (3, h', w') float32
    callable; a pipeline that leaves uint8 ends with ``ToDtype(float32, scale=True)``."""
    steps: list[Callable] = []
    for i, t in enumerate(transforms or []):
        if isinstance(t, Mapping):
            from hydra.utils import instantiate

            t = instantiate(dict(t))
        if not callable(t):
            raise UserError(f"transforms[{i}] ({t!r}) is not callable; each entry must be a "
                             f"torchvision.transforms.v2 transform or a dict with _target_.")
        steps.append(t)
    steps.append(_ToFloat())
    return v2.Compose(steps)


def header_sizes(paths: Sequence[str | os.PathLike]) -> list[tuple[int, int]]:
    """``(width, height)`` of each image from its header, without decoding it.

    Raises:
        DataError: a file PIL cannot read a header from.
    """
    sizes: list[tuple[int, int]] = []
    for path in paths:
        try:
            with Image.open(path) as img:
                sizes.append(img.size)                                   # (w, h)
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
            raise DataError.make("unreadable_image", path, f"has no readable image header ({e})",
                                 "re-encode it (e.g. as PNG/JPEG) or remove it from the index",
                                 skippable=False) from None
    return sizes


def transformed_pixels(sizes: Sequence[tuple[int, int]],
                       transform: Callable[[Tensor], Tensor] | None) -> list[int]:
    """Pixels (h x w) of each image of ``(width, height)`` as ``transform`` outputs it, without
    decoding any: each distinct size is run through the transform on a blank image once (what
    ``data.batches.max_pixels_per_batch`` budgets; random transforms are seeded, and a pipeline that
    crops to a fixed size gives every image the same count)."""
    pixels: dict[tuple[int, int], int] = {}
    for w, h in set(sizes):
        if transform is None:
            pixels[w, h] = w * h
            continue
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(0)
            out = transform(torch.zeros((3, h, w), dtype=torch.uint8))
        pixels[w, h] = int(out.shape[-2] * out.shape[-1])
    return [pixels[s] for s in sizes]


def build_eval_image_transform(data_cfg: Mapping[str, Any]) -> Callable[[Tensor], Tensor]:
    """The val/test image pipeline of a stored data config (``cfg.data`` as a dict).

    Used by ``mmtf.predict`` to preprocess raw images exactly as evaluation did."""
    return build_transform((data_cfg.get("transforms") or {}).get("eval"))


PREPROCESSOR_FILE = "preprocessor_config.json"
# What each supported image processor does when its config leaves a field out (transformers'
# class attributes); "square": an int ``size`` means height = width (else the shortest edge).
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": {"size": {"height": 224, "width": 224}, "resample": 2,
                          "do_center_crop": False, "image_mean": [0.5, 0.5, 0.5],
                          "image_std": [0.5, 0.5, 0.5], "square": True},
    "CLIPImageProcessor": {"size": {"shortest_edge": 224}, "resample": 3,
                           "do_center_crop": True, "crop_size": {"height": 224, "width": 224},
                           "image_mean": [0.48145466, 0.4578275, 0.40821073],
                           "image_std": [0.26862954, 0.26130258, 0.27577711], "square": False},
}
# PIL resampling codes (the processors' ``resample``) that torchvision has.
RESAMPLING = {0: v2.InterpolationMode.NEAREST, 2: v2.InterpolationMode.BILINEAR,
              3: v2.InterpolationMode.BICUBIC}


def pretrained_image_transform(source: str | os.PathLike | None = None,
                               processor: Mapping[str, Any] | None = None) -> v2.Compose:
    """The preprocessing of a pretrained vision model, as a ``transforms.v2`` pipeline.

    Resize, center crop, rescale and normalise as transformers' ``ViTImageProcessor`` /
    ``CLIPImageProcessor`` (torchvision backend) do, each step where its ``do_*`` flag is on.

    Args:
        source: the model folder (or hub id) holding ``preprocessor_config.json``.
        processor: the settings :func:`read_image_processor` resolved (then no file is read;
            training records them, :func:`record_image_processors`).

    Returns a pipeline (3, h, w) uint8 -> (3, h', w') float32.

    Raises:
        UserError: see :func:`read_image_processor`.
    """
    values = dict(processor) if processor is not None else read_image_processor(source)
    steps: list[Callable] = []
    if values["resize"] is not None:
        resize = values["resize"]
        steps.append(v2.Resize(resize if isinstance(resize, int) else list(resize),
                               interpolation=RESAMPLING[values["resample"]], antialias=True))
    if values["crop"] is not None:
        steps.append(CenterCrop(values["crop"]))
    steps.append(v2.ToDtype(torch.float32, scale=values["rescale"]))
    if values["mean"] is not None:
        steps.append(v2.Normalize(mean=list(values["mean"]), std=list(values["std"])))
    return v2.Compose(steps)


def read_image_processor(source: str | os.PathLike | None) -> dict[str, Any]:
    """The settings of a pretrained vision model's ``preprocessor_config.json``, resolved
    against the processor's defaults.

    Returns:
        Plain values: ``resize`` (int shortest edge, [h, w] or None), ``resample`` (PIL code),
        ``crop`` ([h, w] or None), ``rescale`` (bool), ``mean`` / ``std`` (lists or None).

    Raises:
        UserError: a missing or non-JSON file, or a processor or setting not reproduced here.
    """
    owner = "pretrained_image_transform"
    if source is None:
        raise UserError(f"{owner}: neither source (the model folder holding "
                        f"{PREPROCESSOR_FILE}) nor processor is set; set source.")
    file = require_file(resolve_source(source, owner=owner) / PREPROCESSOR_FILE,
                        what=f"{owner}: {PREPROCESSOR_FILE}",
                        fix="save the image processor beside the model (save_pretrained)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{owner}: {file} is not valid JSON ({err}).") from None
    kind = str(config.get("image_processor_type", "")).removesuffix("Fast")
    if kind not in PROCESSOR_DEFAULTS:
        raise UserError(f"{owner}: {file} has image_processor_type="
                        f"{config.get('image_processor_type')!r}; reproduced are "
                        f"{', '.join(sorted(PROCESSOR_DEFAULTS))} (and their Fast variants); "
                        f"write data.transforms.* by hand for this model.")
    cfg = {**PROCESSOR_DEFAULTS[kind], **config}
    values: dict[str, Any] = {"resize": None, "resample": int(cfg["resample"]), "crop": None}
    if cfg.get("do_resize", True):
        if cfg["resample"] not in RESAMPLING:
            raise UserError(f"{owner}: {file} has resample={cfg['resample']}; reproduced are "
                            f"the PIL codes {sorted(RESAMPLING)} (nearest, bilinear, bicubic).")
        size = cfg["size"]
        if isinstance(size, int):
            size = {"height": size, "width": size} if cfg["square"] else {"shortest_edge": size}
        if set(size) == {"shortest_edge"}:
            values["resize"] = int(size["shortest_edge"])
        elif set(size) == {"height", "width"}:
            values["resize"] = [int(size["height"]), int(size["width"])]
        else:
            raise UserError(f"{owner}: {file} has size={size}; reproduced are {{height, width}} "
                            f"and {{shortest_edge}}.")
    if cfg.get("do_center_crop"):
        crop = cfg["crop_size"]
        values["crop"] = ([int(crop)] * 2 if isinstance(crop, int)
                          else [int(crop["height"]), int(crop["width"])])
    values["rescale"] = bool(cfg.get("do_rescale", True))
    if values["rescale"] and not math.isclose(cfg.get("rescale_factor", 1 / 255), 1 / 255):
        raise UserError(f"{owner}: {file} has rescale_factor={cfg['rescale_factor']}; "
                        f"reproduced is 1/255 (uint8 to 0..1).")
    normalize = cfg.get("do_normalize", True)
    values["mean"] = [float(m) for m in cfg["image_mean"]] if normalize else None
    values["std"] = [float(m) for m in cfg["image_std"]] if normalize else None
    return values


def record_image_processors(data_cfg: MutableMapping[str, Any]) -> None:
    """Store the resolved settings of every ``pretrained_image_transform`` entry of
    ``data_cfg`` (a plain dict, the run's ``data`` config) as its ``processor``, in place, so
    the stored config rebuilds the pipeline without ``preprocessor_config.json``."""
    target = f"{__name__}.{pretrained_image_transform.__name__}"
    for entries in (data_cfg.get("transforms") or {}).values():
        for entry in entries or []:
            if (isinstance(entry, MutableMapping) and entry.get("_target_") == target
                    and entry.get("processor") is None):
                entry["processor"] = read_image_processor(entry.get("source"))


class CenterCrop(torch.nn.Module):
    """Center crop to ``size`` (height, width) with transformers' anchor: top = (h - ch) // 2.
    torchvision's ``CenterCrop`` rounds the half instead, one pixel off whenever h - ch is odd;
    smaller images are zero-padded first, as both do."""

    def __init__(self, size: Sequence[int]) -> None:
        super().__init__()
        self.size = (int(size[0]), int(size[1]))

    def forward(self, image: Tensor) -> Tensor:
        """(c, h, w) -> (c, ch, cw)."""
        ch, cw = self.size
        h, w = image.shape[-2:]
        if ch > h or cw > w:
            dh, dw = max(ch - h, 0), max(cw - w, 0)
            image = v2.functional.pad(image, [dw // 2, dh // 2, (dw + 1) // 2, (dh + 1) // 2])
            h, w = image.shape[-2:]
        return v2.functional.crop(image, (h - ch) // 2, (w - cw) // 2, ch, cw)


class _ToFloat(torch.nn.Module):
    """uint8 -> float32 in 0..1; float input passes through as float32."""

    def forward(self, x: Tensor) -> Tensor:
        if x.is_floating_point():
            return x.float()
        return v2.functional.to_dtype(x, torch.float32, scale=True)
