"""Invariants of the shipped experiment recipes (composed exactly as ``mmtf.train`` composes them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

CONF = Path(__file__).resolve().parents[2] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _trainer(experiment: str, *overrides: str):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=[f"experiment={experiment}", *overrides]).trainer


def _last_epoch_validated(trainer) -> bool:
    # Lightning validates after epoch e (1-based) when e % check_val_every_n_epoch == 0.
    return trainer.max_epochs % trainer.check_val_every_n_epoch == 0


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_validates_its_last_epoch(experiment):
    """The best checkpoint (tested after training) must be able to be the final weights."""
    trainer = _trainer(experiment)
    assert _last_epoch_validated(trainer), (
        f"experiment={experiment}: max_epochs {trainer.max_epochs} is not a multiple of "
        f"check_val_every_n_epoch {trainer.check_val_every_n_epoch}")


def test_an_odd_epoch_count_leaves_the_last_epoch_unvalidated():
    """The check above can fail: 17 epochs validated every 2nd leave epoch 17 unscored."""
    assert not _last_epoch_validated(_trainer("audio_captioning", "trainer.max_epochs=17",
                                              "trainer.check_val_every_n_epoch=2"))


def test_the_default_audio_run_keeps_its_fixed_masks_bit_for_bit():
    """experiment=audio_captioning's adaptive time masks bind on none of its clips (>= 2 s of
    20 ms frames), so it trains with the masks it was measured with (fixed mode's draws)."""
    import torch

    from mmtf.encoders import SpecAugment

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=audio_captioning"])
    aug, front = cfg.model.encoder.spec_augment, cfg.model.encoder.frontend
    keys = ("freq_masks", "time_masks", "time_mask_width")
    adaptive = SpecAugment(**{k: aug[k] for k in keys}, freq_mask_width=aug.freq_mask_width,
                           time_mask_mode=aug.time_mask_mode,
                           time_mask_fraction=aug.time_mask_fraction,
                           time_mask_multiplicity=aug.time_mask_multiplicity).train()
    fixed = SpecAugment(**{k: aug[k] for k in keys}, freq_mask_width=aug.freq_mask_width,
                        time_mask_mode="fixed").train()
    assert aug.time_mask_mode == "adaptive"
    shortest = int(cfg.data.synthetic.min_seconds * front.sample_rate) // front.hop_length + 1
    frames = torch.arange(shortest, shortest + 101)                  # 2.0 .. 6.0 s
    feats = torch.randn(len(frames), front.n_mels, int(frames.max())) + 5.0
    torch.manual_seed(0)
    a = fixed(feats, frames)
    torch.manual_seed(0)
    assert torch.equal(a, adaptive(feats, frames))
