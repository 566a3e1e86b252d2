"""VisionEncoder: shapes, patch-size errors, other image sizes through the interpolated position
table, and CLS pooling."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmtf.encoders import VisionEncoder, pool
from mmtf.encoders.vision import sincos_2d
from mmtf.errors import UserError
from tests.unit.presets import flat

from .conftest import TINY_VISION


@pytest.mark.parametrize("cls_token, tokens", [(True, 17), (False, 16)])
def test_shapes_and_mask(cls_token, tokens):
    enc = flat(VisionEncoder, **TINY_VISION, cls_token=cls_token)
    out = enc(torch.randn(2, 3, 32, 32), lengths=torch.tensor([5, 7]))   # lengths are ignored
    assert out.memory.shape == (2, tokens, 32) and enc.dim == 32
    assert out.mask.dtype == torch.bool and out.mask.shape == (2, tokens) and out.mask.all()
    assert enc.has_cls is cls_token and enc.num_prefix_tokens == int(cls_token)


def test_patches_are_the_conv_of_each_block():
    # Patch i (row-major) must hold exactly pixels [r*8:(r+1)*8, c*8:(c+1)*8]: compare to a
    # hand-written dot product with the conv weight.
    enc = flat(VisionEncoder, **{**TINY_VISION, "image_size": (16, 24)}, cls_token=False)
    images = torch.randn(1, 3, 16, 24)
    seen = {}
    enc.stack.register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0]))
    enc(images)
    w, b = enc.patch_embed.weight, enc.patch_embed.bias               # (c, 3, 8, 8), (c,)
    for r in range(2):
        for c in range(3):
            block = images[0, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8]
            expected = (w * block).sum(dim=(1, 2, 3)) + b + enc.pos_embed[0, r * 3 + c]
            torch.testing.assert_close(seen["x"][0, r * 3 + c], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("size", [(30, 32), (32, 36), (4, 8)])
def test_image_size_not_a_multiple_of_patch_raises(size):
    with pytest.raises(UserError, match=rf"image size \({size[0]}, {size[1]}\) must be divisible "
                                        r"by patch_size \(8\); resize or pad"):
        flat(VisionEncoder, **TINY_VISION)(torch.randn(1, 3, *size))


def test_bad_inputs_and_config_raise():
    enc = flat(VisionEncoder, **TINY_VISION)
    with pytest.raises(ValueError, match=r"inputs must be \(batch, 3, H, W\), got \(1, 1, 32, 32\)"):
        enc(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r"must be float images, got torch\.uint8"):
        enc(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(UserError, match=r"image_size \(36, 36\) must be a positive multiple of "
                                        r"patch_size \(8\)"):
        flat(VisionEncoder, **{**TINY_VISION, "image_size": 36})
    with pytest.raises(UserError, match=r"^model\.encoder: Attention: dim \(30\) must be divisible by num_heads \(4\)"):
        flat(VisionEncoder, **{**TINY_VISION, "dim": 30})
    with pytest.raises(UserError, match=r"image_size \(\[32, 32, 3\]\) must be an int or"):
        flat(VisionEncoder, **{**TINY_VISION, "image_size": [32, 32, 3]})


@pytest.mark.parametrize("size", [(48, 64), (16, 16), (32, 40)])
def test_other_image_sizes_use_interpolated_positions(size):
    enc = flat(VisionEncoder, **TINY_VISION).eval()
    out = enc(torch.randn(2, 3, *size))
    gh, gw = size[0] // 8, size[1] // 8
    assert out.memory.shape == (2, 1 + gh * gw, 32) and torch.isfinite(out.memory).all()
    assert enc.position_table(gh, gw).shape == (1, gh * gw, 32)


def test_position_table_resampling():
    enc = flat(VisionEncoder, **TINY_VISION)                       # 4 x 4 grid
    assert enc.position_table(4, 4) is enc.pos_embed         # native grid: the table itself
    with torch.no_grad():
        # value = row index in channel 0, constant 3 in channel 1
        rows = torch.arange(4.0).repeat_interleave(4)
        enc.pos_embed.zero_()
        enc.pos_embed[0, :, 0] = rows
        enc.pos_embed[0, :, 1] = 3.0
    for gh, gw in [(8, 8), (6, 2), (2, 5)]:
        table = enc.position_table(gh, gw)[0].detach().reshape(gh, gw, 32)
        torch.testing.assert_close(table[..., 1], torch.full((gh, gw), 3.0))   # weights sum to 1
        ramp = table[..., 0]
        torch.testing.assert_close(ramp, ramp[:, :1].expand(gh, gw))          # constant per row
        assert (ramp[1:, 0] >= ramp[:-1, 0] - 1e-6).all()                     # still increasing
        assert abs(ramp.mean().item() - 1.5) < 0.1
    # The table is used: changing it changes the output.
    images = torch.randn(1, 3, 48, 48)
    before = enc(images).memory
    with torch.no_grad():
        enc.pos_embed.add_(1.0)
    assert not torch.allclose(before, enc(images).memory)


def test_sincos_positions_match_a_float64_loop_and_fit_any_grid():
    dim = 32
    for gh, gw in [(4, 4), (3, 7)]:
        table = sincos_2d(gh, gw, dim)
        assert table.shape == (gh * gw, dim) and table.dtype == torch.float32
        for index in range(gh * gw):
            row, col = divmod(index, gw)                        # row-major, like the patches
            for k in range(dim // 4):
                w = 10000.0 ** (-k / (dim // 4))
                expected = [math.sin(row * w), math.cos(row * w), math.sin(col * w),
                            math.cos(col * w)]
                got = [table[index, j * dim // 4 + k].item() for j in range(4)]
                assert got == pytest.approx(expected, abs=1e-6)
    enc = flat(VisionEncoder, **TINY_VISION, pos_embed="sincos").eval()
    assert enc.pos_embed is None and not any("pos" in k for k in enc.state_dict())
    for h, w in [(32, 32), (48, 24)]:
        out = enc(torch.randn(2, 3, h, w))
        table = enc.position_table(h // 8, w // 8)
        torch.testing.assert_close(table[0], sincos_2d(h // 8, w // 8, 32))
        assert out.memory.shape == (2, 1 + (h // 8) * (w // 8), 32)
    # Patches moved to another place give other tokens: the position reaches the memory.
    images = torch.zeros(1, 3, 32, 32)
    memory = enc(images).memory[0, 1:]
    assert (memory[0] - memory[5]).abs().max() > 1e-3
    with pytest.raises(UserError, match=r"pos_embed 'sincos' splits dim \(42\) into 4"):
        flat(VisionEncoder, dim=42, depth=1, num_heads=6, patch_size=8, image_size=32,
                      pos_embed="sincos")
    with pytest.raises(UserError, match=r"pos_embed \('rope'\) must be 'learned'"):
        flat(VisionEncoder, **TINY_VISION, pos_embed="rope")


def test_cls_and_mean_pooling():
    enc = flat(VisionEncoder, **TINY_VISION)
    out = enc(torch.randn(3, 3, 32, 32))
    torch.testing.assert_close(pool(out.memory, out.mask, "cls", encoder=enc), out.memory[:, 0])
    torch.testing.assert_close(enc.pool(out, "cls"), out.memory[:, 0])
    # mean leaves out the CLS token when the encoder is known (timm's avg pool), not otherwise
    torch.testing.assert_close(enc.pool(out, "mean"), out.memory[:, 1:].mean(dim=1))
    torch.testing.assert_close(pool(out.memory, out.mask), out.memory.mean(dim=1))
    plain = flat(VisionEncoder, **TINY_VISION, cls_token=False)
    out = plain(torch.randn(1, 3, 32, 32))
    with pytest.raises(UserError, match=r"mode='cls' but VisionEncoder has no CLS token"):
        plain.pool(out, "cls")


def test_conv_stem_gives_the_patch_grid_and_sees_across_patch_borders():
    enc = flat(VisionEncoder, dim=32, depth=1, num_heads=4, patch_size=8, image_size=32,
                        cls_token=False, stem="conv").eval()
    images = torch.randn(2, 3, 32, 48)
    out = enc(images)
    assert out.memory.shape == (2, (32 // 8) * (48 // 8), 32)
    # A pixel just left of a patch border changes the token to its right (3x3 convs overlap);
    # the plain patch embedding could not see it.
    bumped = images.clone()
    bumped[:, :, 3, 7] += 10.0
    delta = (enc.patch_embed(bumped) - enc.patch_embed(images)).abs().amax(dim=(0, 1))   # (4, 6)
    assert delta[0, 1] > 0 and delta[0, 3:].max() == 0


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_deeper_conv_stem_keeps_the_grid_and_widens_the_receptive_field(norm):
    images = torch.randn(2, 3, 32, 64)
    bumped = images.clone()
    bumped[:, :, 3, 7] += 10.0                       # left of the first patch border
    reach = {}
    for convs in (1, 2):
        torch.manual_seed(0)
        enc = flat(VisionEncoder, dim=32, depth=1, num_heads=4, patch_size=8, image_size=32,
                            cls_token=False, stem="conv", stem_convs=convs, stem_norm=norm).eval()
        strided = [m.stride[0] for m in enc.patch_embed if isinstance(m, nn.Conv2d)]
        assert strided == [2, *[1] * (convs - 1)] * 3 + [1]          # + the 1x1 projection
        norms = [m for m in enc.patch_embed if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm))]
        assert len(norms) == 3 * convs
        assert all(isinstance(m, nn.BatchNorm2d) == (norm == "batch") for m in norms)
        assert enc(images).memory.shape == (2, (32 // 8) * (64 // 8), 32)
        delta = (enc.patch_embed(bumped) - enc.patch_embed(images)).abs().amax(dim=(0, 1))
        reach[convs] = int((delta[0] > 0).nonzero().max())      # rightmost token that moved
    # Receptive field of the stem: 15 pixels with one conv per stage, 43 with two, so the pixel
    # at column 7 reaches token 1 (columns 8-15) only, or tokens up to 3 (columns 24-31).
    assert reach == {1: 1, 2: 3}


def test_bad_stem_arguments():
    with pytest.raises(UserError, match=r"stem_convs \(0\) must be >= 1"):
        flat(VisionEncoder, dim=32, depth=1, num_heads=4, patch_size=8, image_size=32, stem="conv",
                      stem_convs=0)
    with pytest.raises(UserError, match=r"stem_norm \('group'\) 'batch' or 'layer'"):
        flat(VisionEncoder, dim=32, depth=1, num_heads=4, patch_size=8, image_size=32, stem="conv",
                      stem_norm="group")
    with pytest.raises(UserError, match=r"stem \('vit'\) must be 'patch' or 'conv'"):
        flat(VisionEncoder, dim=32, depth=1, num_heads=4, patch_size=8, image_size=32, stem="vit")
    with pytest.raises(UserError, match=r"patch_size \(6\) must be a power of two"):
        flat(VisionEncoder, dim=32, depth=1, num_heads=4, patch_size=6, image_size=36, stem="conv")
