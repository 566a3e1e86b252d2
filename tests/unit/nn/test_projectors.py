"""Projectors: output shapes and masks on odd lengths, each kind against a hand computation,
the window Q-Former's locality, and masked frames that never reach the output."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from mmtf.errors import UserError
from mmtf.nn.projectors import (
    PROJECTORS,
    ConcatProjector,
    ConvProjector,
    PixelShuffleProjector,
    QFormerProjector,
    build_projector,
)

D_ENC, D_LLM = 6, 8
LENGTHS = torch.tensor([11, 7, 1])          # odd lengths: no kind's k divides them all


def frames(n: int = 11, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(LENGTHS), n, D_ENC, generator=g)
    return x, torch.arange(n)[None] < LENGTHS[:, None]


def make(kind: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_projector({"kind": kind, **kw}, in_dim=D_ENC, out_dim=D_LLM).eval()


def ceil_div(a: torch.Tensor, k: int) -> torch.Tensor:
    return (a + k - 1) // k


# kind, settings, output length m for n = 11, each item's valid positions from its length L.
SEQUENCE_CASES = [
    ("linear", {}, 11, lambda L: L),
    ("mlp", {"hidden": 5}, 11, lambda L: L),
    ("concat", {"k": 3}, 4, lambda L: ceil_div(L, 3)),                  # 11 -> 4 windows
    ("conv", {"k": 4}, 3, lambda L: ceil_div(L, 4)),                    # 11 -> 3 windows
    ("qformer", {"num_queries": 3, "depth": 1, "num_heads": 2}, 3, lambda L: 0 * L + 3),
    ("qformer", {"num_queries": 2, "window": 4, "depth": 1, "num_heads": 2}, 6,
     lambda L: 2 * ceil_div(L, 4)),                                     # 3 windows x 2 queries
]
IDS = [f"{k}{'_window' if 'window' in s else ''}" for k, s, _, _ in SEQUENCE_CASES]


@pytest.mark.parametrize("kind,settings,m,valid", SEQUENCE_CASES, ids=IDS)
def test_shapes_and_masks_on_odd_lengths(kind, settings, m, valid):
    projector = make(kind, **settings)
    x, mask = frames()
    with torch.no_grad():
        out = projector(x, mask)
    assert out.embeds.shape == (3, m, D_LLM) and out.mask.shape == (3, m)
    assert projector.output_length(11) == m
    expected = torch.arange(m)[None] < valid(LENGTHS)[:, None]          # valid positions first
    assert torch.equal(out.mask, expected)
    assert out.embeds[~out.mask].abs().sum() == 0
    assert out.embeds[out.mask].abs().min() > 0


@pytest.mark.parametrize("kind,settings,m,valid", SEQUENCE_CASES, ids=IDS)
def test_masked_frames_do_not_change_the_output(kind, settings, m, valid):
    projector = make(kind, **settings)
    x, mask = frames()
    noisy = torch.where(mask[..., None], x, 100.0 * torch.randn_like(x))
    with torch.no_grad():
        a, b = projector(x, mask), projector(noisy, mask)
    assert torch.equal(a.embeds, b.embeds)
    # And an item equals itself alone without padding: masked keys of the Q-Former get no
    # attention (zeroed frames alone would still be attended to).
    with torch.no_grad():
        alone = projector(x[1:2, :7], None)                             # item 1, L = 7
    n_valid = int(a.mask[1].sum())
    torch.testing.assert_close(a.embeds[1, :n_valid], alone.embeds[0, :n_valid],
                               atol=1e-6, rtol=1e-5)


def test_concat_equals_a_hand_reshape():
    projector = make("concat", k=3)
    x, mask = frames()
    x0 = x * mask[..., None]
    padded = torch.cat([x0, torch.zeros(3, 1, D_ENC)], dim=1)          # 11 -> 12 frames
    hand = torch.stack([torch.cat([padded[:, 3 * j + i] for i in range(3)], dim=-1)
                        for j in range(4)], dim=1)                      # (3, 4, 3 * D_ENC)
    with torch.no_grad():
        out = projector(x, mask)
        expected = projector.mlp(hand)
    torch.testing.assert_close(out.embeds[out.mask], expected[out.mask])


def test_conv_equals_torch_conv1d_on_the_same_weights():
    projector = make("conv", k=4)
    assert isinstance(projector, ConvProjector)
    x, mask = frames()
    padded = F.pad((x * mask[..., None]).transpose(1, 2), (0, 1))      # (3, D_ENC, 12)
    with torch.no_grad():
        expected = F.conv1d(padded, projector.conv.weight, projector.conv.bias, stride=4)
        out = projector(x, mask)
    expected = expected.transpose(1, 2)                                 # (3, 3, D_LLM)
    torch.testing.assert_close(out.embeds[out.mask], expected[out.mask])


def test_window_qformer_attends_only_within_its_window():
    projector = make("qformer", num_queries=2, window=4, depth=2, num_heads=2)
    assert isinstance(projector, QFormerProjector)
    x = torch.randn(1, 12, D_ENC)
    moved = x.clone()
    moved[:, 4:8] += torch.randn(1, 4, D_ENC)                           # window 1 only
    with torch.no_grad():
        a, b = projector(x).embeds, projector(moved).embeds             # (1, 6, D_LLM)
    assert torch.equal(a[:, :2], b[:, :2]) and torch.equal(a[:, 4:], b[:, 4:])
    assert (a[:, 2:4] - b[:, 2:4]).abs().min() > 0
    # Without a window every query reads every frame.
    whole = make("qformer", num_queries=2, depth=2, num_heads=2)
    with torch.no_grad():
        assert (whole(x).embeds - whole(moved).embeds).abs().min() > 0


def test_pixel_shuffle_equals_a_hand_loop_and_drops_the_cls_token():
    projector = build_projector({"kind": "pixel_shuffle", "factor": 2}, in_dim=D_ENC,
                                out_dim=D_LLM, prefix_tokens=1)
    assert isinstance(projector, PixelShuffleProjector) and projector.prefix_tokens == 1
    x = torch.randn(2, 1 + 16, D_ENC)                                   # CLS + a 4 x 4 grid
    grid = x[:, 1:].reshape(2, 4, 4, D_ENC)                            # (b, row, col, d)
    # Output position (i, j) reads patches (2i + a, 2j + c) for a, c in {0, 1}, row-major.
    hand = torch.stack([torch.cat([grid[:, 2 * i + a, 2 * j + c] for a in (0, 1)
                                   for c in (0, 1)], dim=-1)
                        for i in range(2) for j in range(2)], dim=1)   # (2, 4, 4 * D_ENC)
    with torch.no_grad():
        out = projector(x)
    assert out.mask.all() and out.embeds.shape == (2, 4, D_LLM)
    torch.testing.assert_close(out.embeds, projector.proj(hand).detach())
    with pytest.raises(UserError, match="15 patches are no square grid"):
        projector(torch.randn(1, 16, D_ENC))
    rect = build_projector({"kind": "pixel_shuffle", "grid": [2, 4]}, in_dim=D_ENC,
                           out_dim=D_LLM)
    assert rect(torch.randn(1, 8, D_ENC)).embeds.shape == (1, 2, D_LLM)


def test_registry_and_config_errors():
    assert set(PROJECTORS) == {"linear", "mlp", "concat", "conv", "qformer", "pixel_shuffle"}
    assert isinstance(build_projector("concat", in_dim=D_ENC, out_dim=D_LLM), ConcatProjector)
    with pytest.raises(UserError, match=r"model.projector.kind \('nope'\) must be one of"):
        build_projector({"kind": "nope"}, in_dim=D_ENC, out_dim=D_LLM)
    with pytest.raises(UserError, match="model.projector.window is not a setting of the concat"):
        build_projector({"kind": "concat", "window": 3}, in_dim=D_ENC, out_dim=D_LLM)
    with pytest.raises(UserError, match=r"model.projector.out_dim \(9\) != the LLM's hidden"):
        build_projector({"kind": "linear", "out_dim": 9}, in_dim=D_ENC, out_dim=D_LLM)
    with pytest.raises(UserError, match=r"model.projector.k \(0\) must be an integer >= 1"):
        build_projector({"kind": "conv", "k": 0}, in_dim=D_ENC, out_dim=D_LLM)
    # A _target_ with _partial_: true arrives as a callable and gets both widths.
    partial = functools.partial(ConcatProjector, k=2)
    built = build_projector(partial, in_dim=D_ENC, out_dim=D_LLM)
    assert (built.in_dim, built.out_dim, built.k) == (D_ENC, D_LLM, 2)
