"""Activation checkpointing of a TransformerStack (``activation_checkpointing=True``): the same
gradients as the plain path (dropout masks replayed from the saved RNG state), recomputation only
where autograd records, and the switch on every part and pretrained builder."""

from __future__ import annotations

import pytest
import torch

from mmtf.decoders import TextDecoder
from mmtf.encoders import AudioEncoder, VisionEncoder
from mmtf.errors import ConfigError
from mmtf.nn import TransformerStack
from mmtf.pretrained.clip import clip_vision_encoder
from mmtf.pretrained.gpt2 import gpt2_decoder
from mmtf.pretrained.vit import vit_encoder
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder
from mmtf.tasks.fsdp import FSDP2Strategy
from tests.unit.presets import flat

DIM, CTX = 16, 8


def _stack(dropout: float, checkpointing: bool) -> TransformerStack:
    torch.manual_seed(0)                      # the same weights for both settings
    return TransformerStack(depth=3, dim=DIM, num_heads=2, causal=True, cross_dim=CTX, rope=True,
                            block={"dropout": dropout, "attn_dropout": dropout},
                            activation_checkpointing=checkpointing).train()


def _grads(stack: TransformerStack, seed: int = 1) -> list[torch.Tensor]:
    """Gradients of every parameter and of both inputs, under a fixed dropout seed."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, DIM, generator=g, requires_grad=True)
    context = torch.randn(2, 4, CTX, generator=g, requires_grad=True)
    key_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    context_mask = torch.tensor([[True] * 4, [True] * 2 + [False] * 2])
    torch.manual_seed(seed)
    out = stack(x, key_mask=key_mask, context=context, context_mask=context_mask)
    (out * torch.linspace(-1, 1, DIM)).pow(2).sum().backward()
    return [p.grad for p in stack.parameters()] + [x.grad, context.grad]


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_checkpointed_gradients_equal_the_plain_ones(dropout):
    plain, recomputed = _grads(_stack(dropout, False)), _grads(_stack(dropout, True))
    assert len(plain) == len(recomputed)
    for p, r in zip(plain, recomputed, strict=True):
        torch.testing.assert_close(r, p, rtol=0, atol=1e-6)
    if dropout:   # the masks matter: another seed gives other gradients, so the test can fail
        other = _grads(_stack(dropout, False), seed=3)
        assert not torch.allclose(other[0], plain[0], atol=1e-4)


def _count_block_calls(stack: TransformerStack) -> list[bool]:
    calls: list[bool] = []
    for block in stack.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    return calls


def test_blocks_rerun_in_backward_only_when_autograd_records():
    stack = _stack(0.0, True)
    calls = _count_block_calls(stack)
    x, context = torch.randn(1, 3, DIM), torch.randn(1, 2, CTX)
    stack(x, context=context).sum().backward()
    assert calls == [True] * 3 + [True] * 3          # forward, then each block again in backward
    calls.clear()
    with torch.no_grad():
        stack(x, context=context)
    assert calls == [False] * 3
    calls.clear()
    stack(x, context=context, attention_layers={"cross": [0]})[0].sum().backward()
    assert len(calls) == 3                           # maps asked for: the plain path


def test_kv_cache_decoding_is_unchanged_and_never_recomputes():
    torch.manual_seed(0)
    kw = dict(vocab_size=20, dim=DIM, depth=2, num_heads=2, context_dim=CTX, dropout=0.1)
    plain = flat(TextDecoder, **kw).eval()
    checkpointed = flat(TextDecoder, **kw, activation_checkpointing=True).eval()
    checkpointed.load_state_dict(plain.state_dict())
    memory, tokens = torch.randn(2, 4, CTX), torch.randint(0, 20, (2, 5))
    calls = _count_block_calls(checkpointed.stack)
    steps = []
    for decoder in (plain, checkpointed):
        cache = decoder.make_cache(batch_size=2, context_len=4)
        # grad on: a cache is written once per step, so a cached step must never be recomputed
        steps.append(torch.cat([decoder.step(tokens[:, i:i + 1], cache, memory=memory)
                                for i in range(5)], 1))
    assert len(calls) == 2 * 5
    torch.testing.assert_close(steps[1], steps[0], rtol=0, atol=0)
    torch.testing.assert_close(checkpointed(tokens, memory), plain(tokens, memory))


def test_every_part_and_pretrained_builder_takes_the_key():
    tiny = dict(dim=DIM, depth=1, num_heads=2)
    parts = [
        flat(AudioEncoder, **tiny, n_mels=8, activation_checkpointing=True),
        flat(VisionEncoder, **tiny, image_size=16, activation_checkpointing=True),
        flat(TextDecoder, **tiny, vocab_size=10, context_dim=DIM, activation_checkpointing=True),
        whisper_encoder(**tiny, mlp_ratio=4.0, n_mels=8, max_seconds=30.0,
                        activation_checkpointing=True),
        whisper_decoder(**tiny, vocab_size=10, mlp_ratio=4.0, context_dim=DIM, max_len=8,
                        pad_id=0, activation_checkpointing=True),
        vit_encoder(**tiny, image_size=16, patch_size=8, activation_checkpointing=True),
        clip_vision_encoder(**tiny, image_size=16, patch_size=8, activation_checkpointing=True),
        gpt2_decoder(**tiny, vocab_size=10, context_dim=DIM, max_len=8, pad_id=0,
                     activation_checkpointing=True),
    ]
    assert [p.stack.activation_checkpointing for p in parts] == [True] * len(parts)
    assert flat(AudioEncoder, **tiny, n_mels=8).stack.activation_checkpointing is False


def test_an_exported_encoder_loads_with_checkpointing_switched_on(tmp_path):
    from mmtf.hub import write_export

    encoder = flat(AudioEncoder, dim=DIM, depth=1, num_heads=2, n_mels=8)
    write_export(tmp_path / "enc", encoder.state_dict(),
                 {"_target_": "mmtf.encoders.AudioEncoder", **encoder.config},
                 metadata={"part": "encoder"})
    loaded = flat(AudioEncoder, dim=DIM, depth=1, num_heads=2, n_mels=8, activation_checkpointing=True,
                          pretrained=tmp_path / "enc")
    assert loaded.stack.activation_checkpointing
    assert torch.equal(loaded.stack.blocks[0].mlp.fc_in.weight,
                       encoder.stack.blocks[0].mlp.fc_in.weight)


def test_the_old_fsdp_switch_names_the_parts_keys():
    with pytest.raises(ConfigError, match=r"trainer.strategy.activation_checkpointing \(True\) is "
                       r"no longer an FSDP option: set model.encoder.activation_checkpointing=true "
                       r"and/or model.decoder.activation_checkpointing=true"):
        FSDP2Strategy(activation_checkpointing=True)
