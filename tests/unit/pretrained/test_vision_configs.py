"""conf/model/encoder/{vit,clip_vision}.yaml name their builders, hold exactly the builders'
arguments (no key a builder does not read), and build a ViT-B-sized encoder (meta device)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf

from mmtf.encoders import VisionEncoder

CONF = Path(__file__).resolve().parents[3] / "conf" / "model" / "encoder"


@pytest.mark.parametrize("name,target", [("vit", "mmtf.pretrained.vit.vit_encoder"),
                                         ("clip_vision",
                                          "mmtf.pretrained.clip.clip_vision_encoder")])
def test_the_yaml_holds_the_builders_arguments_and_builds(name, target):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    assert cfg._target_ == target and cfg.pretrained is None
    assert set(cfg) - {"_target_"} == set(inspect.signature(get_method(target)).parameters)
    with torch.device("meta"):
        encoder = instantiate(cfg)
    assert isinstance(encoder, VisionEncoder) and encoder.dim == 768
    assert encoder.cls_token is not None and encoder.config["stem"] == "patch"
