"""Time to target: the first validation at which a metric reached its target, in training cost.

:class:`TimeToTarget` (``time_to_target`` in ``conf/callbacks/default.yaml``, set by the root
config's ``target.*`` keys) checks ``target.metric`` after every validation of fit. The first one
at which it reached ``target.value`` (``>=`` for ``mode: max``, ``<=`` for ``min``, compared in
the dtype the metric was logged in) is recorded:
Lightning's epoch (0-based, as in checkpoint names) and global step, and the training samples and
model FLOPs spent until then (:meth:`mmtf.perf.EfficiencyMonitor.training_cost`), which do not
depend on the machine. ``metrics.json`` gets ``target`` and ``target_reached`` (null: never
reached). With ``stop: true`` training stops there (Lightning's ``trainer.should_stop``). The
record is saved in checkpoints: a resumed run reports what the uninterrupted one would.
Why: docs/design/time-to-target.md"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from mmtf.errors import ConfigError

log = logging.getLogger(__name__)

MODES = ("max", "min")


def reached(value: float, target: float, mode: str) -> bool:
    """Whether ``value`` meets ``target``: at least it (``max``) or at most it (``min``)."""
    return value >= target if mode == "max" else value <= target


class TimeToTarget(Callback):
    """Record (and optionally stop at) the first validation where ``metric`` reached ``value``.

    Args:
        metric: a validation metric key, e.g. ``val/event_accuracy``.
        value: the target; None = no target (the callback does nothing).
        mode: ``max`` (higher is better: reached at ``>= value``) or ``min`` (``<= value``).
        stop: stop training at that validation.
    """

    def __init__(self, metric: str | None = None, value: float | None = None, mode: str = "max",
                 stop: bool = False) -> None:
        if mode not in MODES:
            raise ConfigError(f"target.mode={mode!r}: use max (higher is better) or min.")
        if value is not None and not metric:
            raise ConfigError(f"target.value={value} needs target.metric, e.g. "
                              f"target.metric=val/event_accuracy.")
        self.metric = metric
        self.value = None if value is None else float(value)
        self.mode = mode
        self.stop = bool(stop)
        self.reached_at: dict[str, Any] | None = None
        self.missing = False        # the metric was never logged: no time to target

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.value is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self.reached_at is None:
            if self.metric not in trainer.callback_metrics:
                # An experiment's target may not exist on other data (event accuracy needs
                # the built-in captions): say so once and record why, never stop the run.
                logged = sorted(k for k in trainer.callback_metrics if not k.endswith("_step"))
                self.missing = True
                self.value = None
                log.warning("[target] target.metric=%r is not logged by this run, so no time "
                            "to target is recorded; logged after validation: %s. Set "
                            "target.metric=<one of them>, or target.value=null for no target.",
                            self.metric, ", ".join(logged) or "nothing")
                return
            logged = torch.as_tensor(trainer.callback_metrics[self.metric])
            observed = float(logged)
            # In the metric's own dtype: 285/300 logged in float32 is 0.9499999881, which must
            # reach a target of 0.95 (also 0.9499999881 in float32).
            target = float(torch.tensor(self.value, dtype=logged.dtype))
            # Every rank decides alike (the cost below is a collective).
            now = trainer.strategy.reduce_boolean_decision(
                reached(observed, target, self.mode), all=False)
            if now:
                self.reached_at = self._record(trainer, observed)
                log.info("[target] %s %s %g first at epoch %d, step %d: %s",
                         self.metric, ">=" if self.mode == "max" else "<=", self.value,
                         trainer.current_epoch, trainer.global_step,
                         ", ".join(f"{k} {v}" for k, v in self.reached_at.items()
                                   if k.startswith("train_")))
        if self.reached_at is not None and self.stop:
            trainer.should_stop = True

    def _record(self, trainer: L.Trainer, observed: float) -> dict[str, Any]:
        monitor = next((cb for cb in trainer.callbacks if callable(getattr(cb, "training_cost",
                                                                           None))), None)
        if monitor is None:
            log.warning("[target] no EfficiencyMonitor (callbacks.efficiency): the time to "
                        "target has no training FLOPs or samples.")
        cost = (monitor.training_cost() if monitor is not None
                else {"train_flops": None, "train_samples": None})
        return {"value": observed, "epoch": trainer.current_epoch, "step": trainer.global_step,
                **cost}

    def run_record(self) -> dict[str, Any]:
        """What ``metrics.json`` records: ``target`` and ``target_reached`` ({} without one)."""
        if self.missing:
            return {"target": {"metric": self.metric, "not_logged": True},
                    "target_reached": None}
        if self.value is None:
            return {}
        return {"target": {"metric": self.metric, "value": self.value, "mode": self.mode},
                "target_reached": None if self.reached_at is None else dict(self.reached_at)}

    def state_dict(self) -> dict[str, Any]:
        return {"reached_at": self.reached_at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.reached_at = state_dict.get("reached_at")
