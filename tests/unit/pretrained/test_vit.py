"""Hugging Face ViT weights in mmtf's VisionEncoder (``vit_encoder``): the same last_hidden_state as ``ViTModel``
(float32, <= 1e-4) at the trained size and at other sizes (HF's interpolate_pos_encoding), and
the one-line refusals."""

from __future__ import annotations

import pytest
import torch

from mmtf.errors import UserError
from mmtf.pretrained.clip import clip_vision_encoder
from mmtf.pretrained.vit import vit_encoder

from .vision_folders import (
    CLIP_ENCODER,
    VIT_ENCODER,
    assert_same_hidden_states,
    save_clip_vision,
    save_vit,
)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("size", [(32, 32), (48, 48), (48, 40), (16, 24)])
def test_vit_matches_transformers(tmp_path, size):
    reference = save_vit(tmp_path / "vit")
    encoder = vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "vit").eval()
    assert_same_hidden_states(reference, encoder, size)


def test_vit_without_qkv_bias_and_from_a_classifier_folder(tmp_path):
    # ViTForImageClassification stores the tower under "vit."; qkv_bias=False leaves only the
    # output projection biased.
    from transformers import ViTConfig, ViTForImageClassification

    from .vision_folders import TINY, perturb

    classifier = perturb(ViTForImageClassification(ViTConfig(**TINY, qkv_bias=False,
                                                             num_labels=3)).eval())
    classifier.save_pretrained(tmp_path / "cls")
    encoder = vit_encoder(**{**VIT_ENCODER, "bias": "o"}, pretrained=tmp_path / "cls").eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = classifier.vit(pixel_values=images).last_hidden_state
        torch.testing.assert_close(encoder(images).memory, expected, atol=1e-4, rtol=0)


def test_sizes_that_disagree_with_config_json_are_named_with_the_fix(tmp_path):
    save_vit(tmp_path / "vit")
    with pytest.raises(UserError, match=r"model\.encoder does not match .*vit/config\.json: "
                                        r"dim=32, but it has hidden_size=64 \(dim=64\); depth=1, "
                                        r"but it has num_hidden_layers=2 \(depth=2\); set "
                                        r"model\.encoder\.dim=64 model\.encoder\.depth=2"):
        vit_encoder(**{**VIT_ENCODER, "dim": 32, "depth": 1}, pretrained=tmp_path / "vit")


def test_a_clip_folder_under_the_vit_settings_names_model_type(tmp_path):
    save_clip_vision(tmp_path / "clip")
    with pytest.raises(UserError, match=r"model_type='clip_vision_model', but this loader reads "
                                        r"'vit'; use model/encoder=clip_vision"):
        vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "clip")
    # ... and the CLIP builder reads it.
    clip_vision_encoder(**CLIP_ENCODER, pretrained=tmp_path / "clip")


def test_missing_weights_and_other_architectures_are_refused(tmp_path):
    save_vit(tmp_path / "vit")
    (tmp_path / "vit" / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"vit/model\.safetensors not found"):
        vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "vit")
    from transformers import GPT2Config, GPT2Model

    GPT2Model(GPT2Config(n_embd=64, n_layer=1, n_head=4)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UserError, match=r"model_type='gpt2', but this loader reads"):
        vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "gpt2")


def test_a_refused_folder_leaves_the_encoder_untouched(tmp_path):
    # Delete one tensor: the check fails after the config matched, and nothing was copied.
    from safetensors.torch import load_file, save_file

    save_vit(tmp_path / "vit")
    weights = load_file(str(tmp_path / "vit" / "model.safetensors"))
    del weights["encoder.layer.1.output.dense.bias"]
    save_file(weights, str(tmp_path / "vit" / "model.safetensors"), metadata={"format": "pt"})
    from mmtf.pretrained.vision import load_vision

    encoder = vit_encoder(**VIT_ENCODER)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    with pytest.raises(UserError, match=r"'encoder\.layer\.1\.output\.dense\.bias' not found"):
        load_vision(encoder, "vit", tmp_path / "vit")
    assert all(torch.equal(before[k], v) for k, v in encoder.state_dict().items())


def test_an_mmtf_export_still_loads(tmp_path):
    from safetensors.torch import save_file

    source = vit_encoder(**VIT_ENCODER)
    (tmp_path / "export").mkdir()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()},
              str(tmp_path / "export" / "weights.safetensors"))
    loaded = vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "export")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in source.state_dict().items())


def test_an_export_with_its_config_loads_back_through_load_exported(tmp_path):
    # What python -m mmtf.export part=encoder writes for a vit_encoder part: its builder
    # arguments (image_size as the YAML spells it) beside the weights, compared on load.
    from mmtf.export import load_exported
    from mmtf.hub import write_export

    source = vit_encoder(**VIT_ENCODER)
    config = {"_target_": "mmtf.pretrained.vit.vit_encoder", **VIT_ENCODER, "pretrained": None,
              "freeze": False}
    write_export(tmp_path / "export", source.state_dict(), config)
    loaded = load_exported(tmp_path / "export", freeze=True)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in source.state_dict().items())
    assert loaded.frozen
    write_export(tmp_path / "other", source.state_dict(), {**config, "patch_size": 4})
    with pytest.raises(UserError, match=r"config patch_size=8 but the export has patch_size=4"):
        vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "other")


def test_a_null_size_without_a_folder_to_read_it_from_is_refused():
    with pytest.raises(UserError, match=r"model\.encoder \(vit_encoder\): model\.encoder\.depth is "
                                        r"null.*model\.encoder\.pretrained \(None\) is no Hugging "
                                        r"Face folder"):
        vit_encoder(pretrained=None, depth=None)
