"""LoRA in the attention core against hand-written references: the adapted forward is
``W x + b + B A x * alpha / r``, the fused ``to_kv`` adapts k and v separately, merge and unmerge
keep the outputs, and the adapter count is the formula's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmtf.errors import ConfigError
from mmtf.nn import TransformerStack
from mmtf.nn.lora import (
    TARGETS,
    LoRAConfig,
    LoRALinear,
    add_lora,
    lora_layers,
    lora_sites,
    merge_lora,
    strip_lora,
    unmerge_lora,
)


def _randomize_b(module: nn.Module) -> None:
    """B starts at zero (an adapter is the identity); a test needs it nonzero."""
    with torch.no_grad():
        for layer in lora_layers(module).values():
            for b in layer.lora_B.values():
                b.normal_(0.0, 0.5)


def test_adapted_linear_is_w_x_plus_b_a_x_times_alpha_over_r():
    base = nn.Linear(6, 5)
    x = torch.randn(2, 3, 6)
    layer = LoRALinear.wrap(base, slices=("q",), adapted={"q"}, r=2, alpha=6.0)
    assert layer.weight is base.weight and layer.bias is base.bias     # the same Parameters
    assert torch.equal(layer(x), base(x))                              # B = 0: the identity
    _randomize_b(layer)
    a, b = layer.lora_A["q"], layer.lora_B["q"]
    expected = x @ base.weight.T + base.bias + (x @ a.T @ b.T) * (6.0 / 2)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-6)
    # A is Kaiming-uniform as nn.Linear (PEFT's init): bound 1/sqrt(in_features)
    assert a.abs().max() <= 6 ** -0.5 and a.std() > 0


def test_fused_kv_adapts_k_and_v_separately():
    base = nn.Linear(4, 8, bias=False)
    x = torch.randn(3, 4)
    only_k = LoRALinear.wrap(base, slices=("k", "v"), adapted={"k"}, r=2, alpha=2.0)
    _randomize_b(only_k)
    delta = x @ only_k.lora_A["k"].T @ only_k.lora_B["k"].T
    torch.testing.assert_close(only_k(x), torch.cat([x @ base.weight[:4].T + delta,
                                                     x @ base.weight[4:].T], -1), rtol=0,
                               atol=1e-6)
    both = LoRALinear.wrap(base, slices=("k", "v"), adapted={"k", "v"}, r=2, alpha=2.0)
    _randomize_b(both)
    k, v = (x @ both.lora_A[s].T @ both.lora_B[s].T for s in "kv")
    torch.testing.assert_close(both(x), x @ base.weight.T + torch.cat([k, v], -1), rtol=0,
                               atol=1e-6)


def _stack(cross: bool = True) -> TransformerStack:
    return TransformerStack(depth=2, dim=16, num_heads=4, causal=cross,
                            cross_dim=12 if cross else None,
                            block={"num_kv_heads": 2, "bias": "qvo", "mlp_ratio": 2.0})


def test_merge_and_unmerge_keep_the_outputs_and_strip_gives_the_base_architecture():
    stack = _stack().eval()
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 7, 12)
    add_lora(stack, LoRAConfig(r=4, alpha=8))
    _randomize_b(stack)
    ref = stack(x, context=ctx)
    before = {k: v.clone() for k, v in stack.state_dict().items()}
    merge_lora(stack)
    torch.testing.assert_close(stack(x, context=ctx), ref, rtol=0, atol=1e-5)
    unmerge_lora(stack)
    torch.testing.assert_close(stack(x, context=ctx), ref, rtol=0, atol=1e-5)
    for k, v in stack.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=1e-6)
    strip_lora(stack)
    assert not lora_layers(stack)
    assert set(stack.state_dict()) == set(_stack().state_dict())
    torch.testing.assert_close(stack(x, context=ctx), ref, rtol=0, atol=1e-5)


def _kv_layer(dtype: torch.dtype = torch.float32, dropout: float = 0.0) -> LoRALinear:
    layer = LoRALinear.wrap(nn.Linear(16, 32).to(dtype), slices=("k", "v"), adapted=("k", "v"),
                            r=4, alpha=8.0, dropout=dropout)
    _randomize_b(layer)
    return layer


def test_a_state_dict_saved_merged_loads_merged_not_with_the_adapters_twice():
    torch.manual_seed(0)
    layer, x = _kv_layer().eval(), torch.randn(3, 16)
    ref = layer(x)
    plain = set(layer.state_dict())
    layer.merge()
    merged_state = layer.state_dict()
    fresh = _kv_layer().eval()
    fresh.load_state_dict(merged_state)                   # strict: the flag is a known key
    assert fresh.merged
    torch.testing.assert_close(fresh(x), ref, rtol=0, atol=1e-5)
    fresh.unmerge()
    torch.testing.assert_close(fresh(x), ref, rtol=0, atol=1e-5)
    layer.unmerge()
    assert set(layer.state_dict()) == plain               # unmerged: the keys of before
    layer.merge()
    layer.load_state_dict(fresh.state_dict())             # an unmerged state into a merged layer
    assert not layer.merged
    torch.testing.assert_close(layer(x), ref, rtol=0, atol=1e-5)


def test_unmerge_restores_the_base_weights_bit_for_bit_in_bfloat16():
    torch.manual_seed(0)
    layer = _kv_layer(torch.bfloat16)
    base = layer.weight.detach().clone()
    layer.merge()
    assert not torch.equal(layer.weight, base)
    layer.unmerge()
    assert torch.equal(layer.weight, base)


def test_a_double_backward_through_adapter_dropout_raises_instead_of_dropping_terms():
    torch.manual_seed(0)
    layer, x = _kv_layer(dropout=0.5).train(), torch.randn(3, 16, requires_grad=True)
    (grad,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


def test_adapter_count_is_the_formula():
    """Per adapted slice r * (in + out): q (d+d), k and v (c+kv) each, o (d+d), fc_in (d+h),
    fc_out (h+d); self-attention (c = d) and cross-attention (c = 12) of each block."""
    r, d, kv, h, c, depth = 4, 16, 8, 32, 12, 2
    stack = _stack()
    add_lora(stack, LoRAConfig(r=r, targets=("q", "k", "v", "o", "mlp")))
    count = sum(p.numel() for n, p in stack.named_parameters() if ".lora_" in n)
    per_block = (r * (d + d) + 2 * r * (d + kv) + r * (d + d)          # self-attention
                 + r * (d + d) + 2 * r * (c + kv) + r * (d + d)        # cross-attention
                 + r * (d + h) + r * (h + d))                          # MLP
    assert count == depth * per_block
    only_v = _stack(cross=False)
    add_lora(only_v, LoRAConfig(r=r, targets=("v",)))
    assert sum(p.numel() for n, p in only_v.named_parameters() if ".lora_" in n) == \
        depth * r * (d + kv)
    assert set(lora_sites(_stack(), ["k", "v"])) == {
        f"blocks.{i}.{a}.to_kv" for i in range(depth) for a in ("self_attn", "cross_attn")}


@pytest.mark.parametrize("kwargs, message", [
    ({"r": 0}, r"model.lora.r \(0\) must be an integer rank > 0"),
    ({"r": -2}, r"model.lora.r \(-2\) must be an integer rank > 0"),
    ({"targets": ("q", "qkv")}, r"model.lora.targets: \['qkv'\] names no projection .* the "
                                r"valid targets are \['q', 'k', 'v', 'o', 'mlp'\]"),
    ({"bias": "some"}, r"model.lora.bias \('some'\) must be one of"),
])
def test_bad_lora_settings_name_the_key_and_the_valid_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LoRAConfig(**kwargs)


def test_a_module_without_transformer_linear_layers_is_refused():
    with pytest.raises(ConfigError, match=r"model.encoder \(Sequential\) has no transformer "
                                          r"linear layer .* remove encoder from "
                                          r"model.lora.parts"):
        add_lora(nn.Sequential(nn.Conv1d(2, 2, 3)), LoRAConfig(), owner="model.encoder")
    assert list(TARGETS) == ["q", "k", "v", "o", "mlp"]


def _dropped_reference(x, a, b, scale, p, seed):
    """B A dropout(x) * scale with the mask drawn as the adapter draws it (same seed)."""
    torch.manual_seed(seed)
    keep = torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)
    return (x * keep / (1.0 - p)) @ a.T @ b.T * scale


def test_adapter_dropout_is_one_mask_per_input_and_its_gradients_are_autograds():
    """Training with dropout: k and v read one dropped input; forward and every gradient equal
    plain autograd on the hand-written formula with that mask."""
    base = nn.Linear(6, 8).requires_grad_(False)
    layer = LoRALinear.wrap(base, slices=("k", "v"), adapted={"k", "v"}, r=2, alpha=4.0,
                            dropout=0.4).train()
    _randomize_b(layer)
    x = torch.randn(3, 5, 6, requires_grad=True)
    torch.manual_seed(7)
    out = layer(x)
    grads = torch.autograd.grad(out.square().sum(), [x, layer.lora_A["k"], layer.lora_A["v"],
                                                     layer.lora_B["k"], layer.lora_B["v"]])
    a = torch.cat([layer.lora_A["k"], layer.lora_A["v"]])
    bk, bv = layer.lora_B["k"], layer.lora_B["v"]
    b = torch.block_diag(bk, bv)
    ref = base(x) + _dropped_reference(x, a, b, 2.0, 0.4, seed=7)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    expected = torch.autograd.grad(ref.square().sum(), [x, layer.lora_A["k"],
                                                        layer.lora_A["v"], bk, bv])
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the two slices' adapters saw the same dropped input: with equal A and B, equal outputs
    with torch.no_grad():
        layer.lora_A["v"].copy_(layer.lora_A["k"])
        layer.lora_B["v"].copy_(layer.lora_B["k"])
        base.weight.zero_()
        base.bias.zero_()
    torch.manual_seed(8)
    k, v = layer(x).detach().chunk(2, dim=-1)
    assert torch.equal(k, v) and not torch.equal(k, layer.eval()(x).detach().chunk(2, -1)[0])


def test_adapter_dropout_keeps_a_one_byte_mask_not_a_dropped_copy_for_backward():
    """What autograd keeps for an adapted frozen projection in training: the input (whoever
    made it), a bool mask, the rank-sized A x and the adapters stacked (A (2r, in), B (out,
    2r)); not dropout(x) nor a float noise tensor."""
    base = nn.Linear(64, 128).requires_grad_(False)
    layer = LoRALinear.wrap(base, slices=("k", "v"), adapted={"k", "v"}, r=4, alpha=8.0,
                            dropout=0.1).train()
    _randomize_b(layer)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = torch.randn(10, 64, requires_grad=True)
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x).sum().backward()
    stacked = (8 * 64 + 128 * 8) * 4
    assert sum(saved.values()) == x.numel() * 4 + x.numel() + 10 * 8 * 4 + stacked
    assert layer.lora_A["k"].grad.abs().sum() > 0
