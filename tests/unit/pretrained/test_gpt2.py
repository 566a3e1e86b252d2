"""GPT-2 as mmtf's TextDecoder with cross-attention: the same logits as ``GPT2LMHeadModel``
(add_cross_attention=True) under teacher forcing given the same encoder states (float32,
<= 1e-4), new cross-attention layers when the folder has none, the export direction back to
the Hugging Face layout, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch

from mmtf.errors import UserError
from mmtf.pretrained.gpt2 import gpt2_decoder, hf_config, hf_state_dict
from tests.unit.presets import flat

from .vision_folders import perturb

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=101, n_positions=40, n_embd=64, n_layer=2, n_head=4, bos_token_id=100,
            eos_token_id=100)                   # <|endoftext|>: the last id, as in GPT-2
DECODER = dict(vocab_size=101, dim=64, depth=2, num_heads=4, context_dim=64, max_len=40,
               dropout=0.0, attn_dropout=0.0, pad_id=100)


def save_gpt2(path, *, cross=True, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**{**TINY, **overrides}, add_cross_attention=cross)
    model = perturb(GPT2LMHeadModel(config).eval())
    model.save_pretrained(path)
    return model


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 100, (3, 9), generator=g)
    memory = torch.randn(3, 7, 64, generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False                                   # a shorter memory in row 1
    return tokens, memory, mask


def _hf_logits(model, tokens, memory, mask):
    with torch.no_grad():
        return model(input_ids=tokens, encoder_hidden_states=memory,
                     encoder_attention_mask=mask.long()).logits


def test_teacher_forced_logits_match_transformers(tmp_path):
    reference = save_gpt2(tmp_path / "gpt2")
    decoder = gpt2_decoder(**DECODER, pretrained=tmp_path / "gpt2").eval()
    tokens, memory, mask = _inputs()
    with torch.no_grad():
        got = decoder(tokens, memory, mask)
    torch.testing.assert_close(got, _hf_logits(reference, tokens, memory, mask), atol=1e-4,
                               rtol=0)


def test_a_gpt2_without_cross_attention_gets_new_layers(tmp_path):
    # What VisionEncoderDecoderModel does: GPT-2's weights, new cross-attention layers with
    # GPT-2's initialisation. Copy them into HF's freshly built ones and compare.
    from transformers import GPT2LMHeadModel

    save_gpt2(tmp_path / "gpt2", cross=False)
    decoder = gpt2_decoder(**DECODER, pretrained=tmp_path / "gpt2").eval()
    block = decoder.stack.blocks[1]
    assert torch.equal(block.cross_attn.to_q.bias, torch.zeros(64))
    assert torch.equal(block.norm_cross.weight, torch.ones(64))
    assert abs(block.cross_attn.to_kv.weight.std().item() - 0.02) < 0.003
    assert abs(block.cross_attn.to_out.weight.std().item() - 0.01) < 0.002   # 0.02 / sqrt(4)
    reference = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2",
                                                add_cross_attention=True).eval()
    state = hf_state_dict(decoder)
    cross = {k: v for k, v in state.items() if "cross" in k}
    assert len(cross) == 2 * 4 * 2                       # 4 layers x weight/bias x 2 blocks
    reference.load_state_dict(cross, strict=False)
    tokens, memory, mask = _inputs(1)
    with torch.no_grad():
        got = decoder(tokens, memory, mask)
    torch.testing.assert_close(got, _hf_logits(reference, tokens, memory, mask), atol=1e-4,
                               rtol=0)


def test_export_hf_writes_what_transformers_loads(tmp_path):
    # A captioner's GPT-2 decoder and tokenizer written back (format=hf's family writer):
    # transformers reads the same logits and the same token ids.
    from types import SimpleNamespace

    from transformers import AutoTokenizer, GPT2LMHeadModel

    from mmtf.pretrained.gpt2 import export_hf
    from mmtf.text import PretrainedTokenizer

    from .tiny_hf import ENDOFTEXT, write_tokenizer

    backend = write_tokenizer(tmp_path / "gpt2", family="gpt2")
    eos = backend.token_to_id(ENDOFTEXT)
    save_gpt2(tmp_path / "gpt2", vocab_size=backend.get_vocab_size(), bos_token_id=eos,
              eos_token_id=eos)
    unset = dict.fromkeys(("vocab_size", "dim", "depth", "num_heads", "max_len", "pad_id"))
    decoder = gpt2_decoder(**{**DECODER, **unset}, pretrained=tmp_path / "gpt2").eval()
    tokenizer = PretrainedTokenizer.from_folder(tmp_path / "gpt2")
    task = SimpleNamespace(model=SimpleNamespace(encoder=None, decoder=decoder),
                           tokenizer=tokenizer)            # no ViT: the decoder alone
    export_hf(task, tmp_path / "out")
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    assert reloaded.config.add_cross_attention and reloaded.config.eos_token_id == eos
    tokens, memory, mask = _inputs(2)
    with torch.no_grad():
        got = decoder(tokens, memory, mask)
    torch.testing.assert_close(got, _hf_logits(reloaded, tokens, memory, mask), atol=1e-4,
                               rtol=0)
    theirs = AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "a dog barks near the busy road"
    assert theirs(text)["input_ids"] == tokenizer.encode(text, add_special=False)
    assert theirs.eos_token_id == eos


def test_export_hf_refuses_what_gpt2_cannot_hold(tmp_path):
    save_gpt2(tmp_path / "gpt2")
    decoder = gpt2_decoder(**{**DECODER, "context_dim": 48}, pretrained=None)
    with pytest.raises(UserError, match=r"reads encoder states of its own width n_embd=64, but "
                                        r"context_dim=48"):
        hf_config(decoder, bos_id=100, eos_id=100)


def test_untied_head_and_a_gpt2model_folder(tmp_path):
    from transformers import GPT2Config, GPT2Model

    save_gpt2(tmp_path / "untied", tie_word_embeddings=False)
    decoder = gpt2_decoder(**DECODER, tie_embeddings=False, pretrained=tmp_path / "untied")
    assert decoder.lm_head.weight.data_ptr() != decoder.embed.weight.data_ptr()
    body = perturb(GPT2Model(GPT2Config(**TINY)))                 # no "transformer." prefix
    body.save_pretrained(tmp_path / "body")
    decoder = gpt2_decoder(**DECODER, pretrained=tmp_path / "body")
    assert torch.equal(decoder.embed.weight, body.wte.weight)
    assert torch.equal(decoder.lm_head.weight, body.wte.weight)


def test_settings_and_widths_that_disagree_are_named(tmp_path):
    save_gpt2(tmp_path / "gpt2")
    with pytest.raises(UserError, match=r"model\.decoder does not match .*gpt2/config\.json: "
                                        r"dim=32, but it has n_embd=64 \(dim=64\); set "
                                        r"model\.decoder\.dim=64"):
        gpt2_decoder(**{**DECODER, "dim": 32, "context_dim": 32}, pretrained=tmp_path / "gpt2")
    # The folder's cross-attention reads 64-wide encoder states; this model's encoder is 48.
    with pytest.raises(UserError, match=r"crossattention\.c_attn\.weight' in .* has shape "
                                        r"\(128, 64\) but mmtf's .*to_kv\.weight' has "
                                        r"\(128, 48\)"):
        gpt2_decoder(**{**DECODER, "context_dim": 48}, pretrained=tmp_path / "gpt2")
    with pytest.raises(UserError, match=r"scale_attn_by_inverse_layer_idx=True"):
        save_gpt2(tmp_path / "scaled", scale_attn_by_inverse_layer_idx=True)
        gpt2_decoder(**DECODER, pretrained=tmp_path / "scaled")


def test_missing_files_and_other_architectures(tmp_path):
    with pytest.raises(UserError, match=r"weights file .*nothing/weights\.safetensors"):
        gpt2_decoder(**DECODER, pretrained=tmp_path / "nothing")
    from .vision_folders import save_vit

    save_vit(tmp_path / "vit")
    with pytest.raises(UserError, match=r"model_type='vit', but this loader reads"):
        gpt2_decoder(**DECODER, pretrained=tmp_path / "vit")


def test_a_decoder_export_loads_back(tmp_path):
    # What python -m mmtf.export part=decoder writes, read by load_exported (frozen) and by
    # model.decoder.pretrained.
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    from mmtf.export import load_exported

    source = gpt2_decoder(**DECODER)
    (tmp_path / "export").mkdir()
    save_file({k: v.clone() for k, v in source.state_dict().items()},
              str(tmp_path / "export" / "weights.safetensors"))
    (tmp_path / "export" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(
        {"_target_": "mmtf.pretrained.gpt2.gpt2_decoder", **DECODER, "pretrained": None})))
    for loaded in (gpt2_decoder(**DECODER, pretrained=tmp_path / "export"),
                   load_exported(tmp_path / "export", freeze=True)):
        assert all(torch.equal(loaded.state_dict()[k], v)
                   for k, v in source.state_dict().items())
    assert not any(p.requires_grad for p in loaded.parameters()) and not loaded.training


def test_a_vision_encoder_decoder_folder_loads_both_sides(tmp_path):
    # A whole ViT + GPT-2 captioner (nlpconnect/vit-gpt2-image-captioning's layout): the
    # encoder reads encoder.*, the decoder decoder.* with its trained cross-attention.
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTModel,
    )

    from mmtf.pretrained.vit import vit_encoder

    from .vision_folders import TINY as TINY_VIT
    from .vision_folders import VIT_ENCODER

    captioner = VisionEncoderDecoderModel(
        encoder=ViTModel(ViTConfig(**TINY_VIT), add_pooling_layer=False),
        decoder=GPT2LMHeadModel(GPT2Config(**TINY, add_cross_attention=True)))
    captioner = perturb(captioner.eval())
    captioner.save_pretrained(tmp_path / "ved")
    encoder = vit_encoder(**VIT_ENCODER, pretrained=tmp_path / "ved").eval()
    decoder = gpt2_decoder(**DECODER, pretrained=tmp_path / "ved").eval()
    images = torch.randn(2, 3, 32, 32)
    tokens = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        expected = captioner(pixel_values=images, decoder_input_ids=tokens).logits
        got = decoder(tokens, encoder(images).memory)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_null_settings_are_read_from_config_json(tmp_path):
    save_gpt2(tmp_path / "gpt2", n_inner=96, layer_norm_epsilon=1e-6)
    unset = dict.fromkeys(("vocab_size", "dim", "depth", "num_heads", "max_len", "mlp_ratio",
                           "mlp", "norm_eps", "pad_id", "tie_embeddings"))
    decoder = gpt2_decoder(context_dim=64, **unset, pretrained=tmp_path / "gpt2")
    block = decoder.stack.blocks[0]
    assert (decoder.vocab_size, decoder.dim, decoder.depth, decoder.max_len, decoder.pad_id) == (
        101, 64, 2, 40, 100)
    assert block.self_attn.num_heads == 4 and block.mlp.fc_in.out_features == 96
    assert block.norm_self.eps == 1e-6 and block.mlp.kind == "gelu_tanh"
    with pytest.raises(UserError, match=r"model\.decoder\.depth is null.*no Hugging Face"):
        gpt2_decoder(**{**DECODER, "depth": None})


@pytest.mark.parametrize("family", ["vit", "clip"])
def test_export_hf_with_a_vision_encoder_is_a_vision_encoder_decoder_folder(tmp_path, family):
    from types import SimpleNamespace

    from transformers import VisionEncoderDecoderModel

    from mmtf.pretrained.clip import clip_vision_encoder
    from mmtf.pretrained.vision_encoder_decoder import export_hf
    from mmtf.pretrained.vit import vit_encoder
    from mmtf.text import PretrainedTokenizer

    from .tiny_hf import ENDOFTEXT, write_tokenizer
    from .vision_folders import CLIP_ENCODER, VIT_ENCODER, save_clip_vision, save_vit

    backend = write_tokenizer(tmp_path / "gpt2", family="gpt2")
    eos = backend.token_to_id(ENDOFTEXT)
    save_gpt2(tmp_path / "gpt2", cross=False, vocab_size=backend.get_vocab_size(),
              bos_token_id=eos, eos_token_id=eos)
    save, build, settings = {"vit": (save_vit, vit_encoder, VIT_ENCODER),
                             "clip": (save_clip_vision, clip_vision_encoder, CLIP_ENCODER)}[family]
    save(tmp_path / family)
    encoder = build(**settings, pretrained=tmp_path / family).eval()
    unset = dict.fromkeys(("vocab_size", "dim", "depth", "num_heads", "max_len", "pad_id"))
    decoder = gpt2_decoder(**{**DECODER, **unset}, pretrained=tmp_path / "gpt2").eval()
    model = SimpleNamespace(encoder=encoder, decoder=decoder)
    export_hf(SimpleNamespace(model=model, tokenizer=PretrainedTokenizer.from_folder(
        tmp_path / "gpt2")), tmp_path / "out")
    reloaded = VisionEncoderDecoderModel.from_pretrained(tmp_path / "out").eval()
    assert reloaded.config.decoder_start_token_id == eos
    assert reloaded.config.encoder.model_type == {"vit": "vit", "clip": "clip_vision_model"}[family]
    images = torch.randn(2, 3, 32, 32)
    tokens = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        expected = reloaded(pixel_values=images, decoder_input_ids=tokens).logits
        torch.testing.assert_close(decoder(tokens, encoder(images).memory), expected,
                                   atol=1e-4, rtol=0)


def test_under_lora_the_new_cross_attention_trains_in_full(tmp_path):
    """The fresh cross-attention is new to the model (no original): it trains with the adapters,
    as PEFT's modules_to_save would; GPT-2's own layers keep their weights frozen."""
    from functools import partial

    from mmtf.encoders import AudioEncoder
    from mmtf.nn.lora import new_parameter_names
    from mmtf.tasks import CaptioningTask

    save_gpt2(tmp_path / "gpt2", cross=False)
    save_gpt2(tmp_path / "gpt2_cross", cross=True)
    assert not new_parameter_names(gpt2_decoder(**DECODER, pretrained=tmp_path / "gpt2_cross"))
    decoder = gpt2_decoder(**DECODER, pretrained=tmp_path / "gpt2")
    task = CaptioningTask(encoder=flat(AudioEncoder, dim=64, depth=1, num_heads=4, n_mels=16),
                          decoder=decoder, optimizer=partial(torch.optim.AdamW, lr=1e-3),
                          lora={"r": 2, "alpha": 4, "parts": ["decoder"], "targets": ["q"]})
    trainable = {n.removeprefix("model.decoder.") for n, p in task.model.decoder.named_parameters(
        prefix="model.decoder") if p.requires_grad}
    cross = {n for n, _ in decoder.named_parameters()
             if (".cross_attn." in n or ".norm_cross." in n) and ".lora_" not in n}
    assert len(cross) == 2 * (3 * 2 + 2)                 # 2 blocks: 3 projections + norm
    adapters = {f"stack.blocks.{i}.{a}.to_q.lora_{m}.q" for i in range(2)
                for a in ("self_attn", "cross_attn") for m in "AB"}
    assert trainable == cross | adapters
