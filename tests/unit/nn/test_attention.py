"""The attention core against independent references: a float64 loop and nn.MultiheadAttention."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmtf.errors import UserError
from mmtf.nn import Attention, KVCache, RotaryEmbedding


def loop_attention(attn: Attention, x: torch.Tensor, context: torch.Tensor | None = None,
                   key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Deliberately plain float64 reference: per batch, head, query and key; softmax; weighted sum.

    Uses only the layer's weights, never its forward code.
    """
    with torch.no_grad():
        return _loop_attention(attn, x, context, key_mask)


def _loop_attention(attn, x, context, key_mask):
    x = x.double()
    src = x if context is None else context.double()
    wq, wkv, wo = (p.weight.double() for p in (attn.to_q, attn.to_kv, attn.to_out))
    h, g, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    b, n, _ = x.shape
    m = src.shape[1]
    q_all = x @ wq.T
    kv = src @ wkv.T
    k_all, v_all = kv[..., : g * d], kv[..., g * d:]
    out = torch.zeros(b, n, h * d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            gi = hi // (h // g)
            q = q_all[bi, :, hi * d:(hi + 1) * d]
            k = k_all[bi, :, gi * d:(gi + 1) * d]
            v = v_all[bi, :, gi * d:(gi + 1) * d]
            if attn.rope is not None and context is None:
                q, k = rope_loop(q, attn.rope.base), rope_loop(k, attn.rope.base)
            for i in range(n):
                scores, values = [], []
                for j in range(m):
                    if attn.causal and j > i:
                        continue
                    if key_mask is not None and not key_mask[bi, j]:
                        continue
                    scores.append(float(q[i] @ k[j]) / math.sqrt(d))
                    values.append(v[j])
                if not scores:
                    continue                                  # a row with no keys outputs zeros
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                out[bi, i, hi * d:(hi + 1) * d] = sum(w / total * val for w, val in zip(weights, values))
    return out @ wo.T


def rope_loop(t: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate each position's pairs (i, i + d/2) by pos * base^(-2i/d), in float64."""
    n, d = t.shape
    out = t.clone()
    for pos in range(n):
        for i in range(d // 2):
            theta = pos * base ** (-2 * i / d)
            a, b = t[pos, i], t[pos, i + d // 2]
            out[pos, i] = a * math.cos(theta) - b * math.sin(theta)
            out[pos, i + d // 2] = a * math.sin(theta) + b * math.cos(theta)
    return out


def padding_mask(lengths: list[int], m: int) -> torch.Tensor:
    return torch.arange(m)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_self_attention_matches_float64_loop(causal, num_kv_heads, masked):
    attn = Attention(dim=32, num_heads=4, num_kv_heads=num_kv_heads, causal=causal).eval()
    x = torch.randn(2, 6, 32)
    mask = padding_mask([6, 4], 6) if masked else None
    expected = loop_attention(attn, x, key_mask=mask).float()
    torch.testing.assert_close(attn(x, key_mask=mask), expected, atol=1e-5, rtol=1e-5)
    y, _ = attn(x, key_mask=mask, need_weights=True)
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)


def test_rope_self_attention_matches_float64_loop():
    rope = RotaryEmbedding(head_dim=8, max_len=16)
    attn = Attention(dim=32, num_heads=4, num_kv_heads=2, causal=True, rope=rope).eval()
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(attn(x), loop_attention(attn, x).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_cross_attention_matches_float64_loop(num_kv_heads):
    attn = Attention(dim=32, num_heads=4, num_kv_heads=num_kv_heads, kv_dim=24).eval()
    x, mem = torch.randn(3, 5, 32), torch.randn(3, 9, 24)
    mask = padding_mask([9, 3, 1], 9)
    expected = loop_attention(attn, x, context=mem, key_mask=mask).float()
    torch.testing.assert_close(attn(x, mem, key_mask=mask), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_multihead_attention(causal):
    dim, heads = 32, 4
    ours = Attention(dim=dim, num_heads=heads, causal=causal, bias=True).eval()
    ref = nn.MultiheadAttention(dim, heads, bias=True, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.to_q.weight, ours.to_kv.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.to_q.bias, ours.to_kv.bias]))
        ref.out_proj.weight.copy_(ours.to_out.weight)
        ref.out_proj.bias.copy_(ours.to_out.bias)
    x = torch.randn(2, 7, dim)
    lengths = [7, 5]
    keep = padding_mask(lengths, 7)
    attn_mask = torch.ones(7, 7, dtype=torch.bool).triu(1) if causal else None  # True = blocked
    expected, expected_w = ref(x, x, x, key_padding_mask=~keep, attn_mask=attn_mask,
                               need_weights=True, average_attn_weights=False)
    got, got_w = ours(x, key_mask=keep, need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, expected_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours(x, key_mask=keep), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_explicit_paths_agree(causal):
    rope = RotaryEmbedding(head_dim=16)
    attn = Attention(dim=64, num_heads=4, num_kv_heads=2, causal=causal, rope=rope).eval()
    x = torch.randn(3, 11, 64)
    for mask in (None, padding_mask([11, 6, 1], 11)):
        y, w = attn(x, key_mask=mask, need_weights=True)
        torch.testing.assert_close(attn(x, key_mask=mask), y, atol=1e-5, rtol=1e-5)
        assert w.shape == (3, 4, 11, 11)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 11), atol=1e-5, rtol=1e-5)


def reference_weights(attn: Attention, x: torch.Tensor, key_mask: torch.Tensor | None,
                      ) -> torch.Tensor:
    """Attention probabilities (b, h, n, m) of a self-attention layer without RoPE, in float64
    from the layer's weights; masked keys get 0."""
    x = x.double()
    h, g, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = (x @ attn.to_q.weight.double().T).unflatten(-1, (h, d)).transpose(1, 2)   # (b, h, n, d)
    k = (x @ attn.to_kv.weight.double().T)[..., : g * d].unflatten(-1, (g, d)).transpose(1, 2)
    k = k.repeat_interleave(h // g, dim=1)                                         # (b, h, m, d)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    n, m = scores.shape[-2:]
    allowed = torch.ones(n, m, dtype=torch.bool)
    if attn.causal:
        allowed = allowed.tril()
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    return scores.masked_fill(~allowed, -math.inf).softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_explicit_path_in_low_precision_matches_float64_and_sdpa(dtype, causal):
    attn = Attention(dim=32, num_heads=4, num_kv_heads=2, causal=causal).eval().to(dtype)
    x = torch.randn(2, 6, 32).to(dtype)
    mask = padding_mask([6, 4], 6)
    got, weights = attn(x, key_mask=mask, need_weights=True)
    assert got.dtype == dtype and weights.dtype == dtype
    # References from the same (rounded) weights and inputs, in float64.
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(weights.double(), reference_weights(attn, x, mask), **tol)
    torch.testing.assert_close(got.double(), loop_attention(attn, x, key_mask=mask), **tol)
    torch.testing.assert_close(got, attn(x, key_mask=mask), **tol)              # the SDPA path
    torch.testing.assert_close(weights.double().sum(-1), torch.ones(2, 4, 6, dtype=torch.float64),
                               atol=1e-2, rtol=0)
    assert torch.equal(weights[1, :, :, 4:], torch.zeros_like(weights[1, :, :, 4:]))


def test_explicit_path_scales_before_the_matmul_in_float16():
    attn = Attention(dim=32, num_heads=4).eval()
    with torch.no_grad():                 # q.k up to ~1e5, past float16's 65504 before scaling
        attn.to_q.weight.mul_(200.0)
        attn.to_kv.weight[:32].mul_(200.0)
    x = torch.randn(2, 6, 32)
    q = x.double() @ attn.to_q.weight.double().T
    k = x.double() @ attn.to_kv.weight[:32].double().T
    assert (q[..., :8] @ k[..., :8].transpose(-2, -1)).abs().max() > 65504    # the case tested
    attn = attn.half()
    got, weights = attn(x.half(), need_weights=True)
    assert torch.isfinite(got).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(2, 4, 6), atol=1e-2, rtol=0)
    torch.testing.assert_close(got, attn(x.half()), atol=1e-2, rtol=1e-2)       # the SDPA path


def test_explicit_path_in_float64_keeps_float64_precision():
    attn = Attention(dim=32, num_heads=4, causal=True).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    mask = padding_mask([6, 4], 6)
    got, weights = attn(x, key_mask=mask, need_weights=True)
    assert weights.dtype == torch.float64
    torch.testing.assert_close(weights, reference_weights(attn, x, mask), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got, loop_attention(attn, x, key_mask=mask), atol=1e-12, rtol=1e-12)


def test_causal_fast_path_builds_no_mask(monkeypatch):
    attn = Attention(dim=32, num_heads=4, causal=True).eval()
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    attn(torch.randn(2, 9, 32))
    assert seen == [(None, True)]


def test_causality_outputs_and_gradients():
    rope = RotaryEmbedding(head_dim=8)
    attn = Attention(dim=32, num_heads=4, causal=True, rope=rope).eval()
    x = torch.randn(2, 10, 32, requires_grad=True)
    t = 5
    y = attn(x)
    x2 = x.detach().clone()
    x2[:, t + 1:] = torch.randn(2, 10 - t - 1, 32) * 10
    torch.testing.assert_close(attn(x2)[:, : t + 1], y[:, : t + 1], atol=1e-6, rtol=1e-6)
    y[:, : t + 1].sum().backward()
    assert x.grad[:, t + 1:].abs().max() == 0
    assert x.grad[:, : t + 1].abs().max() > 0


@pytest.mark.parametrize("causal", [False, True])
def test_padding_content_and_amount_do_not_matter(causal):
    attn = Attention(dim=32, num_heads=4, causal=causal).eval()
    valid = torch.randn(1, 5, 32)
    outputs = []
    for pad_len, scale in ((0, 0.0), (3, 1.0), (8, 100.0)):
        x = torch.cat([valid, torch.randn(1, pad_len, 32) * scale], dim=1)
        mask = padding_mask([5], 5 + pad_len)
        outputs.append(attn(x, key_mask=mask)[:, :5])
    for other in outputs[1:]:
        torch.testing.assert_close(other, outputs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_are_zero_not_nan(need_weights):
    attn = Attention(dim=32, num_heads=4, kv_dim=16)
    x = torch.randn(2, 3, 32, requires_grad=True)
    mem = torch.randn(2, 4, 16, requires_grad=True)
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    out = attn(x, mem, key_mask=mask, need_weights=need_weights)
    y = out[0] if need_weights else out
    assert torch.isfinite(y).all()
    # The fully-masked row returns zeros before the output projection, so only its bias remains.
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(mem.grad).all()
    assert mem.grad[1].abs().max() == 0


def test_causal_left_padding_row_without_keys_is_zero():
    attn = Attention(dim=32, num_heads=4, causal=True)
    x = torch.randn(1, 4, 32, requires_grad=True)
    mask = torch.tensor([[False, True, True, True]])   # query 0 can only see key 0, which is padding
    y = attn(x, key_mask=mask)
    assert torch.equal(y[0, 0], torch.zeros(32)) and torch.isfinite(y).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


# ----------------------------------------------------------------------------- KV cache


def _decoder_attn(num_kv_heads: int = 4) -> Attention:
    rope = RotaryEmbedding(head_dim=8, max_len=4)   # short table: cached decoding must extend it
    return Attention(dim=32, num_heads=4, num_kv_heads=num_kv_heads, causal=True, rope=rope).eval()


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_cache_token_by_token_equals_full_pass(num_kv_heads):
    attn = _decoder_attn(num_kv_heads)
    x = torch.randn(2, 9, 32)
    cache = KVCache(batch_size=2, num_kv_heads=num_kv_heads, max_len=16, head_dim=8)
    steps = [attn(x[:, t:t + 1], cache=cache) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), attn(x), atol=1e-5, rtol=1e-5)
    assert cache.length == 9


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_cache_chunked_prefill_then_steps_equals_full_pass(num_kv_heads):
    attn = _decoder_attn(num_kv_heads)
    x = torch.randn(2, 10, 32)
    cache = KVCache(batch_size=2, num_kv_heads=num_kv_heads, max_len=16, head_dim=8)
    chunks = [attn(x[:, :4], cache=cache),       # prefill into an empty cache
              attn(x[:, 4:7], cache=cache),      # 3 queries vs 7 keys: bottom-right mask
              attn(x[:, 7:8], cache=cache),      # single-token step
              attn(x[:, 8:], cache=cache)]       # 2 more
    torch.testing.assert_close(torch.cat(chunks, dim=1), attn(x), atol=1e-5, rtol=1e-5)
    # the explicit path agrees on a chunk too
    cache2 = KVCache(batch_size=2, num_kv_heads=num_kv_heads, max_len=16, head_dim=8)
    attn(x[:, :4], cache=cache2)
    y, w = attn(x[:, 4:7], cache=cache2, need_weights=True)
    torch.testing.assert_close(y, chunks[1], atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 4, 3, 7) and w[..., 0, 5:].abs().max() == 0


def test_cache_with_key_mask_matches_full_pass():
    attn = _decoder_attn(2)
    x = torch.randn(2, 6, 32)
    mask = torch.tensor([[True] * 6, [False, False, True, True, True, True]])   # left padding
    cache = KVCache(batch_size=2, num_kv_heads=2, max_len=8, head_dim=8)
    steps = [attn(x[:, :3], key_mask=mask[:, :3], cache=cache)]
    steps += [attn(x[:, t:t + 1], key_mask=mask[:, : t + 1], cache=cache) for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), attn(x, key_mask=mask), atol=1e-5, rtol=1e-5)


def test_cache_is_preallocated_and_written_in_place():
    attn = _decoder_attn()
    cache = KVCache(batch_size=1, num_kv_heads=4, max_len=8, head_dim=8)
    k_ptr, v_ptr = cache.k.data_ptr(), cache.v.data_ptr()
    for _ in range(8):
        attn(torch.randn(1, 1, 32), cache=cache)
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == (k_ptr, v_ptr)
    assert cache.k.shape == (1, 4, 8 + 1, 8)               # one spare position, never written
    assert cache.keys.shape == (1, 4, 8, 8)


def test_cache_overflow_names_the_limit():
    attn = _decoder_attn()
    cache = KVCache(batch_size=1, num_kv_heads=4, max_len=4, head_dim=8)
    attn(torch.randn(1, 3, 32), cache=cache)
    with pytest.raises(ValueError, match=r"max_len=4"):
        attn(torch.randn(1, 2, 32), cache=cache)


def test_beam_reorder_equals_recomputing_reordered_batch():
    attn = _decoder_attn(2)
    x = torch.randn(3, 6, 32)
    beam_idx = torch.tensor([2, 0, 0])
    cache = KVCache(batch_size=3, num_kv_heads=2, max_len=8, head_dim=8)
    attn(x[:, :4], cache=cache)
    cache.reorder(beam_idx)
    # After reordering, row i continues the history of row beam_idx[i] with a new token.
    new = torch.randn(3, 2, 32)
    got = attn(new, cache=cache)
    reordered = torch.cat([x[beam_idx, :4], new], dim=1)
    torch.testing.assert_close(got, attn(reordered)[:, 4:], atol=1e-5, rtol=1e-5)


def test_cross_attention_cache_projects_context_once():
    attn = Attention(dim=32, num_heads=4, num_kv_heads=2, kv_dim=16).eval()
    mem = torch.randn(2, 7, 16)
    mask = padding_mask([7, 4], 7)
    calls = []
    attn.to_kv.register_forward_hook(lambda *_: calls.append(1))
    cache = KVCache(batch_size=2, num_kv_heads=2, max_len=7, head_dim=8)
    queries = torch.randn(2, 5, 32)
    steps = [attn(queries[:, t:t + 1], mem if t == 0 else None, key_mask=mask, cache=cache)
             for t in range(5)]
    assert len(calls) == 1
    torch.testing.assert_close(torch.cat(steps, 1), attn(queries, mem, key_mask=mask),
                               atol=1e-5, rtol=1e-5)


def test_rope_table_extends_past_max_len():
    rope = RotaryEmbedding(head_dim=8, max_len=4)
    x = torch.randn(1, 2, 10, 8)
    y = rope(x, offset=3)
    assert rope.max_len >= 13
    ref = torch.stack([rope_loop(x[0, h].double(), 10000.0) for h in range(2)])[None]
    torch.testing.assert_close(rope(x).double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y[:, :, 0], rope(torch.cat([torch.zeros(1, 2, 3, 8), x], 2))[:, :, 3])


def test_rope_runs_in_float32_for_bf16_input():
    rope = RotaryEmbedding(head_dim=8, max_len=8)
    x = torch.randn(1, 1, 5, 8)
    torch.testing.assert_close(rope(x.bfloat16()).float(), rope(x), atol=2e-2, rtol=2e-2)
    assert rope.cos.dtype == torch.float32 and rope(x.bfloat16()).dtype == torch.bfloat16


def test_bf16_autocast_close_to_float32():
    rope = RotaryEmbedding(head_dim=16)
    attn = Attention(dim=64, num_heads=4, causal=True, rope=rope).eval()
    x = torch.randn(2, 16, 64)
    ref = attn(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attn(x, key_mask=padding_mask([16, 16], 16))
        got_fast = attn(x)
    for y in (got, got_fast):
        rel = (y.float() - ref).norm() / ref.norm()
        assert rel < 2e-2, rel


def test_dropout_only_in_training():
    attn = Attention(dim=32, num_heads=4, dropout=0.5)
    x = torch.randn(2, 8, 32)
    reference = loop_attention(attn, x).float()                    # no dropout
    torch.testing.assert_close(attn.eval()(x), reference, atol=1e-5, rtol=1e-5)
    attn.train()
    assert not torch.allclose(attn(x), reference, atol=1e-3)
    assert not torch.allclose(attn(x, need_weights=True)[0], reference, atol=1e-3)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("kwargs", "pattern"), [
    (dict(dim=30, num_heads=4), r"dim \(30\) must be divisible by num_heads \(4\)"),
    (dict(dim=48, num_heads=6, num_kv_heads=4), r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"),
    (dict(dim=32, num_heads=4, kv_dim=16, causal=True), r"causal=True with kv_dim"),
    (dict(dim=32, num_heads=4, kv_dim=16, rope=RotaryEmbedding(head_dim=8)), r"rope with kv_dim"),
    (dict(dim=32, num_heads=4, rope=RotaryEmbedding(head_dim=16)), r"rope.head_dim \(16\)"),
    (dict(dim=32, num_heads=4, dropout=1.5), r"dropout \(1.5\)"),
])
def test_bad_constructor_arguments(kwargs, pattern):
    with pytest.raises(UserError, match=pattern):
        Attention(**kwargs)


def test_bad_call_arguments():
    self_attn = Attention(dim=32, num_heads=4)
    cross = Attention(dim=32, num_heads=4, kv_dim=16)
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match=r"context given to a self-attention layer.*kv_dim"):
        self_attn(x, context=torch.randn(2, 3, 32))
    with pytest.raises(ValueError, match=r"cross-attention layer.*pass context"):
        cross(x)
    with pytest.raises(ValueError, match=r"context must be \(batch=2, length, kv_dim=16\)"):
        cross(x, torch.randn(2, 3, 32))
    with pytest.raises(ValueError, match=r"key_mask must be a bool tensor"):
        self_attn(x, key_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"key_mask shape \(2, 4\) != \(batch=2, keys=5\)"):
        self_attn(x, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x must be \(batch, length, dim=32\)"):
        self_attn(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"cache has 2 kv heads"):
        self_attn(x, cache=KVCache(batch_size=2, num_kv_heads=2, max_len=8, head_dim=8))
    with pytest.raises(UserError, match=r"head_dim \(7\) must be even"):
        RotaryEmbedding(head_dim=7)


def test_bias_patterns_build_exactly_the_named_biases_and_match_a_float64_reference():
    from mmtf.nn.attention import Attention
    attn = Attention(dim=16, num_heads=2, bias="qvo").eval()        # Whisper: no key bias
    names = {n for n, _ in attn.named_parameters()}
    assert names == {"to_q.weight", "to_q.bias", "to_kv.weight", "v_bias", "to_out.weight",
                     "to_out.bias"}
    with torch.no_grad():
        for p in (attn.to_q.bias, attn.v_bias, attn.to_out.bias):
            p.normal_()
    x = torch.randn(2, 5, 16)
    xd = x.double()
    wk, wv = attn.to_kv.weight.double().chunk(2)
    q = (xd @ attn.to_q.weight.double().T + attn.to_q.bias.double()).unflatten(-1, (2, 8))
    k = (xd @ wk.T).unflatten(-1, (2, 8))
    v = (xd @ wv.T + attn.v_bias.double()).unflatten(-1, (2, 8))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))                 # (b, h, n, d)
    out = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v
    out = out.transpose(1, 2).flatten(2) @ attn.to_out.weight.double().T + attn.to_out.bias.double()
    torch.testing.assert_close(attn(x).double(), out, atol=1e-5, rtol=1e-5)


def test_a_key_bias_changes_no_output():
    """Why leaving Whisper's key bias out is exact: softmax cancels a per-row constant."""
    from mmtf.nn.attention import Attention
    torch.manual_seed(0)
    plain = Attention(dim=16, num_heads=2, bias="qvo").eval()
    keyed = Attention(dim=16, num_heads=2, bias="qkvo").eval()
    with torch.no_grad():
        keyed.to_q.load_state_dict(plain.to_q.state_dict())
        keyed.to_out.load_state_dict(plain.to_out.state_dict())
        keyed.to_kv.weight.copy_(plain.to_kv.weight)
        k_bias = torch.randn(16)
        keyed.to_kv.bias.copy_(torch.cat([k_bias, plain.v_bias]))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(keyed(x), plain(x), atol=1e-5, rtol=1e-5)


def test_a_bad_bias_pattern_names_the_letters():
    from mmtf.errors import UserError
    from mmtf.nn.attention import Attention
    with pytest.raises(UserError, match=r"bias \('qx'\) must be .* 'q', 'k', 'v', 'o'"):
        Attention(dim=16, num_heads=2, bias="qx")


def test_explicit_head_dim_and_qk_norm_match_a_float64_loop():
    """Qwen3's shape: head_dim (12) not dim // heads (8), per-head RMSNorm of q and k before
    RoPE, grouped kv heads; against a hand-written float64 reference."""
    from mmtf.nn import RotaryEmbedding

    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=12)
    attn = Attention(dim=32, num_heads=4, num_kv_heads=2, head_dim=12, qk_norm=1e-6,
                     causal=True, rope=rope).double()
    with torch.no_grad():
        attn.q_norm.weight.normal_(1.0, 0.3)
        attn.k_norm.weight.normal_(1.0, 0.3)
    assert attn.to_q.out_features == 48 and attn.to_out.in_features == 48
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    q = attn.to_q(x).view(2, 6, 4, 12).transpose(1, 2)
    k, v = (t.view(2, 6, 2, 12).transpose(1, 2) for t in attn.to_kv(x).chunk(2, dim=-1))

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    q, k = rope(rms(q, attn.q_norm.weight), 0), rope(rms(k, attn.k_norm.weight), 0)
    k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) / 12 ** 0.5
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    ref = attn.to_out((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 48))
    torch.testing.assert_close(attn(x), ref)
