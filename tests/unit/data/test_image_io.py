"""Image decoding: every PIL mode to RGB with hand-computed values; bad files; transforms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from mmtf.data import DataError, build_eval_image_transform, build_transform, load_image


def _save(img: Image.Image, path):
    img.save(path)
    return path


def _pixel(t: torch.Tensor) -> tuple[int, int, int]:
    return tuple(int(v) for v in t[:, 0, 0])


@pytest.mark.parametrize("mode,value,expected", [
    ("L", 100, (100, 100, 100)),
    ("LA", (100, 7), (100, 100, 100)),            # alpha dropped, as ImageFolder does
    ("RGBA", (10, 20, 30, 0), (10, 20, 30)),
    ("RGB", (1, 2, 3), (1, 2, 3)),
])
def test_modes_to_rgb(tmp_path, mode, value, expected):
    path = _save(Image.new(mode, (5, 4), value), tmp_path / "x.png")
    out = load_image(path)
    assert out.dtype == torch.uint8 and out.shape == (3, 4, 5)
    assert _pixel(out) == expected


def test_palette_image_uses_its_palette(tmp_path):
    img = Image.new("P", (4, 4), 1)
    img.putpalette([0, 0, 0, 200, 100, 50] + [0] * (256 * 3 - 6))
    assert _pixel(load_image(_save(img, tmp_path / "p.png"))) == (200, 100, 50)
    img.info["transparency"] = 0
    assert _pixel(load_image(_save(img, tmp_path / "pt.png"))) == (200, 100, 50)


def test_cmyk_jpeg(tmp_path):
    # PIL's CMYK -> RGB: R = 255 - C - K (clipped), ...: C=255 gives (0, 255, 255).
    path = _save(Image.new("CMYK", (8, 8), (255, 0, 0, 0)), tmp_path / "c.tiff")
    assert _pixel(load_image(path)) == (0, 255, 255)


def test_16_bit_grayscale_is_scaled_not_clipped(tmp_path):
    arr = np.array([[65535, 257 * 100], [0, 257]], dtype=np.uint16)
    path = _save(Image.fromarray(arr), tmp_path / "g16.png")
    out = load_image(path)
    assert out[0].tolist() == [[255, 100], [0, 1]]
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])


def test_float_image(tmp_path):
    arr = np.array([[0.0, 0.5], [1.0, 0.25]], dtype=np.float32)
    path = _save(Image.fromarray(arr), tmp_path / "f.tiff")
    assert load_image(path)[0].tolist() == [[0, 128], [255, 64]]


def test_missing_empty_and_garbage(tmp_path):
    with pytest.raises(DataError, match=r"no\.png \(ann\.json images\[3\]\): file not found"):
        load_image(tmp_path / "no.png", where="ann.json images[3]")
    (tmp_path / "e.png").write_bytes(b"")
    with pytest.raises(DataError, match="empty") as e:
        load_image(tmp_path / "e.png")
    assert e.value.reason == "empty_file"
    (tmp_path / "g.jpg").write_bytes(np.random.default_rng(0).bytes(3000))
    with pytest.raises(DataError, match=r"g\.jpg: cannot be decoded as an image") as e:
        load_image(tmp_path / "g.jpg")
    assert e.value.reason == "unreadable_image"


def test_truncated_image_fails_at_load(tmp_path):
    rng = np.random.default_rng(0)
    path = _save(Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)),
                 tmp_path / "t.png")
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(DataError, match=r"t\.png: cannot be decoded") as e:
        load_image(path)
    assert e.value.reason == "unreadable_image"


def test_transform_pipeline_from_config_dicts():
    cfg = [{"_target_": "torchvision.transforms.v2.Resize", "size": [4, 4], "antialias": True},
           v2.ToDtype(torch.float32, scale=True),
           {"_target_": "torchvision.transforms.v2.Normalize", "mean": [0.5] * 3,
            "std": [0.5] * 3}]
    out = build_transform(cfg)(torch.full((3, 8, 8), 255, dtype=torch.uint8))
    assert out.dtype == torch.float32 and out.shape == (3, 4, 4)
    torch.testing.assert_close(out, torch.ones(3, 4, 4))  # (1 - 0.5) / 0.5


def test_pipeline_always_ends_in_float():
    out = build_transform(None)(torch.full((3, 2, 2), 51, dtype=torch.uint8))
    torch.testing.assert_close(out, torch.full((3, 2, 2), 0.2))
    out = build_eval_image_transform({"transforms": {"eval": [v2.CenterCrop(1)]}})(
        torch.full((3, 2, 2), 255, dtype=torch.uint8))
    assert out.dtype == torch.float32 and out.shape == (3, 1, 1) and float(out.max()) == 1.0


def test_non_callable_transform_is_rejected():
    with pytest.raises(ValueError, match=r"transforms\[1\] \(3\) is not callable"):
        build_transform([v2.CenterCrop(1), 3])


def test_decoded_image_cache_decodes_once_and_changes_no_pixel(tmp_path, monkeypatch):
    from mmtf.data import datasets
    from mmtf.data.formats.base import LabelItem

    rng = np.random.default_rng(0)
    items = []
    for i in range(3):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
        items.append(LabelItem(id=str(i), path=path, label=i, where=f"line {i}"))
    decoded = []
    real = datasets.load_image
    monkeypatch.setattr(datasets, "load_image", lambda p, **kw: decoded.append(p) or real(p, **kw))
    augment = [v2.RandomCrop(12, padding=2), v2.ColorJitter(brightness=0.5)]
    plain = datasets.LabelDataset(items, modality="image", transform=build_transform(augment))
    cached = datasets.LabelDataset(items, modality="image", transform=build_transform(augment),
                                   cache_bytes=2 * 3 * 16 * 16)     # room for two images
    keys = [(i, 0, epoch) for epoch in range(3) for i in range(3)]
    got = [cached[key]["image"] for key in keys]
    # Three decodes in the first epoch, then only the image that did not fit.
    assert [p.name for p in decoded] == ["0.png", "1.png", "2.png", "2.png", "2.png"]
    for key, image in zip(keys, got):       # the same augmented pixels as decoding each time
        torch.testing.assert_close(image, plain[key]["image"], rtol=0, atol=0)
    # Without a transform the caller gets a copy: changing it leaves the cache as decoded.
    raw = datasets.LabelDataset(items, modality="image", cache_bytes=10 ** 6)
    first = raw[0]["image"]
    first.zero_()
    assert torch.equal(raw[0]["image"], load_image(items[0].path))
