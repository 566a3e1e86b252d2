"""Image decoding and transform pipelines shared by every mmtf image dataset.

Images are decoded with PIL and converted to RGB whatever their mode: ``L``/``LA``/``P``/``RGBA``/
``CMYK`` by PIL's own conversion (alpha is dropped, as torchvision's ``ImageFolder`` and the COCO
loaders do), 16-bit and 32-bit integer (``I;16``, ``I``) by scaling 0..65535 to 0..255, float
(``F``) by clipping 0..1 (or 0..255 when values exceed 1) — PIL's direct ``convert("RGB")``
would clip 16-bit images to white. Transforms are torchvision ``transforms.v2`` pipelines given
as lists (Hydra instantiates each entry); the output is always float32.

Shapes: (3, h, w) per image; uint8 after decoding, float32 after the pipeline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torchvision.transforms import v2

from mmtf.data.errors import DataError, check_media_file
from mmtf.errors import UserError

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


def load_image(path: str | os.PathLike, *, where: str | None = None) -> Tensor:
    """Decode one image file to an RGB uint8 tensor.

    Args:
        path: any format PIL reads (JPEG, PNG, BMP, TIFF, WebP, ...).
        where: the index entry that points to the file, for error messages.

    Returns:
        The image, (3, h, w) uint8.

    Raises:
        DataError: the file is missing, empty or cannot be decoded (also truncated files).
    """
    path = Path(path)
    check_media_file(path, where)
    try:
        with Image.open(path) as img:
            img.load()  # decode now: a truncated file fails here, not in the transform
            rgb = to_rgb(img)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise DataError.make("unreadable_image", path, f"cannot be decoded as an image ({e})",
                             "re-encode it (e.g. as PNG/JPEG) or remove it from the index",
                             where) from None
    return v2.functional.pil_to_tensor(rgb)  # (3, h, w) uint8


def build_transform(transforms: Sequence[Any] | None) -> Callable[[Tensor], Tensor]:
    """Compose a list of ``transforms.v2`` objects (or Hydra ``_target_`` dicts) into one.

    The composed pipeline always returns float32: if the list leaves the image as uint8, it is
    scaled to 0..1 at the end (``ToDtype(float32, scale=True)``).

    Args:
        transforms: the list from config (``data.train_transforms`` / ``eval_transforms``), or
            None for "only convert to float".

    Returns:
        A callable (3, h, w) uint8 -> (3, h', w') float32.
    """
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


def build_eval_image_transform(data_cfg: Mapping[str, Any]) -> Callable[[Tensor], Tensor]:
    """The val/test image pipeline of a stored data config (``cfg.data`` as a dict).

    Used by ``mmtf.predict`` to preprocess raw images exactly as evaluation did.
    """
    return build_transform(data_cfg.get("eval_transforms"))


class _ToFloat(torch.nn.Module):
    """uint8 -> float32 in 0..1; float input passes through as float32."""

    def forward(self, x: Tensor) -> Tensor:
        if x.is_floating_point():
            return x.float()
        return v2.functional.to_dtype(x, torch.float32, scale=True)
