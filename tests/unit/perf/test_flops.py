"""The model-FLOP count of a training step against hand counts of tiny models."""

from __future__ import annotations

import torch
from torch import nn

from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.encoders import AudioEncoder
from mmtf.nn import Attention
from mmtf.nn.kv_cache import KVCache
from mmtf.perf.flops import FlopCounter
from tests.unit.presets import flat


def test_linear_and_conv_by_hand():
    model = nn.Sequential(nn.Conv1d(4, 6, kernel_size=3, stride=2, padding=1), nn.Flatten(),
                          nn.Linear(6 * 5, 7))
    with FlopCounter(model) as counter:
        model(torch.randn(2, 4, 10))                 # conv: (2, 6, 5) outputs; linear: 2 rows
    conv = 2 * (4 * 3) * (2 * 6 * 5)
    linear = 2 * 30 * 7 * 2
    assert counter.forward_flops == conv + linear
    assert counter.training_flops == 3 * (conv + linear)


def test_hooks_are_removed_after_the_block():
    model = nn.Linear(3, 3)
    with FlopCounter(model) as counter:
        model(torch.randn(1, 3))
    model(torch.randn(1, 3))
    assert counter.forward_flops == 2 * 3 * 3
    assert not model._forward_hooks


def test_attention_pairs_causal_bidirectional_cross_and_cached():
    b, n, m, dim, heads = 2, 5, 7, 16, 4
    proj = lambda rows, kv_rows, kv_dim=dim: 2 * dim * dim * rows * 2 + 2 * kv_dim * 2 * dim * kv_rows  # noqa: E731
    causal = Attention(dim=dim, num_heads=heads, causal=True)
    with FlopCounter(causal) as c:
        causal(torch.randn(b, n, dim))
    assert c.forward_flops == proj(b * n, b * n) + 4 * b * dim * (n * (n + 1) // 2)
    bidir = Attention(dim=dim, num_heads=heads)
    with FlopCounter(bidir) as c:
        bidir(torch.randn(b, n, dim), key_mask=torch.ones(b, n, dtype=torch.bool))
    assert c.forward_flops == proj(b * n, b * n) + 4 * b * dim * n * n
    cross = Attention(dim=dim, num_heads=heads, kv_dim=8)
    with FlopCounter(cross) as c:
        cross(torch.randn(b, n, dim), torch.randn(b, m, 8))
    assert c.forward_flops == proj(b * n, b * m, kv_dim=8) + 4 * b * dim * n * m
    # One new token on 3 cached ones: 4 keys.
    cache = KVCache(batch_size=b, num_kv_heads=heads, head_dim=dim // heads, max_len=8)
    causal(torch.randn(b, 3, dim), cache=cache)
    with FlopCounter(causal) as c:
        causal(torch.randn(b, 1, dim), cache=cache)
    assert c.forward_flops == proj(b, b) + 4 * b * dim * 4


def test_tiny_captioner_step_by_hand():
    """A whole encoder-decoder: every matmul of the forward pass counted from the config."""
    c, f, hop, vocab, depth = 32, 16, 160, 50, 1
    encoder = flat(AudioEncoder, dim=c, depth=depth, num_heads=4, n_mels=f, hop_length=hop,
                           mlp_ratio=2.0)
    decoder = flat(TextDecoder, vocab_size=vocab, dim=c, depth=depth, num_heads=4, context_dim=c,
                          mlp_ratio=2.0)
    model = EncoderDecoder(encoder=encoder, decoder=decoder)
    b, samples, n = 3, 16000, 6                      # 1 s clips; 6 target tokens incl. bos/eos
    tokens = torch.tensor([[1, 5, 6, 7, 8, 2]] * b)
    with FlopCounter(model) as counter:
        model(torch.randn(b, samples), torch.full((b,), samples), tokens)
    t = samples // hop + 1                           # 101 frames
    t1 = (t - 1) // 2 + 1                            # 51 after conv1
    s = (t1 - 1) // 2 + 1                            # 26 memory positions
    nd = n - 1                                       # the decoder reads tokens[:, :-1]
    stem = b * (2 * f * 3 * c * t1 + 2 * c * 3 * c * s)           # conv1, conv2 weights
    linear = 4 * c * c + 2 * c * (2 * c)             # q, k, v, out; MLP c -> 2c -> c
    enc = 2 * b * s * linear + 4 * b * c * s * s     # + bidirectional scores and sums
    self_attn = 2 * b * nd * 4 * c * c + 4 * b * c * nd * (nd + 1) // 2
    cross = 2 * b * nd * 2 * c * c + 2 * b * s * 2 * c * c + 4 * b * c * nd * s
    mlp = 2 * b * nd * 2 * c * (2 * c)
    head = 2 * b * nd * c * vocab
    expected = stem + enc + self_attn + cross + mlp + head
    assert counter.forward_flops == expected
    assert counter.training_flops == 3 * expected
