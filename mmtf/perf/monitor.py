"""Training efficiency in every run: samples/s, tokens/s, model FLOP/s and MFU, per device.

:class:`EfficiencyMonitor` (``efficiency`` in ``conf/callbacks/default.yaml``) logs the device,
precision and SDPA kernels once, then every ``log_every_n_steps`` ``perf/samples_per_s``,
``perf/tokens_per_s``, ``perf/model_flops_per_s`` and ``perf/mfu`` (this device's batches over
wall time, data wait included, validation excluded). MFU divides the
:class:`~mmtf.perf.flops.FlopCounter` rate by the matmul rate measured at start
(:func:`~mmtf.perf.flops.matmul_flops_per_s`) or ``peak_flops_per_s``; a window that beats it
measures again. On CUDA it turns on TF32 matmuls if the process has not chosen a precision.

It also keeps the run's training cost: the model FLOPs of every training batch taken (counted
per batch, as clip lengths differ) and the samples seen, summed over the DDP ranks, logged as
``perf/train_flops`` and ``perf/train_samples`` at every validation and epoch end, saved in
checkpoints (a resumed run counts on from the interrupted one) and written to ``metrics.json``
(``train_flops``, ``train_samples``: :meth:`EfficiencyMonitor.run_record`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from mmtf.perf.device import bf16_warning, describe_cpu, sdpa_backends
from mmtf.perf.flops import FlopCounter, matmul_flops_per_s
from mmtf.tasks.base import batch_inputs
from mmtf.utils.cpu_sharing import describe as describe_cpu_sharing
from mmtf.utils.distributed import gather_objects, world

log = logging.getLogger(__name__)


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of Lightning's ``trainer.precision`` string."""
    precision = str(precision)
    if "bf16" in precision:
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32


class EfficiencyMonitor(Callback):
    """Log samples/s, tokens/s, model FLOP/s and MFU of training; see the module docstring.

    Args:
        log_every_n_steps: steps per logged window; None = the trainer's ``log_every_n_steps``.
        peak_flops_per_s: the MFU denominator of one device; None = measure the dense matmul
            rate at the start of fit (about a second).
        clock: seconds, monotonic (``time.perf_counter``); replaceable for tests.
    """

    def __init__(self, *, log_every_n_steps: int | None = None,
                 peak_flops_per_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.peak_flops_per_s = peak_flops_per_s
        # A measured denominator may be measured again, a few times at most: a model that
        # truly outruns the square GEMM must not pay ~0.3 s every window.
        self._remeasures_left = 3 if peak_flops_per_s is None else 0
        self.clock = clock
        self._device = torch.device("cpu")
        self._dtype = torch.float32
        self._counter: FlopCounter | None = None
        self._batch_flops = 0                # the current batch's, once its forward has run
        # Training cost of this rank since the start of the run: on resume rank 0 takes the
        # checkpoint's total of all ranks, the others start at 0 (sums stay exact).
        self._cost = {"train_flops": 0, "train_samples": 0}
        self._final: dict[str, int] = {}     # the ranks' sum at the end of fit
        self._cost_logged_at = -1
        self._mark = 0.0
        self._window = self._zero()
        self._epoch = self._zero()
        self.last: dict[str, float] = {}      # the last logged window's metrics

    @staticmethod
    def _zero() -> dict[str, float]:
        return {"seconds": 0.0, "samples": 0, "tokens": 0, "flops": 0, "steps": 0}

    # ------------------------------------------------------------------ start
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._device = trainer.strategy.root_device
        precision = str(trainer.precision)
        dtype = compute_dtype(precision)
        warning = bf16_warning(precision, self._device.type)
        if warning:
            log.warning(warning)
        if self._device.type == "cuda" and torch.get_float32_matmul_precision() == "highest":
            torch.set_float32_matmul_precision("high")          # TF32 for float32 matmuls
        if self.peak_flops_per_s is None:
            self.peak_flops_per_s = matmul_flops_per_s(self._device, dtype)
        self._dtype = dtype
        kernels = sdpa_backends(pl_module, self._device, dtype)
        where = (describe_cpu() if self._device.type == "cpu"
                 else f"{self._device} ({torch.cuda.get_device_name(self._device)})"
                 if self._device.type == "cuda" else str(self._device))
        tf32 = torch.get_float32_matmul_precision() != "highest"
        log.info("[perf] %s; %s; precision %s (compute %s)%s; SDPA kernels: %s; dense %s matmul "
                 "%.1f GFLOP/s (the MFU denominator)", where, describe_cpu_sharing(), precision,
                 str(dtype).removeprefix("torch."),
                 f", TF32 matmuls {'on' if tf32 else 'off'}" if self._device.type == "cuda" else "",
                 ", ".join(f"{k}={v}" for k, v in kernels.items()) or "none",
                 str(dtype).removeprefix("torch."), self.peak_flops_per_s / 1e9)

    # ------------------------------------------------------------------ counting
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch = self._zero()
        self._mark = self.clock()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._counter = FlopCounter(pl_module).__enter__()
        self._batch_flops = 0

    def _close_counter(self) -> None:
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)
            self._batch_flops = counter.training_flops

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           loss: torch.Tensor) -> None:
        # The forward is complete: forwards that activation checkpointing re-runs inside the
        # backward are recomputation, not model FLOPs.
        self._close_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._close_counter()             # a step that skipped its backward closes here
        samples = batch_inputs(batch)[0].shape[0]
        self._window["flops"] += self._batch_flops
        self._window["samples"] += samples
        # Before any checkpoint of this batch: Lightning runs checkpoint callbacks last.
        self._cost["train_flops"] += self._batch_flops
        self._cost["train_samples"] += samples
        self._window["tokens"] += _target_tokens(batch, getattr(pl_module, "model", None))
        self._window["steps"] += 1
        every = self.log_every_n_steps or trainer.log_every_n_steps
        if self._window["steps"] >= every:
            self._flush(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush(trainer)              # validation time is not training time

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._log_cost(trainer)
        self._mark = self.clock()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush(trainer)
        self._log_cost(trainer)
        total = self._epoch
        if total["steps"] and total["seconds"] > 0 and trainer.is_global_zero:
            rates = self._rates(total)
            log.info("[perf] train epoch %d: %d samples in %.1f s: %.1f samples/s, %.0f tokens/s, "
                     "%.2f GFLOP/s model, MFU %.1f%%", trainer.current_epoch, total["samples"],
                     total["seconds"], rates["perf/samples_per_s"], rates["perf/tokens_per_s"],
                     rates["perf/model_flops_per_s"] / 1e9, 100 * rates["perf/mfu"])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._final = self.training_cost()

    # ------------------------------------------------------------------ training cost
    def training_cost(self) -> dict[str, int]:
        """``{"train_flops", "train_samples"}`` of the run so far, all ranks summed: the model
        FLOPs of every training batch taken and the samples in them. Collective under DDP (call
        it on every rank)."""
        ranks = gather_objects(dict(self._cost))
        return {key: sum(r[key] for r in ranks) for key in self._cost}

    def _log_cost(self, trainer: L.Trainer) -> None:
        """Log :meth:`training_cost` once per optimizer step (validation and epoch end)."""
        if self._cost_logged_at == trainer.global_step:
            return
        self._cost_logged_at = trainer.global_step
        cost = self.training_cost()
        for logger in trainer.loggers:
            logger.log_metrics({f"perf/{k}": float(v) for k, v in cost.items()},
                               step=trainer.global_step)

    def run_record(self) -> dict[str, int]:
        """What ``metrics.json`` records: :meth:`training_cost` at the end of fit ({} before)."""
        return dict(self._final)

    def state_dict(self) -> dict[str, int]:
        """The run's training cost, all ranks summed. Collective under DDP, like
        :class:`~mmtf.reliability.ResumeState`'s: ``trainer.save_checkpoint`` runs on every rank."""
        return self.training_cost()

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        rank = world()[1]
        self._cost = {key: int(state_dict.get(key, 0)) if rank == 0 else 0 for key in self._cost}

    def _remeasure_peak(self, achieved: float) -> None:
        """The model ran faster than the matmul rate measured at start: that measurement met a
        busy device (another job on a shared CPU, a GPU still clocking up). Measure again and
        keep the higher rate, so MFU is not reported over 100 % for the rest of the run."""
        again = matmul_flops_per_s(self._device, self._dtype)
        if again > self.peak_flops_per_s:
            log.info("[perf] MFU denominator re-measured: %.1f GFLOP/s (%.1f at start, below "
                     "the model's %.1f: the device was busy then)", again / 1e9,
                     self.peak_flops_per_s / 1e9, achieved / 1e9)
            self.peak_flops_per_s = again

    # ------------------------------------------------------------------ output
    def _rates(self, totals: dict[str, float]) -> dict[str, float]:
        seconds = totals["seconds"]
        flops_per_s = totals["flops"] / seconds
        return {"perf/samples_per_s": totals["samples"] / seconds,
                "perf/tokens_per_s": float(totals["tokens"]) / seconds,
                "perf/model_flops_per_s": flops_per_s,
                "perf/mfu": flops_per_s / self.peak_flops_per_s if self.peak_flops_per_s else 0.0}

    def _flush(self, trainer: L.Trainer) -> None:
        """Close the current window: time it, add it to the epoch, log its rates."""
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)   # the window's kernels have finished
        now = self.clock()
        window, self._window = self._window, self._zero()
        window["seconds"] = now - self._mark
        self._mark = now
        if not window["steps"] or window["seconds"] <= 0:
            return
        window["tokens"] = int(window["tokens"])
        for key, value in window.items():
            self._epoch[key] += value
        self.last = self._rates(window)
        if self.last["perf/mfu"] > 1.0 and self._remeasures_left:
            self._remeasures_left -= 1
            self._remeasure_peak(self.last["perf/model_flops_per_s"])
            self.last = self._rates(window)
            self._mark = self.clock()                   # the measurement is not training time
        for logger in trainer.loggers:
            logger.log_metrics(self.last, step=trainer.global_step)


def _target_tokens(batch: Any, model: Any) -> int | torch.Tensor:
    """Scored target tokens of a captioning batch (``tokens[:, 1:]`` that are not pad), kept on
    the batch's device (no synchronisation per step); 0 for batches without tokens."""
    tokens = batch.get("tokens") if isinstance(batch, dict) else None
    if tokens is None:
        return 0
    pad = getattr(model, "pad_id", 0)
    return (tokens[:, 1:] != pad).sum()
