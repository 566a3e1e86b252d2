"""Packing on and off on the default model (experiment=audio_captioning's encoder and decoder,
composed by Hydra at their real size, random weights): greedy decoding gives the same tokens and
every step's logits agree within 1e-5. oneDNN's packed GEMM is not bit-equal to F.linear (its
sums run in another order), so this bound is what packing promises; it holds with AVX-512 and
AVX2 kernels alike (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mmtf.decoders import EncoderDecoder, GenerationConfig
from mmtf.nn.linear import Linear, can_pack
from mmtf.utils.config_dir import find_config_dir


@pytest.fixture(scope="module")
def default_model() -> tuple[EncoderDecoder, dict]:
    with initialize_config_dir(find_config_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=audio_captioning"])
    torch.manual_seed(0)
    model = EncoderDecoder(encoder=instantiate(cfg.model.encoder),
                           decoder=instantiate(cfg.model.decoder)).eval()
    return model, dict(cfg.model.generation)


@pytest.mark.skipif(not can_pack(torch.float32), reason="torch built without oneDNN")
def test_packing_keeps_the_default_models_greedy_tokens_and_logits(default_model):
    model, generation = default_model
    seconds = torch.tensor([4.0, 2.5, 3.2, 1.1])
    torch.manual_seed(1)
    audio = torch.randn(4, 4 * 16000) * 0.1                       # (b, samples) at 16 kHz
    lengths = (seconds * 16000).long()
    config = GenerationConfig(**generation, min_new_tokens=generation["max_new_tokens"])
    runs = {}
    for pack in (True, False):
        logits: list[torch.Tensor] = []
        packed: list[bool] = []

        def record(step, tokens, step_logits, logits=logits, packed=packed) -> None:
            logits.append(step_logits.clone())
            packed.append(all(m.packed_weight is not None for m in model.decoder.modules()
                              if isinstance(m, Linear)))

        out = model.generate(audio, lengths, config=config, pack_weights=pack, callback=record)
        assert all(packed) if pack else not any(packed)
        runs[pack] = out, torch.stack(logits)                    # (t, b, v)
    (on, on_logits), (off, off_logits) = runs[True], runs[False]
    assert on.tokens.shape[1] == config.max_new_tokens
    assert torch.equal(on.tokens, off.tokens)
    torch.testing.assert_close(on_logits, off_logits, atol=1e-5, rtol=0)
