"""Parameter groups and the warmup + cosine schedule against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmtf.tasks.optim import build_optimizer, param_groups, warmup_cosine


def test_norms_biases_and_embeddings_get_no_weight_decay():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    groups = param_groups([model], weight_decay=0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert decayed == {id(model[1].weight), id(model[3].weight)}
    total = sum(len(g["params"]) for g in groups)
    assert total == len(list(model.parameters()))


def test_frozen_parameters_are_left_out_unless_asked():
    model = nn.Linear(4, 4)
    model.weight.requires_grad_(False)
    assert sum(len(g["params"]) for g in param_groups([model], 0.1)) == 1
    assert sum(len(g["params"]) for g in param_groups([model], 0.1, include_frozen=True)) == 2


def test_shared_parameters_are_counted_once():
    emb = nn.Embedding(5, 4)
    head = nn.Linear(4, 5, bias=False)
    head.weight = emb.weight                       # tied, as the LM head is
    opt = build_optimizer(lambda groups: torch.optim.AdamW(groups, lr=1e-3), [emb, head], 0.1)
    assert sum(len(g["params"]) for g in opt.param_groups) == 1


def test_warmup_cosine_matches_hand_values():
    f = warmup_cosine(warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == pytest.approx([1 / 5, 2 / 5, 3 / 5, 4 / 5])
    assert f(4) == pytest.approx(1.0)
    # halfway through the cosine part (5 of 10 steps): 0.1 + 0.9 * 0.5 * (1 + cos(pi/2))
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(14) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)
    assert f(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))


def test_warmup_cosine_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"min_lr_ratio \(1.5\)"):
        warmup_cosine(1, 10, 1.5)
    with pytest.raises(ValueError, match=r"total_steps \(0\)"):
        warmup_cosine(1, 0)


def test_a_part_of_its_own_group_is_never_decayed_nor_layer_decayed():
    from mmtf.losses import ContrastiveLoss
    from mmtf.nn import TransformerStack
    from mmtf.tasks.optim import PartOptim

    stack = TransformerStack(depth=2, dim=8, num_heads=2)
    loss = ContrastiveLoss()
    parts = {"encoder": PartOptim(stack, 0.5),
             "logit_scale": PartOptim(loss, own_group=True)}
    groups = param_groups([stack, loss], weight_decay=0.1, parts=parts, layer_decay=0.5)
    own = [g for g in groups if g["name"].startswith("logit_scale")]
    # one group holding the scalar alone, at the optimizer's lr (scale 1), decay 0
    assert [(g["name"], g["weight_decay"], g["lr_scale"]) for g in own] == \
        [("logit_scale.no_decay", 0.0, 1.0)]
    assert own[0]["params"] == [loss.logit_scale]
    # the stack still gets layer-wise decay: its last block at 0.5 * 0.5 ** 1
    assert any(g["name"] == "encoder.layer2" and g["lr_scale"] == 0.25 for g in groups)
