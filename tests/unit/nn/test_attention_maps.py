"""Attention maps for inspection: the weights returned are the ones the layers used.

References are float64 softmax(q k^T / sqrt(d)) written from each layer's own projections and
its actual input (captured by a test-side pre-hook), never the explicit path under test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mmtf.nn.attention as attention_module
from mmtf.errors import UserError
from mmtf.nn import Attention, TransformerStack

B, N, M, DIM, HEADS, DEPTH = 2, 5, 7, 32, 4, 3


def decoder_stack() -> TransformerStack:
    torch.manual_seed(0)
    return TransformerStack(depth=DEPTH, dim=DIM, num_heads=HEADS, causal=True, cross_dim=DIM,
                            rope=True).eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    x, context = torch.randn(B, N, DIM), torch.randn(B, M, DIM)
    context_mask = torch.arange(M) < torch.tensor([M, 4])[:, None]          # row 1: 3 pads
    return x, context, context_mask


def reference_weights(layer: Attention, x: torch.Tensor, context: torch.Tensor | None,
                      mask: torch.Tensor) -> torch.Tensor:
    """float64 softmax(q k^T / sqrt(d)) with masked keys at -inf, (b, h, n, m)."""
    q = layer.to_q.weight.double() @ x.double().transpose(1, 2)             # (b, c, n)
    kv = layer.to_kv.weight.double() @ (x if context is None else context).double().transpose(1, 2)
    k = kv[:, : layer.dim]                                                  # (b, c, m)
    q = q.reshape(x.shape[0], layer.num_heads, layer.head_dim, -1).transpose(2, 3)
    k = k.reshape(x.shape[0], layer.num_heads, layer.head_dim, -1).transpose(2, 3)
    if layer.rope is not None:
        q, k = layer.rope(q.float(), 0).double(), layer.rope(k.float(), 0).double()
    scores = q @ k.transpose(-2, -1) / layer.head_dim ** 0.5                # (b, h, n, m)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def capture_inputs(stack: TransformerStack) -> dict[tuple[str, int], torch.Tensor]:
    """The normalised input each attention layer receives, recorded by pre-hooks (test only)."""
    seen: dict[tuple[str, int], torch.Tensor] = {}
    for i, block in enumerate(stack.blocks):
        for kind, layer in (("self", block.self_attn), ("cross", block.cross_attn)):
            layer.register_forward_pre_hook(
                lambda _m, args, key=(kind, i): seen.__setitem__(key, args[0].detach()))
    return seen


def test_maps_are_the_weights_each_layer_used():
    stack = decoder_stack()
    seen = capture_inputs(stack)
    x, context, context_mask = inputs()
    with torch.no_grad():
        _, maps = stack(x, context=context, context_mask=context_mask,
                        attention_layers={"cross": [1], "self": [-1]})
    assert {k: sorted(v) for k, v in maps.items()} == {"cross": [1], "self": [2]}
    cross = maps["cross"][1]
    assert cross.shape == (B, HEADS, N, M)
    expected = reference_weights(stack.blocks[1].cross_attn, seen[("cross", 1)], context,
                                 context_mask[:, None, None, :])
    torch.testing.assert_close(cross.double(), expected, atol=1e-5, rtol=1e-5)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    expected_self = reference_weights(stack.blocks[2].self_attn, seen[("self", 2)], None, causal)
    torch.testing.assert_close(maps["self"][2].double(), expected_self, atol=1e-5, rtol=1e-5)


def test_rows_sum_to_one_and_masked_keys_are_exactly_zero():
    stack = decoder_stack()
    x, context, context_mask = inputs()
    with torch.no_grad():
        _, maps = stack(x, context=context, context_mask=context_mask,
                        attention_layers={"cross": [0, 1, 2], "self": [0]})
    for w in maps["cross"].values():
        torch.testing.assert_close(w.sum(-1), torch.ones(B, HEADS, N))
        assert torch.equal(w[1, :, :, 4:], torch.zeros(HEADS, N, 3))        # the pads of row 1
    future = ~torch.ones(N, N, dtype=torch.bool).tril()
    assert bool((maps["self"][0][:, :, future] == 0).all())
    torch.testing.assert_close(maps["self"][0].sum(-1), torch.ones(B, HEADS, N))


def test_asking_for_maps_leaves_the_output_unchanged():
    stack = decoder_stack()
    x, context, context_mask = inputs()
    with torch.no_grad():
        plain = stack(x, context=context, context_mask=context_mask)
        inspected, _ = stack(x, context=context, context_mask=context_mask,
                             attention_layers={"cross": [0, 2], "self": [1]})
    torch.testing.assert_close(inspected, plain, atol=1e-5, rtol=1e-5)


def test_layers_not_asked_for_stay_on_the_fused_kernel(monkeypatch):
    calls: list[tuple[int, ...]] = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    stack = decoder_stack()
    x, context, context_mask = inputs()
    with torch.no_grad():
        stack(x, context=context, context_mask=context_mask)
        assert len(calls) == 2 * DEPTH                 # every self and cross layer fused
        calls.clear()
        stack(x, context=context, context_mask=context_mask, attention_layers={"cross": [1]})
    assert len(calls) == 2 * DEPTH - 1                 # only cross layer 1 left the kernel


def test_empty_request_returns_an_empty_dict_and_no_explicit_path(monkeypatch):
    stack = decoder_stack()
    x, context, context_mask = inputs()
    monkeypatch.setattr(Attention, "_explicit", lambda *a, **k: pytest.fail("explicit path"))
    with torch.no_grad():
        _, maps = stack(x, context=context, context_mask=context_mask, attention_layers={})
    assert maps == {}


@pytest.mark.parametrize(("request_", "message"), [
    ({"crosss": [0]}, "kind 'crosss' must be 'self' or 'cross'"),
    ({"cross": [3]}, r"cross layer 3 is outside \[-3, 3\)"),
    ({"self": [-4]}, r"self layer -4 is outside \[-3, 3\)"),
])
def test_bad_requests_name_the_value_and_the_range(request_, message):
    stack = decoder_stack()
    x, context, _ = inputs()
    with pytest.raises(UserError, match=message):
        stack(x, context=context, attention_layers=request_)


def test_cross_maps_from_an_encoder_stack_are_refused():
    stack = TransformerStack(depth=1, dim=DIM, num_heads=HEADS)
    with pytest.raises(UserError, match="'cross' asked of a stack without cross-attention"):
        stack(torch.randn(1, 3, DIM), attention_layers={"cross": [0]})
