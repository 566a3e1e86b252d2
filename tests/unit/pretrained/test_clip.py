"""CLIP's vision tower in mmtf's VisionEncoder: the same last_hidden_state as
``CLIPVisionModel`` (float32, <= 1e-4; pre-layernorm, quick-GELU, no final norm on the
sequence), read from a CLIPVisionModel folder or a whole CLIPModel folder."""

from __future__ import annotations

import pytest
import torch

from mmtf.errors import UserError
from mmtf.pretrained.clip import clip_vision_encoder

from .vision_folders import (
    CLIP_ENCODER,
    TINY,
    assert_same_hidden_states,
    perturb,
    save_clip_vision,
)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("size", [(32, 32), (48, 48), (40, 24)])
def test_clip_vision_matches_transformers(tmp_path, size):
    reference = save_clip_vision(tmp_path / "clip")
    encoder = clip_vision_encoder(**CLIP_ENCODER, pretrained=tmp_path / "clip").eval()
    assert_same_hidden_states(reference, encoder, size)


def test_the_tower_of_a_whole_clip_model_folder(tmp_path):
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(text_config=dict(hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=4, intermediate_size=64,
                                         vocab_size=99),
                        vision_config=dict(TINY), projection_dim=16)
    model = perturb(CLIPModel(config).eval())
    model.save_pretrained(tmp_path / "clip")
    encoder = clip_vision_encoder(**CLIP_ENCODER, pretrained=tmp_path / "clip").eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model.vision_model(pixel_values=images).last_hidden_state
        torch.testing.assert_close(encoder(images).memory, expected, atol=1e-4, rtol=0)
    # A size that disagrees names the nested field.
    with pytest.raises(UserError, match=r"num_heads=8, but it has vision_config\."
                                        r"num_attention_heads=4 \(num_heads=4\)"):
        clip_vision_encoder(**{**CLIP_ENCODER, "num_heads": 8}, pretrained=tmp_path / "clip")
