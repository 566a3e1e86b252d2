"""LastCheckpoint: last.ckpt holds the latest state after every validation and every N steps,
whatever the monitored metric does (Lightning's save_last alone copies improvements only)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from mmtf.checkpoint_io import AtomicCheckpointIO
from mmtf.reliability import LastCheckpoint
from tests.unit.reliability.toy import ToyData, ToyModule


class FlatMetric(ToyModule):
    """Logs a validation metric that never improves after the first epoch."""

    def validation_step(self, batch, batch_idx) -> None:
        self.log("val/flat", torch.tensor(1.0))


def _fit(tmp_path, callbacks, max_epochs: int = 3, **trainer_kwargs) -> list[int]:
    """Train the toy; the global step of last.ckpt after every epoch's validation."""
    steps: list[int] = []

    class Probe(L.Callback):
        def on_validation_end(self, trainer, pl_module) -> None:
            last = tmp_path / "checkpoints" / "last.ckpt"
            steps.append(torch.load(last, weights_only=True)["global_step"]
                         if last.exists() else -1)

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(default_root_dir=tmp_path, max_epochs=max_epochs, accelerator="cpu",
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[*callbacks, Probe()], plugins=[AtomicCheckpointIO()],
                        num_sanity_val_steps=0, limit_val_batches=1, **trainer_kwargs)
    trainer.fit(FlatMetric(), datamodule=ToyData(val=True))
    return steps


def _monitor(tmp_path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val/flat", mode="min",
                           save_top_k=1, save_last=True, enable_version_counter=False,
                           save_on_train_epoch_end=False, filename="best")


def test_monitoring_checkpoint_alone_leaves_last_at_the_last_improvement(tmp_path):
    """Control (Lightning 2.6): the metric never improves after epoch 0 -> last.ckpt stays
    at step 6 while training goes on to step 18."""
    # (Lightning runs checkpoint callbacks after the probe: it sees the previous epoch's file)
    assert _fit(tmp_path, [_monitor(tmp_path)]) == [-1, 6, 6]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 6


def test_last_checkpoint_follows_every_validation(tmp_path):
    steps = _fit(tmp_path, [_monitor(tmp_path), LastCheckpoint(dirpath=str(tmp_path /
                                                                           "checkpoints"))])
    assert steps == [-1, 6, 12]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt",
                      weights_only=True)["global_step"] == 18
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best.ckpt",
                                                                           "last.ckpt"]


def test_every_n_train_steps_writes_last_in_between(tmp_path):
    saved: list[int] = []
    ckpt = LastCheckpoint(dirpath=str(tmp_path / "checkpoints"), every_n_train_steps=4)
    original = ckpt._save_checkpoint

    def spy(trainer, filepath) -> None:
        saved.append(trainer.global_step)
        original(trainer, filepath)

    ckpt._save_checkpoint = spy
    _fit(tmp_path, [ckpt], max_epochs=2)
    # every 4 steps, after each epoch's validation (steps 6 and 12) and at the end of fit
    assert saved == [4, 6, 8, 12, 12, 12]


def test_the_end_of_fit_writes_last_after_the_last_trigger(tmp_path):
    """Validation every 2nd epoch, 3 epochs, every 4 steps: the last trigger is at step 16 (the
    validation at 12), training ends at 18; last.ckpt holds step 18, with the loops finished."""
    ckpt = LastCheckpoint(dirpath=str(tmp_path / "checkpoints"), every_n_train_steps=4)
    _fit(tmp_path, [_monitor(tmp_path), ckpt], max_epochs=3, check_val_every_n_epoch=2)
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 18
    assert last["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"monitor": "val/loss"}, r"monitor cannot be set; it only keeps last.ckpt current"),
    ({"save_top_k": 3, "save_last": False}, r"save_last, save_top_k cannot be set"),
    ({"every_n_train_steps": -1}, r"every_n_train_steps \(-1\) must be >= 0 or null"),
])
def test_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LastCheckpoint(**kwargs)
