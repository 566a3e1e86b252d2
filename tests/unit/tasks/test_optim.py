"""Parameter groups and the warmup + cosine schedule against hand-computed values."""

from __future__ import annotations

import functools
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


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 8), nn.LayerNorm(8))


def _adamw(**kw):
    return functools.partial(torch.optim.AdamW, lr=1e-2, betas=(0.9, 0.98), **kw)


def test_adamw_on_cpu_is_fused_unless_the_config_or_autocast_says_otherwise():
    model = _tiny()
    assert build_optimizer(_adamw(), [model], 0.05).defaults["fused"] is True
    assert not build_optimizer(_adamw(fused=False), [model], 0.05).defaults["fused"]
    assert build_optimizer(_adamw(foreach=True), [model], 0.05).defaults["foreach"] is True
    assert not build_optimizer(_adamw(foreach=True), [model], 0.05).defaults["fused"]
    # Lightning refuses gradient clipping with an optimizer that unscales itself (fused).
    assert not build_optimizer(_adamw(), [model], 0.05, mixed_precision=True).defaults["fused"]
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    assert "fused" not in build_optimizer(sgd, [model], 0.05).defaults or \
        not build_optimizer(sgd, [model], 0.05).defaults["fused"]


def test_fused_adamw_steps_as_the_per_tensor_loop_does():
    """The reference is torch's own loop (fused=False), same groups, same gradients."""
    fused_model, loop_model = _tiny(), _tiny()
    fused = build_optimizer(_adamw(), [fused_model], 0.05)
    loop = build_optimizer(_adamw(fused=False), [loop_model], 0.05)
    tokens = torch.randint(0, 11, (4, 5))
    for _ in range(5):
        for model, opt in ((fused_model, fused), (loop_model, loop)):
            model(tokens).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(fused_model.parameters(), loop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [g["weight_decay"] for g in fused.param_groups] == \
        [g["weight_decay"] for g in loop.param_groups]


def test_fused_adamw_with_gradient_clipping_trains_under_lightning_and_bf16_autocast_does_not_fuse():
    import lightning.pytorch as pl

    from mmtf.tasks.optim import is_mixed

    class Toy(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _tiny()

        def training_step(self, batch, _):
            return self.net(batch[0]).float().square().mean()

        def configure_optimizers(self):
            return build_optimizer(_adamw(), [self.net], 0.05,
                                   mixed_precision=is_mixed(self.trainer))

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randint(0, 11, (8, 5))), batch_size=4)
    for precision, fused in (("32-true", True), ("bf16-mixed", False)):
        toy = Toy()
        trainer = pl.Trainer(accelerator="cpu", max_steps=2, gradient_clip_val=1.0,
                             precision=precision, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(toy, data)
        assert bool(trainer.optimizers[0].defaults["fused"]) is fused
        assert trainer.global_step == 2
