"""PEFT adapter folders for every imported family, against peft itself: GPT-2 (whose fused
``c_attn`` holds mmtf's q, k and v: one adapter of rank n r with block-diagonal B), ViT (whose
modules the installed transformers renames), CLIP and the ViT + GPT-2
``VisionEncoderDecoderModel``. mmtf's ``format=peft`` folder loaded by
``PeftModel.from_pretrained`` on the transformers base gives mmtf's outputs; an adapter made by
peft (random A and B) loads into mmtf with peft's outputs; a folder for another base is a
one-line error naming it and the shapes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from mmtf.errors import UserError
from mmtf.nn.lora import LoRAConfig, add_lora, lora_layers
from mmtf.pretrained import export_peft
from mmtf.pretrained.clip import clip_vision_encoder
from mmtf.pretrained.gpt2 import gpt2_decoder
from mmtf.pretrained.peft import load_peft_adapter
from mmtf.pretrained.vit import vit_encoder

from .test_gpt2 import DECODER, TINY, _hf_logits, _inputs, save_gpt2
from .vision_folders import CLIP_ENCODER, VIT_ENCODER, save_clip_vision, save_vit
from .vision_folders import TINY as TINY_VISION

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

ALL = ("q", "k", "v", "o", "mlp")
GPT2 = "mmtf.pretrained.gpt2.gpt2_decoder"
BUILDERS = {"vit": ("mmtf.pretrained.vit.vit_encoder", vit_encoder, VIT_ENCODER, save_vit,
                    "ViTModel"),
            "clip": ("mmtf.pretrained.clip.clip_vision_encoder", clip_vision_encoder,
                     CLIP_ENCODER, save_clip_vision, "CLIPVisionModel")}


def _adapt(parts, targets, r=2, alpha=6.0, seed=1):
    """LoRA on every part with nonzero random B (as after training)."""
    torch.manual_seed(seed)
    for module in parts.values():
        add_lora(module, LoRAConfig(r=r, alpha=alpha, targets=targets))
        with torch.no_grad():
            for layer in lora_layers(module).values():
                for b in layer.lora_B.values():
                    b.normal_(0.0, 0.3)


def _export(parts, model_cfg, targets, out):
    lora = {"r": 2, "alpha": 6.0, "dropout": 0.0, "parts": list(parts), "targets": list(targets)}
    return export_peft(SimpleNamespace(export_parts=lambda: parts), {**model_cfg, "lora": lora},
                       out)


def _peft_made(base, out, target_modules, seed=2):
    """An adapter made and saved by peft's own API with random A and B."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.0, init_lora_weights=False,
                             target_modules=target_modules)
    model = peft.get_peft_model(base, config).eval()
    model.save_pretrained(out)
    return model


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    save_gpt2(folder)                    # with cross-attention: nothing is new to the model
    return folder


def _gpt2_base(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder).eval()


@pytest.mark.parametrize("targets", [ALL, ("q", "v")], ids=["all", "q_v"])
def test_gpt2_format_peft_loads_in_peft_with_mmtf_logits_and_back(gpt2_folder, tmp_path,
                                                                  targets):
    decoder = gpt2_decoder(**DECODER, pretrained=gpt2_folder).eval()
    _adapt({"decoder": decoder}, targets)
    tokens, memory, mask = _inputs()
    with torch.no_grad():
        ours = decoder(tokens, memory, mask)
    base = _gpt2_base(gpt2_folder)
    assert (ours - _hf_logits(base, tokens, memory, mask)).abs().max() > 1e-2
    out = _export({"decoder": decoder}, {"decoder": {"_target_": GPT2,
                                                     "pretrained": str(gpt2_folder)}},
                  targets, tmp_path / "adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    c_attn = r"transformer\.h\.0\.attn\.c_attn"
    cross = r"transformer\.h\.0\.crossattention\.c_attn"
    if targets == ALL:      # q, k, v in one module: rank 3r, alpha 3 alpha; k, v: 2r
        assert config["rank_pattern"][c_attn] == 6 and config["alpha_pattern"][c_attn] == 18
        assert config["rank_pattern"][cross] == 4
    else:                   # q, v of c_attn: 2r; only v of the cross c_attn: rank r
        assert config["rank_pattern"][c_attn] == 4 and cross not in config["rank_pattern"]
    assert config["fan_in_fan_out"] is True and config["r"] == 2
    theirs = _hf_logits(peft.PeftModel.from_pretrained(base, out).eval(), tokens, memory, mask)
    assert (ours - theirs).abs().max().item() <= 1e-4
    # and back into mmtf: the block-diagonal c_attn splits into the same rank-r adapters
    again = gpt2_decoder(**DECODER, pretrained=gpt2_folder).eval()
    found, parts = load_peft_adapter(out, {"decoder": again}, LoRAConfig())
    assert (found.r, found.alpha, found.targets, parts) == (2, 6.0, targets, ["decoder"])
    for name, tensor in decoder.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_a_peft_made_gpt2_adapter_loads_into_mmtf_with_peft_logits(gpt2_folder, tmp_path):
    # peft's c_attn adapter has one A for q, k and v: each slice takes A and its rows of B
    model = _peft_made(_gpt2_base(gpt2_folder), tmp_path / "peft",
                       ["c_attn", "q_attn", "c_proj", "c_fc"])
    tokens, memory, mask = _inputs()
    theirs = _hf_logits(model, tokens, memory, mask)
    decoder = gpt2_decoder(**DECODER, pretrained=gpt2_folder).eval()
    found, _ = load_peft_adapter(tmp_path / "peft", {"decoder": decoder}, LoRAConfig())
    assert (found.r, found.alpha, found.targets) == (4, 12.0, ALL)
    with torch.no_grad():
        ours = decoder(tokens, memory, mask)
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert (ours - _hf_logits(_gpt2_base(gpt2_folder), tokens, memory, mask)).abs().max() > 1e-2


def test_a_gpt2_adapter_for_another_base_names_it_and_the_shapes(gpt2_folder, tmp_path):
    other = tmp_path / "wide"
    save_gpt2(other, n_embd=32)
    _peft_made(_gpt2_base(other), tmp_path / "peft", ["c_attn"])
    decoder = gpt2_decoder(**DECODER, pretrained=gpt2_folder)
    with pytest.raises(UserError, match=rf"model.lora.pretrained: .* was trained for "
                                        rf"base_model_name_or_path='{other}': "
                                        rf"[\w.]+h.0.attn.c_attn.lora_A.weight has shape "
                                        rf"\(4, 32\), but mmtf's model.decoder.stack.blocks.0."
                                        rf"self_attn.to_q\+to_kv \(q, k, v\) needs \(4, 64\)"):
        load_peft_adapter(tmp_path / "peft", {"decoder": decoder}, LoRAConfig())
    # peft's per-module ranks that do not come out as one rank after the c_attn split
    torch.manual_seed(3)
    mixed = peft.get_peft_model(_gpt2_base(gpt2_folder), peft.LoraConfig(
        r=4, lora_alpha=8, init_lora_weights=False, rank_pattern={"c_fc": 2},
        target_modules=["c_attn", "q_attn", "c_proj", "c_fc"]))
    mixed.save_pretrained(tmp_path / "mixed")
    with pytest.raises(UserError, match=r"has adapters of several ranks or scales \(.*r=4, "
                                        r"alpha/r=2.*r=2, alpha/r=4.*\); mmtf's adapters have "
                                        r"one rank and one alpha"):
        load_peft_adapter(tmp_path / "mixed", {"decoder": decoder}, LoRAConfig())
    # a decoder whose cross-attention is new (no original) is no adapter on GPT-2
    save_gpt2(tmp_path / "plain", cross=False)
    fresh = gpt2_decoder(**DECODER, pretrained=tmp_path / "plain")
    _adapt({"decoder": fresh}, ("q",))
    with pytest.raises(UserError, match=r"format=peft: the decoder's stack.blocks.0.cross_attn"
                                        r"\S* \(and \d+ more\) are new to the model .* export "
                                        r"with format=hf merge_lora=true"):
        _export({"decoder": fresh}, {"decoder": {"_target_": GPT2,
                                                 "pretrained": str(tmp_path / "plain")}},
                ("q",), tmp_path / "refused")


@pytest.mark.parametrize("family", ["vit", "clip"])
def test_vision_format_peft_loads_in_peft_and_peft_made_adapters_load_into_mmtf(tmp_path,
                                                                                 family):
    target, build, settings, save, hf_class = BUILDERS[family]
    save(tmp_path / family)
    encoder = build(**settings, pretrained=tmp_path / family).eval()
    _adapt({"encoder": encoder}, ALL)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = encoder(images).memory

    def hidden(model):
        with torch.no_grad():
            return model(pixel_values=images).last_hidden_state

    def base():
        return getattr(transformers, hf_class).from_pretrained(tmp_path / family).eval()

    out = _export({"encoder": encoder}, {"encoder": {"_target_": target,
                                                     "pretrained": str(tmp_path / family)}},
                  ALL, tmp_path / "adapter")
    assert (ours - hidden(base())).abs().max() > 1e-2
    theirs = hidden(peft.PeftModel.from_pretrained(base(), out).eval())
    assert (ours - theirs).abs().max().item() <= 1e-4
    # made by peft, under the installed transformers' module names (ViT's are renamed)
    modules = {"vit": ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"],
               "clip": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]}[family]
    theirs = hidden(_peft_made(base(), tmp_path / "peft", modules))
    fresh = build(**settings, pretrained=tmp_path / family).eval()
    found, _ = load_peft_adapter(tmp_path / "peft", {"encoder": fresh}, LoRAConfig())
    assert (found.r, found.targets) == (4, ALL)
    with torch.no_grad():
        assert (fresh(images).memory - theirs).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", ["vit", "clip"])
def test_vision_gpt2_vision_encoder_decoder_adapters_in_peft(tmp_path, family):
    """Both parts imported from one VisionEncoderDecoderModel folder: one adapter folder on
    that class, the encoder's modules under encoder., the decoder's under decoder."""
    tower = (transformers.ViTModel(transformers.ViTConfig(**TINY_VISION), add_pooling_layer=False)
             if family == "vit" else
             transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**TINY_VISION)))
    captioner = transformers.VisionEncoderDecoderModel(
        encoder=tower, decoder=transformers.GPT2LMHeadModel(transformers.GPT2Config(
            **TINY, add_cross_attention=True)))
    captioner.save_pretrained(tmp_path / "ved")
    folder = str(tmp_path / "ved")
    target, build, settings = BUILDERS[family][:3]
    parts = {"encoder": build(**settings, pretrained=folder).eval(),
             "decoder": gpt2_decoder(**DECODER, pretrained=folder).eval()}
    _adapt(parts, ALL)
    images, tokens = torch.randn(2, 3, 32, 32), torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        ours = parts["decoder"](tokens, parts["encoder"](images).memory)
    out = _export(parts, {"encoder": {"_target_": target, "pretrained": folder},
                          "decoder": {"_target_": GPT2, "pretrained": folder}},
                  ALL, tmp_path / "adapter")
    base = transformers.VisionEncoderDecoderModel.from_pretrained(folder).eval()
    model = peft.PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        theirs = model(pixel_values=images, decoder_input_ids=tokens).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    # the two parts from two folders are two bases: one folder cannot hold both
    with pytest.raises(UserError, match=r"format=peft: no Hugging Face base holds the adapted "
                                        rf"encoder and decoder \(encoder {family} from /a, "
                                        r"decoder gpt2 from /b\)"):
        _export(parts, {"encoder": {"_target_": target, "pretrained": "/a"},
                        "decoder": {"_target_": GPT2, "pretrained": "/b"}},
                ALL, tmp_path / "refused")
