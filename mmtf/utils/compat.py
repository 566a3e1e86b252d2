"""Every private attribute of Lightning, Hydra, OmegaConf and torch that mmtf touches.

A library's private names can change in any release. Each one mmtf cannot do without is read
or written here, in one small function whose docstring says why no public API serves and which
versions were checked; ``tests/unit/utils/test_private_api.py`` fails when one is used anywhere
else in the package, or when an attribute named here disappears from the installed libraries.
"""

from __future__ import annotations


# ---------------------------------------------------------------------------- Lightning: resume
def restore_train_loader_position(trainer: object) -> bool:
    """Hand the train loader the position saved in the checkpoint if Lightning has not.

    When ``configure_optimizers`` reads ``trainer.estimated_stepping_batches``, Lightning builds
    the train loader before it restores the loops, and ``FitLoop.setup_data`` then never loads
    the saved loader state. This does what it would have done: load the state and re-create the
    fetcher's iterator. No public API loads a pending loader state (checked with lightning
    2.6.6). Returns True when it loaded one.
    """
    fit_loop = trainer.fit_loop
    pending = getattr(fit_loop, "_combined_loader_states_to_load", None)
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    if (not pending or not fit_loop.restarting or fetcher is None
            or getattr(fit_loop, "_combined_loader", None) is None):
        return False
    fit_loop._load_combined_loader_states()
    iter(fetcher)            # the loader's new iterator starts from the loaded position
    return True


# ---------------------------------------------------------------------------- Lightning: SIGTERM
def request_sigterm_stop(trainer: object) -> None:
    """Set Lightning's own "SIGTERM received" flag, so its loops stop after the current batch.

    ``Trainer.received_sigterm`` is a read-only property over the signal connector's flag; no
    public setter exists (checked with lightning 2.6.6).
    """
    trainer._signal_connector.received_sigterm = True


# ---------------------------------------------------------------------------- Lightning: last.ckpt
def checkpoint_monitor_candidates(callback: object, trainer: object) -> dict[str, object]:
    """``ModelCheckpoint``'s values for formatting a file name (metrics, epoch, step).

    Private in ``ModelCheckpoint`` (checked with lightning 2.6.6); :class:`LastCheckpoint`
    needs the same values to name and write ``last.ckpt`` as its base class does.
    """
    return callback._monitor_candidates(trainer)


def checkpoint_save_last(callback: object, trainer: object, candidates: dict[str, object]) -> None:
    """Write ``last.ckpt`` the way ``ModelCheckpoint(save_last=True)`` does (link or copy,
    bookkeeping of ``last_model_path``); private, no public equivalent (lightning 2.6.6)."""
    callback._save_last_checkpoint(trainer, candidates)


def checkpoint_saved_at_step(callback: object) -> int:
    """The global step of ``callback``'s latest save; private (lightning 2.6.6)."""
    return int(callback._last_global_step_saved)


def checkpoint_every_n_train_steps(callback: object) -> int:
    """``ModelCheckpoint``'s step trigger (0: none); only the constructor argument is public,
    the stored value is private (lightning 2.6.6)."""
    return int(callback._every_n_train_steps)
