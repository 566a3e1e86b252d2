"""Attention pooling against a float64 loop over the formula: a learned query, layer-normed
keys and values, softmax over the valid positions only."""

from __future__ import annotations

import torch

from mmtf.nn.pooling import AttentionPool


def _reference(pool: AttentionPool, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """float64, one item and one head at a time, from the module's weights."""
    attn, h = pool.attn, pool.attn.num_heads
    w = {k: v.double() for k, v in pool.state_dict().items()}
    c = memory.shape[-1]
    d = c // h
    out = []
    for x, valid in zip(memory.double(), mask):
        x = x[valid]                                                  # (s_valid, c)
        mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        x = (x - mu) / torch.sqrt(var + pool.norm.eps) * w["norm.weight"] + w["norm.bias"]
        q = w["query"][0, 0] @ w["attn.to_q.weight"].T + w["attn.to_q.bias"]       # (c,)
        kv = x @ w["attn.to_kv.weight"].T + w["attn.to_kv.bias"]                    # (s, 2c)
        k, v = kv[:, :c], kv[:, c:]
        heads = []
        for j in range(h):
            part = slice(j * d, (j + 1) * d)
            p = torch.softmax(k[:, part] @ q[part] / d ** 0.5, dim=0)               # (s,)
            heads.append(p @ v[:, part])                                            # (d,)
        out.append(torch.cat(heads) @ w["attn.to_out.weight"].T + w["attn.to_out.bias"])
    assert attn.head_dim == d
    return torch.stack(out)


def test_attention_pool_matches_a_float64_loop_and_ignores_padding():
    torch.manual_seed(0)
    pool = AttentionPool(dim=16, num_heads=4).eval()
    with torch.no_grad():                       # a query away from 0, so the weights differ
        pool.query.normal_()
    memory = torch.randn(3, 7, 16)
    mask = torch.arange(7)[None, :] < torch.tensor([7, 4, 1])[:, None]
    got = pool(memory, mask)
    torch.testing.assert_close(got.double(), _reference(pool, memory, mask), rtol=1e-5,
                               atol=1e-5)
    poisoned = memory.masked_fill(~mask[..., None], 1e4)   # padding never reaches the result
    torch.testing.assert_close(pool(poisoned, mask), got)
