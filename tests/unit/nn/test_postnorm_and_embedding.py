"""Post-norm blocks and the token embedding (BERT's pieces of the core) against float64 formulas
written from the modules' weights, and a hand-worked position example."""

from __future__ import annotations

import math

import pytest
import torch

from mmtf.errors import UserError
from mmtf.nn import TokenEmbedding, TransformerBlock, TransformerStack
from mmtf.nn.positions import LearnedPositions


def layer_norm_reference(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias, biased variance, in float64."""
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def bidirectional_attention_reference(h: torch.Tensor, attn, key_mask: torch.Tensor
                                      ) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, projections with biases, float64; h (b, n, c)."""
    b, n, c = h.shape
    heads, d = attn.num_heads, attn.head_dim
    w_kv, b_kv = attn.to_kv.weight.double(), attn.to_kv.bias.double()
    q = h @ attn.to_q.weight.double().T + attn.to_q.bias.double()
    k = h @ w_kv[:c].T + b_kv[:c]
    v = h @ w_kv[c:].T + b_kv[c:]
    q, k, v = (t.unflatten(-1, (heads, d)).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)                        # (b, h, n, n)
    scores = scores.masked_fill(~key_mask[:, None, None, :], -math.inf)
    out = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
    return out @ attn.to_out.weight.double().T + attn.to_out.bias.double()


def test_postnorm_block_matches_bert_layer_written_out():
    """BERT's layer: y = LN(x + Attn(x)); out = LN(y + W2 gelu(W1 y + b1) + b2), padding masked."""
    torch.manual_seed(0)
    block = TransformerBlock(dim=32, num_heads=4, block={"postnorm": True, "bias": True,
                                                         "norm_eps": 1e-12}).eval()
    with torch.no_grad():
        for norm in (block.norm_self, block.norm_mlp):
            norm.weight.normal_()
            norm.bias.normal_()
    x = torch.randn(2, 5, 32)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    y = layer_norm_reference(x.double() + bidirectional_attention_reference(
        x.double(), block.self_attn, mask), block.norm_self)
    mlp = block.mlp
    hidden = torch.nn.functional.gelu(y @ mlp.fc_in.weight.double().T + mlp.fc_in.bias.double())
    expected = layer_norm_reference(
        y + hidden @ mlp.fc_out.weight.double().T + mlp.fc_out.bias.double(), block.norm_mlp)
    torch.testing.assert_close(block(x, key_mask=mask).double(), expected, atol=1e-5, rtol=1e-5)
    assert block.norm_self.eps == 1e-12


def test_postnorm_differs_from_prenorm_with_the_same_weights():
    torch.manual_seed(0)
    pre = TransformerStack(depth=2, dim=16, num_heads=2, final_norm=False).eval()
    post = TransformerStack(depth=2, dim=16, num_heads=2, final_norm=False,
                            block={"postnorm": True}).eval()
    post.load_state_dict(pre.state_dict())                    # same names, same tensors
    x = torch.randn(1, 4, 16)
    assert not torch.allclose(pre(x), post(x), atol=1e-3)
    # a post-norm output is a LayerNorm output: zero mean, unit variance per token (gain 1)
    torch.testing.assert_close(post(x).mean(-1), torch.zeros(1, 4), atol=1e-5, rtol=0)


def test_token_embedding_sums_word_position_and_type_then_normalises():
    torch.manual_seed(0)
    emb = TokenEmbedding(vocab_size=10, dim=8, max_positions=6,
                         options={"type_vocab_size": 2, "embed_norm": True}, norm_eps=1e-12)
    ids = torch.tensor([[3, 1, 4]])
    types = torch.tensor([[0, 1, 1]])
    raw = (emb.tokens.weight[ids] + emb.positions.weight[:3][None]
           + emb.token_types.weight[types])
    torch.testing.assert_close(emb(ids, token_type_ids=types).double(),
                               layer_norm_reference(raw, emb.norm), atol=1e-6, rtol=1e-6)
    # no type ids: every token is type 0 (transformers' zero buffer)
    raw0 = emb.tokens.weight[ids] + emb.positions.weight[:3][None] + emb.token_types.weight[0]
    torch.testing.assert_close(emb(ids).double(), layer_norm_reference(raw0, emb.norm),
                               atol=1e-6, rtol=1e-6)


def test_roberta_positions_start_after_the_pad_row_and_count_real_tokens():
    """RoBERTa (padding_idx 1): real tokens sit at rows 2, 3, ...; a left-padded row
    [pad, pad, a, b] puts a at row 2 and b at row 3, as fairseq's make_positions
    (cumsum of the mask + padding_idx)."""
    emb = TokenEmbedding(vocab_size=10, dim=4, max_positions=8,
                         options={"position_offset": 2, "positions_from_mask": True})
    table = emb.positions.weight
    ids = torch.tensor([[5, 6, 7, 8], [1, 1, 5, 6]])
    mask = torch.tensor([[True] * 4, [False, False, True, True]])
    out = emb(ids, mask)
    tokens = emb.tokens.weight[ids]
    torch.testing.assert_close(out[0], tokens[0] + table[2:6])
    torch.testing.assert_close(out[1, 2:], tokens[1, 2:] + table[2:4])
    assert emb.max_tokens == 6                                    # 8 rows - offset 2
    with pytest.raises(UserError, match=r"7 tokens exceed the 6 positions"):
        emb(torch.zeros(1, 7, dtype=torch.long))


def test_learned_positions_per_row():
    pos = LearnedPositions(6, 3)
    rows = torch.tensor([[0, 1, 2], [0, 0, 1]])
    torch.testing.assert_close(pos(3, positions=rows), pos.weight[rows])


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(options={"position_offset": 4}, max_positions=4), r"position_offset \(4\) leaves no row"),
    (dict(options={"type_vocab_size": -1}), r"type_vocab_size \(-1\)"),
])
def test_bad_embedding_options_are_user_errors(kwargs, match):
    with pytest.raises(UserError, match=match):
        TokenEmbedding(vocab_size=10, dim=4, **kwargs)


def test_type_ids_without_a_type_table_are_refused():
    emb = TokenEmbedding(vocab_size=10, dim=4)
    with pytest.raises(UserError, match=r"no token-type embeddings"):
        emb(torch.zeros(1, 2, dtype=torch.long), token_type_ids=torch.zeros(1, 2, dtype=torch.long))
