"""What both encoders share: masked pooling, freezing, pretrained loading, gradients to every
parameter."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file
from torch import nn

from mmtf.encoders import AudioEncoder, Encoder, EncoderOutput, VisionEncoder, pool
from mmtf.errors import UserError
from tests.unit.presets import flat

from .conftest import TINY_AUDIO, TINY_VISION


def make(kind: str, **override) -> Encoder:
    if kind == "audio":
        return flat(AudioEncoder, **{**TINY_AUDIO, **override})
    return flat(VisionEncoder, **{**TINY_VISION, **override})


def example(kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    if kind == "audio":
        return 0.1 * torch.randn(3, 8000), torch.tensor([8000, 5000, 1234])
    return torch.randn(3, 3, 32, 32), None


def test_masked_mean_pool_against_a_loop():
    memory = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    memory[~mask] = 1e6                                      # padding must not count
    expected = torch.stack([memory[i, :n].mean(dim=0) for i, n in enumerate([3, 5, 1])])
    torch.testing.assert_close(pool(memory, mask, "mean"), expected)
    torch.testing.assert_close(pool(memory, mask, "cls"), memory[:, 0])
    with pytest.raises(UserError, match=r"mode \('max'\) must be one of mean, cls, last"):
        pool(memory, mask, "max")
    with pytest.raises(ValueError, match=r"mask must be bool of shape \(3, 5\)"):
        pool(memory, mask.float())


def test_audio_pool_and_output_type():
    enc = make("audio").eval()
    out = enc(*example("audio"))
    assert isinstance(out, EncoderOutput)
    memory, mask = out                                       # unpacks like a tuple
    n = mask.sum(dim=1)
    expected = torch.stack([memory[i, :k].mean(dim=0) for i, k in enumerate(n.tolist())])
    torch.testing.assert_close(enc.pool(out), expected)
    with pytest.raises(UserError, match=r"AudioEncoder has no CLS token"):
        enc.pool(out, "cls")


@pytest.mark.parametrize("kind", ["audio", "vision"])
def test_every_parameter_gets_a_gradient(kind):
    enc = make(kind, dropout=0.1, attn_dropout=0.1).train()   # SpecAugment and dropout active
    inputs, lengths = example(kind)
    out = enc(inputs, lengths)
    # A random projection, not .sum(): the final LayerNorm's outputs sum to a constant.
    (out.memory * torch.randn_like(out.memory)).sum().backward()
    params = dict(enc.named_parameters())
    assert params
    for name, p in params.items():
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("kind", ["audio", "vision"])
def test_frozen_encoder_has_no_trainable_params_and_stays_in_eval(kind):
    enc = make(kind, dropout=0.3, freeze=True)
    assert enc.frozen and not any(p.requires_grad for p in enc.parameters())
    parent = nn.ModuleDict({"encoder": enc, "head": nn.Linear(32, 2)})
    parent.train()                                           # what Lightning does every epoch
    assert parent.training and parent["head"].training
    assert not any(m.training for m in enc.modules())
    inputs, lengths = example(kind)
    # No dropout, no SpecAugment: the output of a twin built without them, in eval mode.
    twin = make(kind, dropout=0.0, freq_masks=0, time_masks=0) if kind == "audio" else make(
        kind, dropout=0.0)
    twin.load_state_dict(enc.state_dict())
    first = enc(inputs, lengths).memory
    torch.testing.assert_close(first, twin.eval()(inputs, lengths).memory)
    assert not first.requires_grad
    enc.unfreeze()
    assert not enc.frozen and all(p.requires_grad for p in enc.parameters()) and enc.training
    parent.eval()
    parent.train()
    assert all(m.training for m in enc.modules())


def _export(enc: Encoder, folder, config: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(enc.state_dict(), str(folder / "weights.safetensors"))
    if config is not None:
        OmegaConf.save(OmegaConf.create(config), folder / "config.yaml")


@pytest.mark.parametrize("kind", ["audio", "vision"])
def test_load_pretrained_round_trip(kind, tmp_path):
    src = make(kind).eval()
    _export(src, tmp_path / "enc")
    fresh = make(kind).eval()                                # different random init
    inputs, lengths = example(kind)
    assert not torch.allclose(fresh(inputs, lengths).memory, src(inputs, lengths).memory)
    loaded = make(kind, pretrained=str(tmp_path / "enc")).eval()
    assert torch.equal(loaded(inputs, lengths).memory, src(inputs, lengths).memory)
    frozen = make(kind, pretrained=tmp_path / "enc" / "weights.safetensors", freeze=True)
    assert frozen.frozen and torch.equal(frozen(inputs, lengths).memory,
                                         src(inputs, lengths).memory)


def test_load_pretrained_carries_learned_batchnorm_statistics(tmp_path):
    conv = dict(TINY_VISION, stem="conv", stem_convs=2, stem_norm="batch")
    src = flat(VisionEncoder, **conv)
    src(torch.randn(4, 3, 32, 32) * 3 + 1)                  # train mode: running stats move
    bn = next(m for m in src.modules() if isinstance(m, nn.BatchNorm2d))
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
    src.eval()
    _export(src, tmp_path / "enc", {"_target_": "mmtf.encoders.VisionEncoder", **src.config})
    loaded = flat(VisionEncoder, **conv, pretrained=tmp_path / "enc").eval()
    images = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded(images).memory, src(images).memory)


def test_load_pretrained_shape_mismatch_names_tensor_shapes_and_config(tmp_path):
    src = make("audio")
    _export(src, tmp_path / "enc", {"_target_": "mmtf.encoders.AudioEncoder", **src.config})
    with pytest.raises(UserError) as err:
        make("audio", dim=64, pretrained=tmp_path / "enc")
    message = str(err.value)
    assert "AudioEncoder.load_pretrained: tensor 'stack.blocks.0." in message
    assert "has shape (32," in message and "but (64," in message
    assert "weights.safetensors" in message
    assert "config.yaml: dim=32" in message and "this model was built with dim=64" in message


def test_load_pretrained_rejects_a_different_front_end(tmp_path):
    src = make("audio")
    _export(src, tmp_path / "enc", {"_target_": "mmtf.encoders.AudioEncoder", **src.config})
    # Same shapes, different filterbank values: must not be overridden silently.
    with pytest.raises(UserError, match=r"buffer 'frontend\.mel\.mel_scale\.fb' \(computed from "
                                        r"the config\) differs.*config\.yaml: f_min=0\.0\); "
                                        r"this model was built with f_min=100\.0"):
        make("audio", f_min=100.0, pretrained=tmp_path / "enc")
    with pytest.raises(UserError, match=r"buffer 'frontend\.feature_std'"):
        make("audio", feature_std=2.0, pretrained=tmp_path / "enc")


def test_load_pretrained_rejects_same_shapes_but_a_different_config(tmp_path):
    src = make("audio")
    _export(src, tmp_path / "enc", {"_target_": "mmtf.encoders.AudioEncoder", **src.config})
    # hop_length changes no tensor shape, only what every memory position means.
    with pytest.raises(UserError, match=r"config hop_length=320 but the export has "
                                        r"hop_length=160.*config\.yaml: hop_length=160"):
        make("audio", hop_length=320, pretrained=tmp_path / "enc")
    # Regularisation may differ downstream.
    loaded = make("audio", dropout=0.2, time_masks=0, pretrained=tmp_path / "enc").eval()
    wave, lengths = example("audio")
    assert torch.equal(loaded(wave, lengths).memory, src.eval()(wave, lengths).memory)


def test_load_pretrained_missing_and_unexpected_keys(tmp_path):
    src = make("vision")
    weights = src.state_dict()
    weights.pop("cls_token")
    weights["extra.weight"] = torch.zeros(2)
    tmp_path.mkdir(exist_ok=True)
    save_file(weights, str(tmp_path / "weights.safetensors"))
    with pytest.raises(UserError, match=r"1 tensor\(s\) of this model are missing from .*"
                                        r"'cls_token'.*1 tensor\(s\) in .* are not in this "
                                        r"model: 'extra\.weight'"):
        make("vision").load_pretrained(tmp_path)


def test_load_pretrained_missing_paths(tmp_path):
    with pytest.raises(UserError, match=r"weights file .*nowhere/weights\.safetensors does not "
                                        r"exist; set model\.encoder\.pretrained"):
        make("audio").load_pretrained(tmp_path / "nowhere")
    with pytest.raises(UserError, match=r"weights file .*weights\.safetensors does not exist"):
        make("audio", pretrained=str(tmp_path))
    with pytest.raises(UserError, match=r"weights file .*w\.safetensors is a directory"):
        (tmp_path / "w.safetensors").mkdir()
        make("audio").load_pretrained(tmp_path / "w.safetensors")
