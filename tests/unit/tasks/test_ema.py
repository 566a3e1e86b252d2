"""mmtf.tasks.ema.EMA on a toy Lightning loop: the average equals the closed form (start step,
every n steps), frozen weights stay bit-identical, checkpoints keep the trained weights in
``state_dict`` and the average in ``ema_state_dict``, validation runs on the average when asked,
and use_ema reads it (an error names the fix when there is none)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mmtf.checkpoint_io import EMA_STATE_KEY, model_state
from mmtf.errors import CheckpointError, ConfigError
from mmtf.tasks.ema import EMA
from mmtf.utils.config_dir import CONF_DIR


class Toy(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.frozen = nn.Linear(4, 1)
        self.frozen.requires_grad_(False)
        self.val_weights: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self.net(x) + self.frozen(x) - y).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.val_weights.append(self.net[0].weight.detach().clone())

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)

    def loader(self) -> DataLoader:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(16, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(-1, keepdim=True)), batch_size=2)

    def train_dataloader(self):
        return self.loader()

    def val_dataloader(self):
        return self.loader()


class History(Callback):
    """The trained weights after every optimizer step (float64), before EMA's update."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.weights.append({k: p.detach().double().clone()
                             for k, p in pl_module.named_parameters()})


def _fit(tmp_path, ema: EMA, steps: int = 8, val_every: int | None = None) -> tuple[Toy, History]:
    model, history = Toy(), History()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[history, ema], num_sanity_val_steps=0,
                        limit_val_batches=1 if val_every else 0,
                        val_check_interval=val_every)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "end.ckpt")
    return model, history


@pytest.mark.parametrize(("start", "every"), [(0, 1), (3, 2)])
def test_average_equals_the_closed_form(tmp_path, start, every):
    decay = 0.8
    ema = EMA(decay=decay, start_step=start, every_n_steps=every, validate_with_ema=False)
    model, history = _fit(tmp_path, ema)
    steps = [s for s in range(1, 9) if s >= start and (s - start) % every == 0]
    assert ema.updates == len(steps) and ema._latest_update_step == steps[-1]
    # Closed form: ema = w_s1 decay^(k-1) + sum_{j>=2} (1 - decay) decay^(k-j) w_sj.
    k = len(steps)
    checkpoint = torch.load(tmp_path / "end.ckpt", weights_only=True)
    for name, param in model.named_parameters():
        w = [history.weights[s - 1][name] for s in steps]
        expected = decay ** (k - 1) * w[0] + sum((1 - decay) * decay ** (k - j) * w[j - 1]
                                                 for j in range(2, k + 1))
        torch.testing.assert_close(checkpoint[EMA_STATE_KEY][name].double(), expected,
                                   rtol=0, atol=1e-6)
        # state_dict keeps the trained weights (never overwritten by the average at the end)
        assert torch.equal(checkpoint["state_dict"][name], param.detach())
    assert not torch.equal(checkpoint[EMA_STATE_KEY]["net.0.weight"],
                           checkpoint["state_dict"]["net.0.weight"])
    assert torch.equal(checkpoint[EMA_STATE_KEY]["frozen.weight"], model.frozen.weight)
    assert checkpoint["callbacks"]["EMA"]["updates"] == k


def test_validation_runs_on_the_average_and_swaps_back(tmp_path):
    ema = EMA(decay=0.5, validate_with_ema=True)
    model, _ = _fit(tmp_path, ema, steps=4, val_every=2)
    checkpoint = torch.load(tmp_path / "end.ckpt", weights_only=True)
    assert len(model.val_weights) == 2
    # the last validation (after step 4) saw the average, and the model has its weights back
    assert torch.equal(model.val_weights[-1], checkpoint[EMA_STATE_KEY]["net.0.weight"])
    assert torch.equal(model.net[0].weight, checkpoint["state_dict"]["net.0.weight"])
    assert not torch.equal(model.val_weights[-1], model.net[0].weight)


def test_a_checkpoint_saved_while_validating_on_the_average_keeps_the_roles(tmp_path):
    ema = EMA(decay=0.5)
    model, _ = _fit(tmp_path, ema, steps=2)
    trainer = model.trainer
    expected = torch.load(tmp_path / "end.ckpt", weights_only=True)
    ema._swap_in(model)
    assert torch.equal(model.net[0].weight, expected[EMA_STATE_KEY]["net.0.weight"])
    trainer.save_checkpoint(tmp_path / "swapped.ckpt")
    ema._swap_out(model)
    got = torch.load(tmp_path / "swapped.ckpt", weights_only=True)
    for key in ("state_dict", EMA_STATE_KEY):
        for name, tensor in expected[key].items():
            assert torch.equal(got[key][name], tensor), (key, name)


def test_use_ema_without_an_average_names_the_fix(tmp_path):
    checkpoint = {"state_dict": {"w": torch.ones(1)}}
    assert model_state(checkpoint, "x.ckpt") is checkpoint["state_dict"]
    with pytest.raises(CheckpointError, match=r"checkpoint x.ckpt holds no EMA weights "
                       r"\(ema_state_dict\): train with callbacks=ema .* or set use_ema=false"):
        model_state(checkpoint, "x.ckpt", use_ema=True)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"decay": 1.0}, r"callbacks.ema.decay \(1.0\) must be in \(0, 1\)"),
    ({"every_n_steps": 0}, r"every_n_steps \(0\) >= 1"),
])
def test_bad_settings_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EMA(**kwargs)


def test_callbacks_ema_keeps_the_default_callbacks():
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        default = compose("train").callbacks
        cfg = compose("train", overrides=["callbacks=ema", "callbacks.ema.decay=0.99"]).callbacks
    assert set(cfg) == {*default, "ema"}
    ema = instantiate(cfg.ema)
    assert isinstance(ema, EMA) and ema.decay == 0.99 and ema.validate_with_ema


def test_a_tested_checkpoint_is_scored_on_its_own_average(tmp_path, caplog):
    ema = EMA(decay=0.5)
    model, _ = _fit(tmp_path, ema, steps=4)
    saved = torch.load(tmp_path / "end.ckpt", weights_only=True)
    without = {k: v for k, v in saved.items() if k != EMA_STATE_KEY}
    torch.save(without, tmp_path / "plain.ckpt")
    seen = {}

    class Probe(Callback):
        def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            seen[Path(trainer.ckpt_path).name] = pl_module.net[0].weight.detach().clone()

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[ema, Probe()], limit_test_batches=1)
    model.test_dataloader = model.loader
    model.test_step = lambda batch, batch_idx: None
    for name in ("end.ckpt", "plain.ckpt"):
        trainer.test(model, ckpt_path=tmp_path / name, weights_only=True)
    assert torch.equal(seen["end.ckpt"], saved[EMA_STATE_KEY]["net.0.weight"])
    # no average in the file: its trained weights, not the in-memory average of the fit
    assert torch.equal(seen["plain.ckpt"], saved["state_dict"]["net.0.weight"])
    assert "holds no EMA weights" in caplog.text
    assert torch.equal(model.net[0].weight, saved["state_dict"]["net.0.weight"])  # swapped back
