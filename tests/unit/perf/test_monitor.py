"""EfficiencyMonitor: logged rates are counts over a fake clock's time, MFU over a given peak."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn

from mmtf.perf import EfficiencyMonitor
from mmtf.perf.monitor import compute_dtype

STEP_SECONDS = 0.25
BATCH, SAMPLES, PAD = 4, 8, 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Capture(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    name, version = "capture", 0

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if "perf/mfu" in metrics:           # the rate windows (not the run's cost rows)
            self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


class Tiny(L.LightningModule):
    """A linear 'model' whose every training step takes STEP_SECONDS of the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.model = nn.Linear(SAMPLES, 16, bias=False)
        self.model.pad_id = PAD
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.now += STEP_SECONDS
        return self.model(batch["audio"]).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def batches(n: int) -> list[dict]:
    tokens = torch.tensor([[1, 5, 6, 2, PAD, PAD]] * BATCH)      # 3 scored tokens per row
    return [{"audio": torch.randn(BATCH, SAMPLES), "audio_lengths": torch.full((BATCH,), SAMPLES),
             "tokens": tokens} for _ in range(n)]


def fit(monitor: EfficiencyMonitor, clock: FakeClock, n: int = 8) -> Capture:
    logger = Capture()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=logger, callbacks=[monitor],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=50)
    loader = torch.utils.data.DataLoader(batches(n), batch_size=None)
    trainer.fit(Tiny(clock), train_dataloaders=loader)
    return logger


def test_rates_are_counts_over_the_fake_clock():
    clock = FakeClock()
    monitor = EfficiencyMonitor(log_every_n_steps=4, peak_flops_per_s=1e4, clock=clock)
    logger = fit(monitor, clock)
    assert [step for step, _ in logger.rows] == [4, 8]
    flops_per_step = 3 * 2 * SAMPLES * 16 * BATCH        # forward + backward of one Linear
    for _, row in logger.rows:
        # 4 steps of BATCH samples and 3 * BATCH tokens in 4 * STEP_SECONDS.
        assert row["perf/samples_per_s"] == pytest.approx(BATCH / STEP_SECONDS)
        assert row["perf/tokens_per_s"] == pytest.approx(3 * BATCH / STEP_SECONDS)
        assert row["perf/model_flops_per_s"] == pytest.approx(flops_per_step / STEP_SECONDS)
        assert row["perf/mfu"] == pytest.approx(flops_per_step / STEP_SECONDS / 1e4)


def test_a_partial_window_is_logged_at_epoch_end(caplog):
    clock = FakeClock()
    monitor = EfficiencyMonitor(log_every_n_steps=4, peak_flops_per_s=1e4, clock=clock)
    with caplog.at_level(logging.INFO, logger="mmtf.perf.monitor"):
        logger = fit(monitor, clock, n=6)
    assert [step for step, _ in logger.rows] == [4, 6]
    assert logger.rows[-1][1]["perf/samples_per_s"] == pytest.approx(BATCH / STEP_SECONDS)
    assert "24 samples in 1.5 s: 16.0 samples/s" in caplog.text


def test_a_denominator_measured_on_a_busy_device_is_measured_again(monkeypatch, caplog):
    # The start-of-fit matmul rate (1e3 FLOP/s) is below what the model then achieves (12288
    # FLOP/s): measured while another job held the CPU. The epoch's MFU must use a new
    # measurement (1e6), not report 1229 %.
    rates = iter([1e3, 1e6])
    monkeypatch.setattr("mmtf.perf.monitor.matmul_flops_per_s", lambda *a, **k: next(rates))
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger="mmtf.perf.monitor"):
        logger = fit(EfficiencyMonitor(log_every_n_steps=4, clock=clock), clock)
    achieved = 3 * 2 * SAMPLES * 16 * BATCH / STEP_SECONDS
    assert [row["perf/mfu"] for _, row in logger.rows] == pytest.approx([achieved / 1e6] * 2)
    assert "MFU denominator re-measured: 0.0 GFLOP/s" in caplog.text
    assert f"MFU {100 * achieved / 1e6:.1f}%" in caplog.text
    # A model that keeps beating every measurement costs three measurements, not one a window.
    calls = []
    monkeypatch.setattr("mmtf.perf.monitor.matmul_flops_per_s",
                        lambda *a, **k: calls.append(1) or 1e3)
    fit(EfficiencyMonitor(log_every_n_steps=1, clock=clock), clock)
    assert len(calls) == 1 + 3
    # A denominator the user gave is theirs: never replaced.
    monkeypatch.setattr("mmtf.perf.monitor.matmul_flops_per_s", lambda *a, **k: 1 / 0)
    logger = fit(EfficiencyMonitor(log_every_n_steps=4, peak_flops_per_s=1e3, clock=clock), clock)
    assert logger.rows[-1][1]["perf/mfu"] == pytest.approx(achieved / 1e3)


def test_start_line_names_precision_and_kernels(caplog):
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger="mmtf.perf.monitor"):
        fit(EfficiencyMonitor(peak_flops_per_s=1e4, clock=clock), clock, n=1)
    assert "precision 32-true (compute float32)" in caplog.text
    assert "SDPA kernels: none" in caplog.text       # the tiny model has no attention


@pytest.mark.parametrize(("precision", "dtype"), [("32-true", torch.float32),
                                                  ("bf16-mixed", torch.bfloat16),
                                                  ("16-mixed", torch.float16),
                                                  ("64-true", torch.float64)])
def test_compute_dtype(precision, dtype):
    assert compute_dtype(precision) == dtype


def test_bf16_on_a_cpu_without_native_bf16_warns_once_at_start(monkeypatch, caplog):
    import mmtf.perf.device as device
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx2": True, "avx512f": False,
                                                      "avx512_bf16": False, "amx_bf16": False})
    clock = FakeClock()
    logger = Capture()
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", max_epochs=1, logger=logger,
                        callbacks=[EfficiencyMonitor(peak_flops_per_s=1e4, clock=clock)],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    with caplog.at_level(logging.INFO, logger="mmtf.perf.monitor"):
        trainer.fit(Tiny(clock), train_dataloaders=torch.utils.data.DataLoader(batches(2),
                                                                                batch_size=None))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "trainer.precision=bf16-mixed" in warnings[0].message and "avx512_bf16" in \
        warnings[0].message
    assert "precision bf16-mixed (compute bfloat16)" in caplog.text
