"""The training cost of a run (model FLOPs and samples of every batch taken) and the time to a
target metric: against torch's own FLOP counter, hand counts and scripted runs, across resume."""

from __future__ import annotations

import json
import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mmtf.decoders import EncoderDecoder, TextDecoder
from mmtf.encoders import AudioEncoder
from mmtf.errors import ConfigError
from mmtf.perf import EfficiencyMonitor, FlopCounter, TimeToTarget
from mmtf.train import report, run_records
from tests.unit.presets import flat

FEATURES, OUT = 8, 16
# Batch sizes of the scripted epoch: rows differ per batch, as clip lengths do.
ROWS = [4, 2, 3]
FLOPS_PER_ROW = 3 * 2 * FEATURES * OUT            # forward + backward of one bias-free Linear


# ---------------------------------------------------------------- one step vs torch's counter
def test_a_captioner_step_equals_flop_counter_mode_up_to_the_documented_differences():
    """torch.utils.flop_counter counts the aten matmuls a step runs. mmtf's count differs in
    exactly three places (docs/guide/runs.md): the first conv's input needs no gradient (torch
    counts its backward once, mmtf twice), the mel filterbank matmul is not a model weight (torch
    counts it, mmtf does not) and causal attention computes about half its scores (mmtf counts
    n (n + 1) / 2 query-key pairs, torch's SDPA formula n * n)."""
    c, f, hop, vocab = 32, 16, 160, 50
    torch.manual_seed(0)
    encoder = flat(AudioEncoder, dim=c, depth=1, num_heads=4, n_mels=f, hop_length=hop,
                   mlp_ratio=2.0)
    decoder = flat(TextDecoder, vocab_size=vocab, dim=c, depth=1, num_heads=4, context_dim=c,
                   mlp_ratio=2.0)
    model = EncoderDecoder(encoder=encoder, decoder=decoder)
    b, samples, n = 3, 16000, 6
    tokens = torch.tensor([[1, 5, 6, 7, 8, 2]] * b)
    # The math kernel: torch's counter has no formula for the CPU's fused SDPA kernel.
    with (FlopCounter(model) as ours, sdpa_kernel(SDPBackend.MATH),
          FlopCounterMode(display=False) as torch_count):
        out = model(torch.randn(b, samples), torch.full((b,), samples), tokens)
        out.logits.square().mean().backward()
    frames = samples // hop + 1                              # 101
    t1 = (frames - 1) // 2 + 1                               # 51 after conv1
    conv1_forward = 2 * f * 3 * c * b * t1
    n_freq = encoder.frontend.n_fft // 2 + 1
    mel_forward = 2 * n_freq * f * b * frames
    nd = n - 1                                               # the decoder reads tokens[:, :-1]
    causal_extra = 3 * 4 * b * c * (nd * nd - nd * (nd + 1) // 2)
    assert torch_count.get_total_flops() == (ours.training_flops - conv1_forward + mel_forward
                                             + causal_extra)


# ---------------------------------------------------------------- the run's cumulative cost
class Capture(Logger):
    name, version = "capture", 0

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


class Scripted(L.LightningModule):
    """A Linear trained on ROWS-sized batches; validation logs the next value of ``script``."""

    def __init__(self, script: list[float] | None = None) -> None:
        super().__init__()
        self.net = nn.Linear(FEATURES, OUT, bias=False)
        self.script = script or []

    def training_step(self, batch, batch_idx):
        return self.net(batch["audio"]).square().mean()

    def validation_step(self, batch, batch_idx):
        value = self.script[min(self.current_epoch, len(self.script) - 1)]
        self.log("val/acc", value)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(rows: list[int]) -> torch.utils.data.DataLoader:
    data = [{"audio": torch.randn(r, FEATURES), "audio_lengths": torch.full((r,), FEATURES)}
            for r in rows]
    return torch.utils.data.DataLoader(data, batch_size=None)


def fit(callbacks: list, epochs: int, script: list[float] | None = None, *,
        ckpt_path: str | None = None) -> tuple[L.Trainer, Capture]:
    logger = Capture()
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=logger,
                        callbacks=callbacks, enable_checkpointing=any(
                            isinstance(c, ModelCheckpoint) for c in callbacks),
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, log_every_n_steps=1)
    torch.manual_seed(0)
    trainer.fit(Scripted(script), train_dataloaders=loader(ROWS),
                val_dataloaders=loader([1]) if script else None, ckpt_path=ckpt_path,
                weights_only=True)
    return trainer, logger


def monitor() -> EfficiencyMonitor:
    return EfficiencyMonitor(peak_flops_per_s=1e9)


def test_the_run_counts_every_batch_taken_and_logs_the_total_at_each_epoch_end():
    trainer, logger = fit([effic := monitor()], epochs=2)
    rows = 2 * sum(ROWS)
    assert effic.run_record() == {"train_flops": rows * FLOPS_PER_ROW, "train_samples": rows}
    logged = [(step, m["perf/train_samples"], m["perf/train_flops"]) for step, m in logger.rows
              if "perf/train_samples" in m]
    assert logged == [(3, 9, 9 * FLOPS_PER_ROW), (6, 18, 18 * FLOPS_PER_ROW)]
    assert run_records(trainer) == effic.run_record()


def test_a_checkpoint_holds_the_count_of_its_own_batch(tmp_path):
    # A mid-epoch checkpoint after batch 2 (rows 4 + 2): Lightning runs checkpoint callbacks
    # after the others, so the count includes the batch that ends at the save.
    save = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1,
                           filename="{step}")
    fit([monitor(), save], epochs=1)
    state = torch.load(tmp_path / "step=2.ckpt", weights_only=True)["callbacks"]
    [cost] = [v for k, v in state.items() if k.startswith("EfficiencyMonitor")]
    assert cost == {"train_flops": 6 * FLOPS_PER_ROW, "train_samples": 6}


def test_a_resumed_run_reports_what_the_uninterrupted_run_does(tmp_path):
    script = [0.5, 0.94, 0.951, 0.93]
    straight = [monitor(), TimeToTarget("val/acc", 0.95)]
    fit(straight, epochs=4, script=script)
    assert straight[1].run_record()["target_reached"]["epoch"] == 2
    # Interrupted before the target (after epoch 1) and after it (epoch 2): the resumed run
    # reports the same cost and the same time to target.
    for stop_after in (2, 3):
        folder = tmp_path / str(stop_after)
        fit([monitor(), TimeToTarget("val/acc", 0.95), ModelCheckpoint(folder, save_last=True)],
            epochs=stop_after, script=script)
        # After the target the rest of the script never reaches it: the record is the saved one.
        rest = script if stop_after == 2 else [0.1] * len(script)
        resumed = [monitor(), TimeToTarget("val/acc", 0.95)]
        fit(resumed, epochs=4, script=rest, ckpt_path=str(folder / "last.ckpt"))
        assert resumed[0].run_record() == straight[0].run_record() != {}
        assert resumed[1].run_record() == straight[1].run_record()


# ---------------------------------------------------------------- time to target
@pytest.mark.parametrize(("script", "target", "mode", "epoch"), [
    ([0.5, 0.94, 0.951, 0.93, 0.97], 0.95, "max", 2),
    # Equal counts as reached, also where float32 logging rounds 285/300 below 0.95.
    ([0.5, 285 / 300, 0.96, 0.97, 0.98], 0.95, "max", 1),
    ([2.0, 1.5, 0.9, 0.7, 0.4], 0.8, "min", 3),
    ([0.5, 0.94, 0.949, 0.93, 0.9], 0.95, "max", None),    # never reached: null
])
def test_the_first_validation_that_reached_the_target_is_recorded(script, target, mode, epoch):
    callbacks = [monitor(), TimeToTarget("val/acc", target, mode)]
    trainer, _ = fit(callbacks, epochs=len(script), script=script)
    record = run_records(trainer)
    assert record["target"] == {"metric": "val/acc", "value": target, "mode": mode}
    if epoch is None:
        assert record["target_reached"] is None
    else:
        rows = (epoch + 1) * sum(ROWS)
        assert record["target_reached"] == {
            "value": pytest.approx(script[epoch]), "epoch": epoch,
            "step": (epoch + 1) * len(ROWS), "train_samples": rows,
            "train_flops": rows * FLOPS_PER_ROW}
    assert trainer.current_epoch == len(script)              # stop: false trains on
    assert record["train_samples"] == len(script) * sum(ROWS)


def test_stop_ends_training_at_the_target():
    callbacks = [monitor(), TimeToTarget("val/acc", 0.95, stop=True)]
    trainer, _ = fit(callbacks, epochs=5, script=[0.5, 0.94, 0.951, 0.93, 0.97])
    assert trainer.global_step == 3 * len(ROWS)
    assert callbacks[0].run_record()["train_samples"] == 3 * sum(ROWS)


def test_no_target_adds_nothing_and_bad_settings_are_one_line_errors():
    trainer, _ = fit([TimeToTarget("val/acc", None)], epochs=1, script=[0.5])
    assert run_records(trainer) == {}
    with pytest.raises(ConfigError, match="target.mode='up'"):
        TimeToTarget("val/acc", 0.9, mode="up")
    with pytest.raises(ConfigError, match="needs target.metric"):
        TimeToTarget(None, 0.9)



def test_a_target_metric_this_run_does_not_log_is_said_once_and_recorded(caplog):
    """experiment=audio_captioning data=clotho: no event accuracy on real captions. The run
    goes on, the log says which metric is missing and what is logged, metrics.json says why."""
    target = TimeToTarget("val/cider_d", 0.9)
    with caplog.at_level(logging.WARNING, logger="mmtf.perf.target"):
        trainer, _ = fit([target], epochs=2, script=[0.5, 0.6])
    assert trainer.current_epoch == 2
    warned = [r.getMessage() for r in caplog.records if "target.metric" in r.getMessage()]
    assert len(warned) == 1 and "'val/cider_d' is not logged" in warned[0]
    assert "val/acc" in warned[0]
    assert run_records(trainer) == {"target": {"metric": "val/cider_d", "not_logged": True},
                                    "target_reached": None}


def test_metrics_json_holds_the_records_beside_the_metrics(tmp_path):
    class Task:
        last_predictions: dict = {}

    records = {"train_flops": 10 ** 13, "train_samples": 66000,
               "target_reached": None}
    report({"test/acc": 0.5, "train/loss_step": 1.0}, Task(), tmp_path, records)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written == {"test/acc": 0.5, **records}
