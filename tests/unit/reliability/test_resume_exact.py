"""A run killed with SIGKILL and resumed from last.ckpt ends bit for bit in the state of a run that
was never interrupted: weights, every optimizer state tensor, LR schedule and the generators
(CPU, one thread, deterministic kernels; dropout on, random targets, shuffled batches).

Each case: fit from scratch to the end (reference); fit again in a forked child that a
ModelCheckpoint checkpoints and that SIGKILLs itself at a later step; fit from the child's
last.ckpt to the end. Toy epochs have 6 batches (24 samples, batch 4).
"""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch

from mmtf.reliability import ResumeState
from tests.unit.reliability.toy import (
    ToyModule,
    assert_same_training_state,
    fit,
    max_abs_diff,
    run_forked,
)


def kill_and_resume(tmp_path, *, kill_at: int, ckpt: dict, run: dict, resume_state=True,
                    **data) -> tuple[tuple, tuple, int]:
    """((ref trainer, ref model), (resumed trainer, resumed model), global step in last.ckpt)."""
    def state():
        return resume_state() if callable(resume_state) else resume_state

    reference = fit(tmp_path / "ref", resume_state=state(), **run, **data)
    code = run_forked(fit, tmp_path / "run", kill_at=kill_at, resume_state=state(), **ckpt,
                      **run, **data)
    assert code == -9, f"the child was to be SIGKILLed, exit code {code}"
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt_step = torch.load(last, weights_only=True)["global_step"]
    resumed = fit(tmp_path / "run", ckpt_path=str(last), resume_state=state(), **run, **data)
    assert resumed[0].global_step == reference[0].global_step
    return reference, resumed, ckpt_step


STEPS = {"max_steps": 15}
EPOCHS = {"max_epochs": 3}


@pytest.mark.parametrize("num_workers, noise", [(0, "global"), (2, "sample")])
def test_mid_epoch_kill_resumes_exactly(tmp_path, num_workers, noise):
    # checkpoints at steps 4 and 8; killed at the start of step 10 (epoch 1, batch 4)
    ref, resumed, ckpt_step = kill_and_resume(
        tmp_path, kill_at=10, ckpt={"every_n_train_steps": 4}, run=STEPS,
        num_workers=num_workers, noise=noise)
    assert (ckpt_step, resumed[0].global_step) == (8, 15)
    assert_same_training_state(ref, resumed)


WORKERS_SLOW = [(0, "global"), pytest.param(2, "sample", marks=pytest.mark.slow)]


@pytest.mark.parametrize("num_workers, noise", WORKERS_SLOW)
def test_epoch_boundary_kill_resumes_exactly(tmp_path, num_workers, noise):
    # checkpoint at step 6 = the last batch of epoch 0; killed at step 8
    ref, resumed, ckpt_step = kill_and_resume(
        tmp_path, kill_at=8, ckpt={"every_n_train_steps": 6}, run=STEPS,
        num_workers=num_workers, noise=noise)
    assert ckpt_step == 6
    assert_same_training_state(ref, resumed)


@pytest.mark.parametrize("num_workers, noise", WORKERS_SLOW)
def test_mmtf_style_checkpoint_after_epoch_end_validation(tmp_path, num_workers, noise):
    # conf/callbacks/default.yaml model_checkpoint: monitor a val metric, saved at validation end,
    # epoch-based training; killed in epoch 1
    ref, resumed, ckpt_step = kill_and_resume(
        tmp_path, kill_at=8, ckpt={"monitor": "val/loss"}, run=EPOCHS, val=True,
        num_workers=num_workers, noise=noise)
    assert (ckpt_step, resumed[0].global_step) == (6, 18)
    assert_same_training_state(ref, resumed)


@pytest.mark.parametrize("num_workers, noise", WORKERS_SLOW)
def test_checkpoint_just_before_mid_epoch_validation(tmp_path, num_workers, noise):
    # validation every 3 batches; the checkpoint at step 9 is followed by a validation run,
    # which a resumed run skips: it must not shift the training random stream
    ref, resumed, ckpt_step = kill_and_resume(
        tmp_path, kill_at=10, ckpt={"every_n_train_steps": 3}, run=STEPS, val=True,
        val_check_interval=3, num_workers=num_workers, noise=noise)
    assert ckpt_step == 9
    assert_same_training_state(ref, resumed)


def test_without_resume_state_dropout_diverges(tmp_path):
    """Control: Lightning alone restores weights, optimizer and loader, not the RNG."""
    ref, resumed, _ = kill_and_resume(tmp_path, kill_at=10, ckpt={"every_n_train_steps": 4},
                                      run=STEPS, resume_state=False)
    assert max_abs_diff(ref[1], resumed[1]) > 1e-3
    with pytest.raises(AssertionError, match="weight"):
        assert_same_training_state(ref, resumed)


def test_plain_dataloader_does_not_resume_mid_epoch(tmp_path):
    """Control: a torch DataLoader restarts its epoch's order after a resume."""
    ref, resumed, _ = kill_and_resume(tmp_path, kill_at=10, ckpt={"every_n_train_steps": 4},
                                      run=STEPS, stateful=False)
    assert max_abs_diff(ref[1], resumed[1]) > 1e-3


def test_val_loader_without_generator_is_reported_and_shifts_the_stream(tmp_path, caplog):
    """A DataLoader without its own generator draws from the global torch generator at
    every iter(); Lightning re-creates the val iterator when it skips the validation it
    already ran, so the resumed stream shifts. ResumeState says so."""
    with caplog.at_level(logging.WARNING, logger="mmtf.reliability.resume_state"):
        ref, resumed, _ = kill_and_resume(
            tmp_path, kill_at=10, ckpt={"every_n_train_steps": 3}, run=STEPS, val=True,
            val_check_interval=3, val_generator=False)
    assert max_abs_diff(ref[1], resumed[1]) > 1e-3
    assert "a val DataLoader has no generator" in caplog.text


def test_validation_isolation_keeps_training_independent_of_validation(tmp_path):
    """With isolate_validation, training with and without validation gives the same weights
    (validation's own randomness, e.g. sampled captions, does not leak into training)."""
    no_val = fit(tmp_path / "a", **STEPS)
    with_val = fit(tmp_path / "b", **STEPS, val=True, val_check_interval=3)
    assert_same_training_state(no_val, with_val)
    _, leaky = fit(tmp_path / "c", **STEPS, val=True, val_check_interval=3, val_generator=False,
                   resume_state=ResumeState(isolate_validation=False))
    assert max_abs_diff(no_val[1], leaky) > 1e-3


class ScheduleLengthToy(ToyModule):
    """Reads ``trainer.estimated_stepping_batches`` in ``configure_optimizers`` (the length of
    an LR schedule), as mmtf's tasks do. Lightning then builds the train loader before it
    restores the loops' state and never hands the loader its saved position."""

    def configure_optimizers(self):
        self.total_steps = self.trainer.estimated_stepping_batches
        return super().configure_optimizers()


def _toy(seed: int = 0) -> ScheduleLengthToy:
    L.seed_everything(seed, verbose=False)      # the same initial weights for every run
    return ScheduleLengthToy()


@pytest.mark.parametrize("num_workers, noise", [(0, "global"), (2, "sample")])
def test_mid_epoch_resume_when_configure_optimizers_reads_the_schedule_length(
        tmp_path, num_workers, noise):
    # epoch-based (estimated_stepping_batches needs the loader's length): 3 x 6 steps;
    # checkpoint at step 8 (epoch 1, batch 2 of 6); killed at the start of step 10
    data = {"num_workers": num_workers, "noise": noise}
    reference = fit(tmp_path / "ref", module=_toy(), **EPOCHS, **data)
    assert reference[1].total_steps == 18
    code = run_forked(fit, tmp_path / "run", module=_toy(), kill_at=10, every_n_train_steps=4,
                      **EPOCHS, **data)
    assert code == -9
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 8
    resumed = fit(tmp_path / "run", module=_toy(), ckpt_path=str(last), every_n_train_steps=4,
                  **EPOCHS, **data)
    assert resumed[0].global_step == reference[0].global_step == 18
    assert_same_training_state(reference, resumed)


def test_checkpoint_at_train_epoch_end_resumes_exactly(tmp_path):
    # ModelCheckpoint(every_n_epochs=1, save_on_train_epoch_end=True): saved in
    # on_train_epoch_end of epoch 0, before the epoch counter moves
    ref, resumed, ckpt_step = kill_and_resume(tmp_path, kill_at=8, ckpt={"every_n_epochs": 1},
                                              run=EPOCHS)
    assert (ckpt_step, resumed[0].global_step) == (6, 18)
    assert_same_training_state(ref, resumed)


def test_checkpoint_at_train_epoch_end_with_workers_is_the_warned_inexact_case(tmp_path, caplog):
    """Lightning does not restore the loader of a checkpoint written in on_train_epoch_end, and
    workers request epoch 0's order before any hook runs (docs/design/exact-resume.md)."""
    with caplog.at_level(logging.WARNING, logger="mmtf.reliability.resume_state"):
        ref, resumed, _ = kill_and_resume(tmp_path, kill_at=8, ckpt={"every_n_epochs": 1},
                                          run=EPOCHS, num_workers=2, noise="sample")
    assert "without restoring the train loader, and its workers already requested epoch 0's " \
           "order; epoch 1 will not match" in caplog.text
    assert max_abs_diff(ref[1], resumed[1]) > 1e-3
