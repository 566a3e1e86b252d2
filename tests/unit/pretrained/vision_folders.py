"""Small random-weight ViT and CLIP vision towers saved with ``save_pretrained``, and the sizes
of their builders (``vit_encoder``, ``clip_vision_encoder``) that match them (2 layers, width 64,
4 heads, 32x32 images)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            image_size=32, patch_size=8)
SIZES = dict(dim=64, depth=2, num_heads=4, mlp_ratio=2.0, patch_size=8, image_size=32)
VIT_ENCODER = dict(**SIZES, mlp="gelu", norm_eps=1e-12, bias=True)
CLIP_ENCODER = dict(**SIZES, mlp="quick_gelu", norm_eps=1e-5)


def perturb(model: nn.Module) -> nn.Module:
    """Move every parameter off its initial value (unit norms, zero biases), so a tensor mapped
    to the wrong place changes the output."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def save_vit(path: Path, **overrides) -> nn.Module:
    """A ``ViTModel`` (random weights) saved in ``path``; returned in eval mode."""
    from transformers import ViTConfig, ViTModel

    model = perturb(ViTModel(ViTConfig(**{**TINY, **overrides})).eval())
    model.save_pretrained(path)
    return model


def save_clip_vision(path: Path, **overrides) -> nn.Module:
    """A ``CLIPVisionModel`` (random weights) saved in ``path``; returned in eval mode."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    model = perturb(CLIPVisionModel(CLIPVisionConfig(**{**TINY, **overrides})).eval())
    model.save_pretrained(path)
    return model


def assert_same_hidden_states(reference: nn.Module, encoder: nn.Module,
                              size: tuple[int, int]) -> None:
    """``encoder``'s memory equals ``reference``'s ``last_hidden_state`` (float32, <= 1e-4) on
    two random images of ``size``; sizes other than 32x32 interpolate the position table."""
    images = torch.randn(2, 3, *size)
    with torch.no_grad():
        expected = reference(pixel_values=images,
                             interpolate_pos_encoding=size != (32, 32)).last_hidden_state
        got = encoder(images).memory
    assert got.shape == expected.shape == (2, 1 + size[0] // 8 * size[1] // 8, 64)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
