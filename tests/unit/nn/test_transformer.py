"""Transformer block options against float64 formulas written from the modules' weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmtf.errors import UserError
from mmtf.nn.transformer import MLP, TransformerBlock, make_norm


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019), in float64."""
    x = x.double()
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * weight.double()


def swiglu_reference(x: torch.Tensor, mlp: MLP) -> torch.Tensor:
    """(silu(x W_gate) * x W_value) W_out (Shazeer 2020), in float64; fc_in holds [gate; value]."""
    w_in, w_out = mlp.fc_in.weight.double(), mlp.fc_out.weight.double()
    hidden = w_out.shape[1]
    gate, value = x.double() @ w_in[:hidden].T, x.double() @ w_in[hidden:].T
    return (gate * torch.sigmoid(gate) * value) @ w_out.T


def test_rmsnorm_matches_the_formula():
    norm = make_norm("rmsnorm", 32)
    with torch.no_grad():
        norm.weight.normal_()                       # not all ones: the scale is applied
    x = torch.randn(3, 5, 32) * 4 + 1
    torch.testing.assert_close(norm(x).double(), rms_norm_reference(x, norm.weight, 1e-5),
                               atol=1e-5, rtol=1e-5)


def test_swiglu_matches_the_formula_and_keeps_the_parameter_count():
    mlp = MLP(dim=48, mlp_ratio=4.0, kind="swiglu")
    x = torch.randn(2, 7, 48)
    torch.testing.assert_close(mlp(x).double(), swiglu_reference(x, mlp), atol=1e-5, rtol=1e-5)
    gelu = MLP(dim=48, mlp_ratio=4.0, kind="gelu")
    assert mlp.fc_out.weight.shape == (48, 128)                     # 2/3 of 4 * 48
    count = [sum(p.numel() for p in m.parameters()) for m in (mlp, gelu)]
    assert count[0] == count[1]                                     # 3 * 48 * 128 = 2 * 48 * 192


def test_block_with_swiglu_and_rmsnorm_matches_a_float64_reference():
    torch.manual_seed(0)
    block = TransformerBlock(dim=32, num_heads=4, causal=True,
                             block={"mlp": "swiglu", "norm": "rmsnorm"}).eval()
    with torch.no_grad():
        for norm in (block.norm_self, block.norm_mlp):
            norm.weight.normal_()
    x = torch.randn(2, 6, 32)
    attn = block.self_attn
    # x + Attn(RMS(x)), then + SwiGLU(RMS(.)): attention as softmax(q k^T / sqrt(d)) v.
    h = rms_norm_reference(x, block.norm_self.weight, 1e-5)
    q = (h @ attn.to_q.weight.double().T).unflatten(-1, (4, 8)).transpose(1, 2)
    k, v = (h @ attn.to_kv.weight.double().T).unflatten(-1, (2, 4, 8)).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(
        ~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf)
    a = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2) @ attn.to_out.weight.double().T
    y = x.double() + a
    expected = y + swiglu_reference(rms_norm_reference(y, block.norm_mlp.weight, 1e-5),
                                    block.mlp)
    torch.testing.assert_close(block(x).double(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(F.layer_norm(x, (32,)), block.norm_self(x))   # really RMSNorm


@pytest.mark.parametrize(("factory", "match"), [
    (lambda: make_norm("batchnorm", 8), r"norm \('batchnorm'\) must be 'layernorm' or 'rmsnorm'"),
    (lambda: MLP(dim=8, kind="relu"), r"mlp \('relu'\) must be one of gelu, gelu_tanh, quick_gelu, swiglu"),
    (lambda: MLP(dim=8, mlp_ratio=0), r"mlp_ratio \(0\) must be > 0"),
])
def test_bad_options_are_user_errors(factory, match):
    with pytest.raises(UserError, match=match):
        factory()


@pytest.mark.parametrize("kind,reference", [
    ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))),
    ("gelu_tanh", lambda h: 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                     * (h + 0.044715 * h ** 3)))),
    ("quick_gelu", lambda h: h * torch.sigmoid(1.702 * h)),
])
def test_gelu_variants_match_their_formulas(kind, reference):
    mlp = MLP(dim=16, kind=kind, bias=True)
    with torch.no_grad():
        mlp.fc_in.bias.normal_()
        mlp.fc_out.bias.normal_()
    x = torch.randn(2, 5, 16) * 3
    h = x.double() @ mlp.fc_in.weight.double().T + mlp.fc_in.bias.double()
    expected = reference(h) @ mlp.fc_out.weight.double().T + mlp.fc_out.bias.double()
    torch.testing.assert_close(mlp(x).double(), expected, atol=1e-5, rtol=1e-5)


def test_norm_eps_reaches_every_norm_and_final_norm_can_be_left_out():
    from mmtf.nn import TransformerStack
    stack = TransformerStack(depth=2, dim=16, num_heads=2, cross_dim=8, block={"norm_eps": 1e-12})
    eps = {m.eps for m in stack.modules() if isinstance(m, torch.nn.LayerNorm)}
    assert eps == {1e-12}
    bare = TransformerStack(depth=1, dim=16, num_heads=2, final_norm=False).eval()
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(bare(x), bare.blocks[0](x))           # no norm after the block
