"""EncoderDecoder: teacher-forced loss against independent references, gradients, wiring errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.errors import UserError
from tests.unit.decoders.conftest import DIM, IN_DIM, VOCAB, make_model
from tests.unit.decoders.stubs import BOS, EOS, PAD, StubEncoder

CONF = Path(__file__).resolve().parents[3] / "conf" / "model" / "decoder"


def targets() -> torch.Tensor:
    """[bos, w.., eos, pad..] rows of different lengths; one row fills the width (no pad)."""
    return torch.tensor([[BOS, 5, 6, 7, EOS, PAD, PAD],
                         [BOS, 8, EOS, PAD, PAD, PAD, PAD],
                         [BOS, 9, 10, 11, 12, 13, EOS]])


def manual_loss(logits: torch.Tensor, tgt: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Label-smoothed NLL written out: mean over non-pad targets of
    (1 - eps) * -log p(target) + eps * mean_v(-log p(v))."""
    logp = logits.double().log_softmax(-1)
    total, count = 0.0, 0
    for b in range(tgt.shape[0]):
        for i in range(tgt.shape[1]):
            if tgt[b, i] == PAD:
                continue
            total += (1 - eps) * -logp[b, i, tgt[b, i]] + eps * -logp[b, i].mean()
            count += 1
    return total / count


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_loss_matches_references(batch, eps):
    model = make_model(label_smoothing=eps)
    x, lengths = batch
    tokens = targets()
    out = model(x, lengths, tokens)
    assert out.logits.shape == (3, 6, VOCAB)
    memory, mask = model.encode(x, lengths)
    logits = model.decoder(tokens[:, :-1], memory, mask)      # independent forward
    torch.testing.assert_close(out.logits, logits)
    ref = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1),
                          ignore_index=PAD, label_smoothing=eps)
    torch.testing.assert_close(out.loss, ref)
    # A float32 loss against float64: the tolerance of float32, not float64's 1e-7, which the
    # last bit of a CPU kernel's rounding can exceed.
    torch.testing.assert_close(out.loss.double(), manual_loss(logits, tokens[:, 1:], eps),
                               rtol=1e-6, atol=1e-6)


def test_several_captions_per_input_share_one_encoder_pass(batch):
    """k caption rows per input (item-major) score exactly like the inputs repeated k times."""
    model = make_model(label_smoothing=0.1)
    x, lengths = batch                                           # 3 inputs
    tokens = torch.cat([targets(), targets().flip(0)])           # 6 rows of 3 lengths
    tokens = tokens[torch.tensor([0, 3, 1, 4, 2, 5])]            # item-major: 2 per input
    out = model(x, lengths, tokens)
    reference = model(x.repeat_interleave(2, dim=0), lengths.repeat_interleave(2), tokens)
    assert out.logits.shape == (6, 6, VOCAB)
    torch.testing.assert_close(out.logits, reference.logits)
    torch.testing.assert_close(out.loss, reference.loss)
    with pytest.raises(ValueError, match=r"5 caption rows for 3 inputs"):
        model(x, lengths, tokens[:5])


def test_loss_ignores_everything_after_eos(batch):
    model = make_model()
    x, lengths = batch
    tokens = targets()
    ref = model(x, lengths, tokens)
    garbage = tokens.clone()
    garbage[0, 5:] = torch.tensor([17, 18])                    # replaces the pads after eos
    garbage[1, 3:] = torch.tensor([3, 21, 22, 2])              # unk, words and a second eos
    out = model(x, lengths, garbage)
    torch.testing.assert_close(out.loss, ref.loss)
    torch.testing.assert_close(out.logits[0, :4], ref.logits[0, :4])
    # ... but a scored target does change it.
    changed = tokens.clone()
    changed[1, 1] = 20
    assert not torch.allclose(model(x, lengths, changed).loss, ref.loss)


def test_every_parameter_gets_a_gradient(batch):
    model = make_model(tie_embeddings=False, label_smoothing=0.1).train()
    x, lengths = batch
    model(x, lengths, targets()).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_dim_mismatch_message():
    enc = StubEncoder(in_dim=IN_DIM, dim=96)
    dec = TextDecoder(vocab_size=VOCAB, dim=32, depth=1, num_heads=4, context_dim=64)
    msg = (r"EncoderDecoder: model.encoder.dim \(96\) != model.decoder.context_dim \(64\); "
           r"set model.decoder.context_dim: \$\{model.encoder.dim\}\.")
    with pytest.raises(UserError, match=msg):
        EncoderDecoder(encoder=enc, decoder=dec)


def test_special_id_errors():
    enc = StubEncoder(in_dim=IN_DIM, dim=DIM)
    dec = TextDecoder(vocab_size=VOCAB, dim=DIM, depth=1, num_heads=4, context_dim=DIM)
    with pytest.raises(UserError, match=r"eos_id \(40\) must be in \[0, "
                                        r"model.decoder.vocab_size=40\)"):
        EncoderDecoder(encoder=enc, decoder=dec, eos_id=40)
    with pytest.raises(UserError, match=r"pad_id \(5\) != model.decoder.pad_id \(0\)"):
        EncoderDecoder(encoder=enc, decoder=dec, pad_id=5)
    with pytest.raises(UserError, match=r"label_smoothing \(1.0\) must be in \[0, 1\)"):
        EncoderDecoder(encoder=enc, decoder=dec, label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"tokens must be \(batch, length >= 2\)"):
        EncoderDecoder(encoder=enc, decoder=dec)(torch.randn(1, 3, IN_DIM), None,
                                                 torch.ones(1, 1, dtype=torch.long))


def model_cfg(encoder_dim: int, context_dim: str | int = "${model.encoder.dim}"):
    return OmegaConf.create({"model": {
        "_target_": "mmtf.decoders.EncoderDecoder",
        "label_smoothing": 0.1,
        "encoder": {"_target_": "tests.unit.decoders.stubs.StubEncoder", "in_dim": IN_DIM,
                    "dim": encoder_dim},
        "decoder": OmegaConf.merge(OmegaConf.load(CONF / "text_tiny.yaml"),
                                   {"context_dim": context_dim}),
    }})


def test_hydra_recursive_instantiation(batch):
    model = instantiate(model_cfg(48).model)
    assert isinstance(model, EncoderDecoder) and isinstance(model.decoder, TextDecoder)
    assert model.decoder.context_dim == 48 and model.label_smoothing == 0.1
    x, lengths = batch
    tokens = targets()
    assert model(x, lengths, tokens).logits.shape == (3, 6, model.decoder.vocab_size)
    with pytest.raises(InstantiationException, match=r"model.encoder.dim \(48\) != "
                                                     r"model.decoder.context_dim \(32\)"):
        instantiate(model_cfg(48, context_dim=32).model)
