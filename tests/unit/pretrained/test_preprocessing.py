"""The data transforms built from preprocessor_config.json give the pixels transformers'
ViTImageProcessor and CLIPImageProcessor give (same resize, crop anchor, rescale, normalise)."""

from __future__ import annotations

import json

import pytest
import torch

from mmtf.data.image import build_transform, pretrained_image_transform, read_image_processor
from mmtf.errors import UserError

transformers = pytest.importorskip("transformers")

SIZES = [(37, 53), (64, 41), (20, 15), (25, 25)]


def _compare(processor, folder):
    processor.save_pretrained(folder)
    # As the data config lists it: one entry of data.transforms.eval.
    entry = {"_target_": "mmtf.data.image.pretrained_image_transform", "source": str(folder)}
    ours = build_transform([entry])
    # The settings a run stores (plain JSON values) rebuild it without the folder's file.
    stored = json.loads(json.dumps(read_image_processor(folder)))
    (folder / "preprocessor_config.json").unlink()
    alone = build_transform([{**entry, "processor": stored}])
    for h, w in SIZES:
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8)
        expected = processor(images=[image], return_tensors="pt").pixel_values[0]
        for got in (ours(image), alone(image)):
            assert got.dtype == torch.float32 and got.shape == expected.shape
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_vit_processor(tmp_path):
    _compare(transformers.ViTImageProcessor(size={"height": 24, "width": 32}), tmp_path)


def test_clip_processor_with_an_odd_crop_margin(tmp_path):
    # shortest edge 28, crop 25: margins are odd, where torchvision's CenterCrop rounds the
    # anchor up and transformers' floors it.
    _compare(transformers.CLIPImageProcessor(size={"shortest_edge": 28},
                                             crop_size={"height": 25, "width": 25}), tmp_path)


def test_unknown_processors_and_missing_files_are_refused(tmp_path):
    with pytest.raises(UserError, match=r"preprocessor_config\.json"):
        pretrained_image_transform(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "DetrImageProcessor"}))
    with pytest.raises(UserError, match=r"image_processor_type='DetrImageProcessor'"):
        pretrained_image_transform(tmp_path)
