"""Fine-tuning controls: per-part learning rates and layer-wise decay against hand-computed values,
frozen parts that neither change nor hold optimizer state, unfreezing at an epoch, and resuming
before and past that epoch bit for bit."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader

from mmtf.decoders import TextDecoder
from mmtf.errors import UserError
from mmtf.reliability import ResumeState
from mmtf.tasks import CaptioningTask
from mmtf.tasks.base import Finetuning
from mmtf.tasks.fsdp import FSDP2Strategy
from mmtf.tasks.optim import PartOptim, build_optimizer, warmup_cosine

from .conftest import ADAMW, audio_encoder, captioner, classifier, vision_encoder

LR = 1e-2   # conftest's ADAMW


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(**{"accelerator": "cpu", "devices": 1, "logger": False,
                        "enable_checkpointing": False, "enable_progress_bar": False,
                        "enable_model_summary": False, "num_sanity_val_steps": 0,
                        "deterministic": True, **kw})


def _lrs_by_name(task: L.LightningModule, opt: torch.optim.Optimizer) -> dict[str, float]:
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    return {n: group_of[id(p)]["lr"] for n, p in task.named_parameters() if id(p) in group_of}


# ---------------------------------------------------------------------------- learning rates
def test_layer_decay_and_part_scale_match_a_hand_computation():
    """ViT-style encoder of 2 blocks, decay 0.5, encoder scale 0.2: embeddings 0.2 * 0.5**3,
    block 0 0.2 * 0.5**2, block 1 0.2 * 0.5, final norm 0.2, head (new) the full lr."""
    task = classifier(encoder=vision_encoder(depth=2), encoder_lr_scale=0.2, layer_decay=0.5)
    opt = build_optimizer(ADAMW, [task.head, task.encoder], 0.05, parts=task.optim_parts(),
                          layer_decay=task.layer_decay)

    def expected(name: str) -> float:
        if name.startswith("head."):
            return LR
        if name.startswith(("encoder.pos_embed", "encoder.cls_token", "encoder.patch_embed")):
            return LR * 0.2 * 0.125
        if name.startswith("encoder.stack.blocks.0."):
            return LR * 0.2 * 0.25
        if name.startswith("encoder.stack.blocks.1."):
            return LR * 0.2 * 0.5
        assert name.startswith("encoder.stack.norm."), name
        return LR * 0.2

    got = _lrs_by_name(task, opt)
    assert set(got) == {n for n, _ in task.named_parameters()}
    for name, lr in got.items():
        assert lr == pytest.approx(expected(name), rel=1e-12), name
    # weight decay rule kept: matrices decayed, norms / biases / positions not
    wd = {n: g["weight_decay"] for g in opt.param_groups for n, p in task.named_parameters()
          if any(p is q for q in g["params"])}
    assert wd["encoder.stack.blocks.1.mlp.fc_in.weight"] == 0.05 and wd["head.1.weight"] == 0.05
    assert wd["encoder.stack.blocks.0.norm_self.weight"] == 0.0 and wd["head.1.bias"] == 0.0


def test_captioner_parts_get_their_own_scales_and_decay():
    """Encoder (2 blocks) at 0.1, decoder (2 blocks, tied embedding) at 1, decay 0.5."""
    decoder = TextDecoder(vocab_size=64, dim=32, depth=2, num_heads=4, context_dim=32, max_len=64)
    task = CaptioningTask(encoder=audio_encoder(depth=2), decoder=decoder, optimizer=ADAMW,
                          finetuning={"encoder_lr_scale": 0.1, "layer_decay": 0.5})
    opt = build_optimizer(ADAMW, [task.model], 0.05, parts=task.optim_parts(),
                          layer_decay=task.layer_decay)
    by_layer = {"stem.": 0.125, "embed.": 0.125, "stack.blocks.0.": 0.25,
                "stack.blocks.1.": 0.5, "stack.norm.": 1.0}
    for name, lr in _lrs_by_name(task, opt).items():
        part, rest = name.split(".")[1], name.split(".", 2)[2]
        factor = next(v for k, v in by_layer.items() if rest.startswith(k))
        assert lr == pytest.approx(LR * (0.1 if part == "encoder" else 1.0) * factor), name


def test_without_controls_the_groups_are_the_decay_and_no_decay_pair():
    task = captioner()
    opt = build_optimizer(ADAMW, [task.model], 0.05, parts=task.optim_parts())
    assert [g["name"] for g in opt.param_groups] == ["base", "base.no_decay"]
    assert [g["lr"] for g in opt.param_groups] == [LR, LR]


def test_schedule_multiplies_every_group_by_the_same_factor():
    task = classifier(encoder=vision_encoder(depth=2), encoder_lr_scale=0.3, layer_decay=0.7)
    opt = build_optimizer(ADAMW, [task.head, task.encoder], 0.05, parts=task.optim_parts(),
                          layer_decay=task.layer_decay)
    start = [g["lr"] for g in opt.param_groups]
    assert len(set(start)) == 5                       # layers 0..3 of the encoder, and the head
    factor = warmup_cosine(2, 10, 0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    for step in range(1, 6):
        opt.step()
        sched.step()
        for group, lr0 in zip(opt.param_groups, start):
            assert group["lr"] == pytest.approx(lr0 * factor(step), rel=1e-12)


def test_group_names_reach_the_learning_rate_monitor(tmp_path):
    task = classifier(encoder=vision_encoder(depth=2), encoder_lr_scale=0.5)
    monitor = LearningRateMonitor()
    _trainer(max_steps=1, logger=CSVLogger(tmp_path), log_every_n_steps=1,
             callbacks=[monitor]).fit(task, DataLoader(_image_batches(1), batch_size=None))
    # one step in all: the schedule's warmup is cut to 0 steps, the factor is 1
    assert monitor.lrs == {"lr-AdamW/base": [LR], "lr-AdamW/base.no_decay": [LR],
                           "lr-AdamW/encoder": [LR * 0.5], "lr-AdamW/encoder.no_decay": [LR * 0.5]}


# ---------------------------------------------------------------------------- frozen parts
def _audio_batch(b: int = 3, n: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"audio": torch.randn(b, 1600, generator=g),
            "audio_lengths": torch.full((b,), 1600),
            "tokens": torch.randint(4, 64, (b, n), generator=g)}


def test_frozen_decoder_gets_no_update_and_no_optimizer_state_until_it_unfreezes():
    task = captioner(finetuning={"freeze_decoder": True, "unfreeze_decoder_at_epoch": 3}).train()
    assert not task.model.decoder.training and task.model.encoder.training
    opt = build_optimizer(ADAMW, [task.model], 0.05, parts=task.optim_parts())
    decoder = list(task.model.decoder.parameters())
    assert {id(p) for g in opt.param_groups for p in g["params"]} >= {id(p) for p in decoder}
    before = [p.detach().clone() for p in decoder]
    enc_before = [p.detach().clone() for p in task.model.encoder.parameters()]
    for seed in range(2):
        opt.zero_grad()
        batch = _audio_batch(seed=seed)
        task(batch["audio"], batch["audio_lengths"], batch["tokens"]).loss.backward()
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(decoder, before))
    assert all(len(opt.state[p]) == 0 for p in decoder)
    assert not all(torch.equal(p, q) for p, q in zip(task.model.encoder.parameters(), enc_before))
    task.set_part_frozen("decoder", False)
    assert task.model.decoder.training and all(p.requires_grad for p in decoder)
    opt.zero_grad()
    task(*_audio_batch().values()).loss.backward()
    opt.step()
    assert all(len(opt.state[p]) > 0 for p in decoder)
    assert not any(torch.equal(p, q) for p, q in zip(decoder, before) if p.dim() > 1)


class Record(Callback):
    """Per training batch: (epoch, part trainable, part in train mode); part weights per epoch."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.states: list[tuple[int, bool, bool]] = []
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def module(self, task):
        return task.export_parts()[self.part]

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        m = self.module(task)
        self.states.append((trainer.current_epoch, all(p.requires_grad for p in m.parameters()),
                            m.training))

    def on_train_epoch_end(self, trainer, task) -> None:
        self.weights[trainer.current_epoch] = {k: v.detach().clone()
                                               for k, v in self.module(task).state_dict().items()}


def test_captioner_decoder_unfreezes_at_the_given_epoch():
    task = captioner(finetuning={"freeze_decoder": True, "unfreeze_decoder_at_epoch": 1})
    before = {k: v.clone() for k, v in task.model.decoder.state_dict().items()}
    rec = Record("decoder")
    batches = [_audio_batch(seed=s) for s in range(2)]
    _trainer(max_epochs=2, callbacks=[rec]).fit(task, DataLoader(batches, batch_size=None))
    assert rec.states == [(0, False, False)] * 2 + [(1, True, True)] * 2
    assert all(torch.equal(rec.weights[0][k], v) for k, v in before.items())
    assert not all(torch.equal(rec.weights[1][k], v) for k, v in before.items())


# ---------------------------------------------------------------------------- resume
def _image_batches(n: int, b: int = 4) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"image": torch.rand(b, 3, 32, 32, generator=g), "label": torch.arange(b) % 3}
            for _ in range(n)]


class StopAfter(Callback):
    """Save a checkpoint at the end of epoch ``epoch`` and stop there."""

    def __init__(self, epoch: int, path) -> None:
        self.epoch, self.path = epoch, path

    def on_train_epoch_end(self, trainer, task) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def _fit(ckpt_path=None, callbacks=(), lora=None,
         ) -> tuple[L.Trainer, L.LightningModule, Record]:
    L.seed_everything(0, verbose=False)
    task = classifier(encoder=vision_encoder(freeze=True, dropout=0.1),
                      unfreeze_encoder_at_epoch=1, dropout=0.1, warmup_steps=2, lora=lora)
    rec = Record("encoder")
    # ResumeState (as in conf/callbacks) restores the generators for the dropout after a resume
    trainer = _trainer(max_epochs=3, callbacks=[rec, ResumeState(), *callbacks])
    # Its own generator: a DataLoader otherwise draws a seed from the global one at every epoch,
    # which a resume cannot replay (docs/design/exact-resume.md)
    loader = DataLoader(_image_batches(2), batch_size=None, generator=torch.Generator())
    trainer.fit(task, loader, ckpt_path=ckpt_path, weights_only=True)
    return trainer, task, rec


LORA = {"r": 2, "alpha": 4, "dropout": 0.1, "parts": ["encoder"], "targets": ["q", "v", "mlp"]}


@pytest.mark.parametrize("stop_after, lora", [(0, None), (1, None), (1, LORA)],
                         ids=["before", "past", "past_lora"])
def test_resume_before_or_past_the_unfreeze_epoch_is_bit_exact(tmp_path, stop_after, lora):
    """Unfreeze at epoch 1 of 3; a run stopped after epoch ``stop_after`` and resumed from its
    checkpoint ends in the uninterrupted run's weights and optimizer state, bit for bit. With
    LoRA (adapter dropout on) the unfrozen encoder trains its adapters only and its base stays
    the initial one."""
    ref_trainer, ref, ref_rec = _fit(lora=lora)
    trained = lora is None               # without LoRA the whole encoder becomes trainable
    assert [s[1:] for s in ref_rec.states] == [(False, False)] * 2 + [(trained, True)] * 4
    if lora is not None:
        first, last = ref_rec.weights[0], ref_rec.weights[2]
        assert all(torch.equal(first[k], v) == (".lora_" not in k) for k, v in last.items()
                   if ".lora_A" not in k)
    ckpt = tmp_path / "stop.ckpt"
    _fit(callbacks=[StopAfter(stop_after, ckpt)], lora=lora)
    trainer, task, rec = _fit(ckpt_path=str(ckpt), lora=lora)
    # the resumed run's own batches: frozen only in an epoch before 1, trainable after
    assert rec.states == ref_rec.states[2 * (stop_after + 1):]
    a, b = ref.state_dict(), task.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = (t.optimizers[0].state_dict() for t in (ref_trainer, trainer))
    assert sa["state"].keys() == sb["state"].keys()
    for i, state in sa["state"].items():
        for k, v in state.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(sb["state"][i][k])), (i, k)
    assert [g["lr"] for g in sa["param_groups"]] == [g["lr"] for g in sb["param_groups"]]


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, message", [
    ({"encoder_lr_scale": 0.0}, r"model.finetuning.encoder_lr_scale \(0.0\) must be > 0; "
                                r"freeze the encoder \(model.encoder.freeze=true\)"),
    ({"decoder_lr_scale": -1.0}, r"model.finetuning.decoder_lr_scale \(-1.0\) must be > 0; .*"
                                 r"model.finetuning.freeze_decoder=true"),
    ({"layer_decay": 1.5}, r"model.finetuning.layer_decay \(1.5\) must be in \(0, 1\]"),
    ({"unfreeze_decoder_at_epoch": 2}, r"model.finetuning.unfreeze_decoder_at_epoch \(2\) is set "
                                       r"but the decoder is not frozen; set "
                                       r"model.finetuning.freeze_decoder=true"),
    ({"freeze_decoder": True, "unfreeze_decoder_at_epoch": -1},
     r"model.finetuning.unfreeze_decoder_at_epoch \(-1\) must be an epoch >= 0"),
    ({"freeze_encoder": True}, r"model.finetuning.freeze_encoder is not a fine-tuning control"),
])
def test_bad_controls_name_the_key_and_the_fix(kwargs, message):
    with pytest.raises(UserError, match=message):
        captioner(finetuning=kwargs)


def test_freezing_every_part_is_refused():
    decoder = TextDecoder(vocab_size=64, dim=32, depth=1, num_heads=4, context_dim=32)
    with pytest.raises(UserError, match=r"every part is frozen \(model.encoder.freeze, "
                                        r"model.finetuning.freeze_decoder\): nothing trains in "
                                        r"epoch 0"):
        CaptioningTask(encoder=audio_encoder(freeze=True), decoder=decoder, optimizer=ADAMW,
                       finetuning=Finetuning(freeze_decoder=True, unfreeze_decoder_at_epoch=1))


def test_unfreezing_under_fsdp_is_refused_with_the_trainers_that_work():
    task = classifier(encoder=vision_encoder(freeze=True), unfreeze_encoder_at_epoch=1)
    task.trainer = L.Trainer(accelerator="cpu", devices=2, logger=False,
                             strategy=FSDP2Strategy(process_group_backend="gloo"))
    with pytest.raises(UserError, match=r"model.unfreeze_encoder_at_epoch is set but the "
                                        r"trainer's strategy is FSDP2Strategy; .* use "
                                        r"trainer=gpu, ddp or ddp_cpu, or train the encoder from "
                                        r"the start \(model.encoder.freeze=false\)"):
        task.setup("fit")


def test_layer_decay_needs_one_transformer_stack_in_the_part():
    part = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(UserError, match=r"model.layer_decay: model.encoder \(Sequential\) holds "
                                        r"0 transformer stacks, .* set model.layer_decay=null"):
        build_optimizer(ADAMW, [part], 0.05, parts={"encoder": PartOptim(part)}, layer_decay=0.5)
