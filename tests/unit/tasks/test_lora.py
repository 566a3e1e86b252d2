"""LoRA through the task: only adapters (and new layers, the classifier's head) train, the base
stays bit-identical, the optimizer holds nothing else, and the fine-tuning controls (freeze,
unfreeze at an epoch, layer-wise decay) act on the adapters."""

from __future__ import annotations

import pytest
import torch

from mmtf.errors import ConfigError
from mmtf.nn.lora import LoRALinear, mark_new
from mmtf.tasks.optim import build_optimizer

from .conftest import ADAMW, captioner, classifier, vision_encoder

LORA = {"r": 2, "alpha": 4, "dropout": 0.0, "parts": ["encoder", "decoder"],
        "targets": ["q", "k", "v", "o", "mlp"]}


def _batch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(3, 1600, generator=g), torch.full((3,), 1600),
            torch.randint(4, 64, (3, 6), generator=g))


def _steps(task, opt, n: int = 3) -> None:
    for seed in range(n):
        opt.zero_grad()
        task(*_batch(seed)).loss.backward()
        opt.step()


def test_only_adapters_train_and_the_base_stays_bit_identical():
    task = captioner(lora=LORA).train()
    trainable = {n for n, p in task.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    opt = build_optimizer(ADAMW, [task.model], 0.05, parts=task.optim_parts())
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in task.parameters() if p.requires_grad}
    base = {k: v.clone() for k, v in task.state_dict().items() if ".lora_" not in k}
    adapters = {k: v.clone() for k, v in task.state_dict().items() if ".lora_" in k}
    _steps(task, opt)
    state = task.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items())
    assert not all(torch.equal(state[k], v) for k, v in adapters.items())
    # every B moved (the loss reaches every adapter)
    assert all(not torch.equal(state[k], v) for k, v in adapters.items() if ".lora_B." in k)


def test_the_classifier_head_and_new_layers_train_with_the_adapters():
    encoder = vision_encoder(depth=2)
    mark_new(encoder, ["stack.blocks.1.norm_mlp.weight"])
    task = classifier(encoder=encoder, lora={**LORA, "parts": ["encoder"], "targets": ["q"]})
    trainable = {n for n, p in task.named_parameters() if p.requires_grad}
    assert trainable == {"head.1.weight", "head.1.bias", "encoder.stack.blocks.1.norm_mlp.weight",
                         *(f"encoder.stack.blocks.{i}.self_attn.to_q.lora_{m}.q"
                           for i in range(2) for m in "AB")}


@pytest.mark.parametrize("bias, expected", [
    ("lora_only", {"encoder.stack.blocks.0.self_attn.to_q.bias"}),
    ("all", {"encoder.stack.blocks.0.self_attn.to_q.bias",
             "encoder.stack.blocks.0.self_attn.to_kv.bias",
             "encoder.stack.blocks.0.self_attn.to_out.bias",
             "encoder.stack.blocks.0.mlp.fc_in.bias", "encoder.stack.blocks.0.mlp.fc_out.bias",
             "encoder.stack.blocks.0.norm_self.bias", "encoder.stack.blocks.0.norm_mlp.bias",
             "encoder.stack.norm.bias", "encoder.patch_embed.bias"}),
])
def test_peft_bias_options(bias, expected):
    task = classifier(encoder=vision_encoder(bias=True),
                      lora={**LORA, "parts": ["encoder"], "targets": ["q"], "bias": bias})
    trainable = {n for n, p in task.named_parameters()
                 if p.requires_grad and ".lora_" not in n and not n.startswith("head.")}
    assert trainable == expected


def test_a_frozen_part_unfreezes_to_its_adapters_only():
    task = captioner(lora=LORA, finetuning={"freeze_decoder": True, "unfreeze_decoder_at_epoch": 1})
    decoder = task.model.decoder
    assert not any(p.requires_grad for p in decoder.parameters())
    opt = build_optimizer(ADAMW, [task.model], 0.05, parts=task.optim_parts())
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    adapters = {id(p) for n, p in decoder.named_parameters() if ".lora_" in n}
    assert adapters <= held                           # in the optimizer before they unfreeze
    assert not {id(p) for n, p in decoder.named_parameters() if ".lora_" not in n} & held
    task.set_part_frozen("decoder", False)
    assert {id(p) for p in decoder.parameters() if p.requires_grad} == adapters
    # an encoder built frozen keeps its adapters frozen too until it unfreezes
    task = classifier(encoder=vision_encoder(freeze=True), unfreeze_encoder_at_epoch=1,
                      lora={**LORA, "parts": ["encoder"]})
    assert not any(p.requires_grad for p in task.encoder.parameters())
    task.set_part_frozen("encoder", False)
    assert {n for n, p in task.encoder.named_parameters() if p.requires_grad} == {
        n for n, _ in task.encoder.named_parameters() if ".lora_" in n}


def test_adapters_belong_to_their_blocks_layer():
    task = classifier(encoder=vision_encoder(depth=2), lora={**LORA, "parts": ["encoder"]},
                      layer_decay=0.5)
    opt = build_optimizer(ADAMW, [task.head, task.encoder], 0.05, parts=task.optim_parts(),
                          layer_decay=task.layer_decay)
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in task.encoder.named_parameters():
        if ".lora_" in name:
            block = int(name.split(".")[2])
            assert lr[id(p)] == pytest.approx(1e-2 * 0.5 ** (2 - block)), name


def test_lora_layers_replace_the_projections_under_their_names():
    task = captioner(lora={**LORA, "targets": ["k"]})
    to_kv = task.model.decoder.stack.blocks[0].cross_attn.to_kv
    assert isinstance(to_kv, LoRALinear) and list(to_kv.lora_A) == ["k"]
    assert "model.decoder.stack.blocks.0.cross_attn.to_kv.weight" in task.state_dict()


@pytest.mark.parametrize("lora, message", [
    ({**LORA, "parts": ["decoder"]}, r"model.lora.parts: \['decoder'\] is not a part of a "
                                     r"ClassificationTask, whose parts are \['encoder'\]"),
    ({**LORA, "parts": ["encoder"], "rank": 4}, r"model.lora.rank is not a LoRA setting"),
    ({**LORA, "parts": ["encoder"], "r": 0}, r"model.lora.r \(0\) must be an integer rank > 0"),
])
def test_bad_lora_config_names_the_key(lora, message):
    with pytest.raises(ConfigError, match=message):
        classifier(lora=lora)
