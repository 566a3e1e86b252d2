"""Reliability end to end, through ``python -m mmtf.train`` and ``mmtf.train.train`` on the tiny
audio-captioning config: SIGKILL + ``ckpt_path=last`` resumes exactly (mid-epoch and at an epoch
boundary), checkpoints go through AtomicCheckpointIO, ``ckpt_path=last|auto`` resolution and its
errors, SIGTERM -> last.ckpt + exit 143, multirun x DDP runs each job once, a failing DDP rank
ends the job promptly, and NaN losses stop (or skip) with a message naming step and batch.

The small callbacks at the top are test instruments, added to a run with
``+callbacks.<name>._target_=tests.integration.test_reliability.<Class>`` (subprocesses get the
repository on ``PYTHONPATH``). None of them draws random numbers, so they do not perturb the runs
they observe. Tiny data: 12 training clips, batch 4 -> 3 optimizer steps per epoch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy

from mmtf.checkpoint_io import EMA_STATE_KEY
from mmtf.reliability import NonFiniteLossError
from mmtf.train import train
from tests.forked import run_main
from tests.unit.reliability.toy import run_forked

from .conftest import REPO, cli_in_process, compose_train, tiny_overrides

HERE = "tests.integration.test_reliability"
# One thread: runs that are compared bit for bit use the same kernels in every process.
ENV = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# ---------------------------------------------------------------------------- instruments
class KillAtStep(Callback):
    """Send ``signum`` (default SIGKILL) to this process at the start of the training batch
    that follows ``step`` optimizer steps, i.e. after every checkpoint of step ``step``."""

    def __init__(self, *, step: int, signum: int = int(signal.SIGKILL)) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class StepMarker(Callback):
    """Print ``mmtf-test: rank R done step N`` after every training batch (and sleep, so an
    outside process can act while the run is still training)."""

    def __init__(self, *, sleep: float = 0.0) -> None:
        self.sleep = sleep

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        print(f"mmtf-test: rank {trainer.global_rank} done step {trainer.global_step}",
              flush=True)
        time.sleep(self.sleep)


class RaiseAtStep(Callback):
    """Raise on rank ``rank`` at the start of the batch after ``step`` optimizer steps."""

    def __init__(self, *, step: int, rank: int) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            message = f"injected failure on rank {self.rank} at step {self.step}"
            print(f"mmtf-test: {message}", flush=True)
            raise RuntimeError(message)


class PoisonBatch(Callback):
    """Fill the audio of the batches after ``steps`` optimizer steps with NaN."""

    def __init__(self, *, steps: list[int]) -> None:
        self.steps = set(steps)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step in self.steps:
            batch["audio"].fill_(float("nan"))


class Recorder(Callback):
    """Record, at the start of training, where the fit starts and what it runs with; kept in
    ``Recorder.records`` (in-process runs) and appended as JSON lines to ``path``."""

    records: list[dict[str, Any]] = []

    def __init__(self, *, path: str | None = None) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        record = {"start_step": trainer.global_step, "rank": trainer.global_rank,
                  "pid": os.getpid(), "dir": str(Path(trainer.default_root_dir).resolve()),
                  "checkpoint_io": type(trainer.strategy.checkpoint_io).__name__}
        Recorder.records.append(record)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def cb(name: str, cls: type, **kwargs: Any) -> list[str]:
    """Overrides that add instrument ``cls`` as ``callbacks.<name>``."""
    return [f"+callbacks.{name}._target_={HERE}.{cls.__name__}",
            *(f"+callbacks.{name}.{k}={json.dumps(v)}" for k, v in kwargs.items())]


# ---------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def _isolate_global_torch_state():
    """In-process train() with trainer.deterministic=true switches deterministic algorithms
    on for the whole process; keep that (and the thread count) out of other tests."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    precision = torch.get_float32_matmul_precision()
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("high")      # what `python -m mmtf.train` sets
    Recorder.records.clear()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)
    torch.set_float32_matmul_precision(precision)


def exact_overrides(data_dir: Path, *extra: str) -> list[str]:
    """3 epochs (9 steps) with dropout, SpecAugment, random captions, deterministic kernels,
    last.ckpt every 2 steps and after every validation."""
    return tiny_overrides("audio_captioning", data_dir, "test=false", "trainer.max_epochs=3",
                          "model.encoder.block.dropout=0.1", "model.decoder.block.dropout=0.1",
                          "trainer.deterministic=true",
                          "callbacks.periodic_checkpoint.every_n_train_steps=2", *extra)


# An EMA of the weights (updates after steps 2, 4, 6, 8; validation on the average): its state
# must resume bit for bit too.
EMA_ON = ("callbacks=ema", "callbacks.ema.decay=0.7", "callbacks.ema.start_step=2",
          "callbacks.ema.every_n_steps=2")


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def assert_equal_tensors(a: Any, b: Any, where: str) -> None:
    """``a`` and ``b`` (nested dicts/lists of tensors and plain values) are equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_equal_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_final_state(ref: Path, run: Path) -> None:
    """The two runs' final last.ckpt hold the same weights, optimizer state (every tensor of
    every parameter), LR schedule, generator states, tokenizer and loops' state, bit for bit
    (CPU, one thread, trainer.deterministic=true: no kernel here is non-deterministic)."""
    a, b = load(ref / "checkpoints" / "last.ckpt"), load(run / "checkpoints" / "last.ckpt")
    # (both written at the end of fit: LastCheckpoint.on_train_end)
    assert (a["global_step"], a["epoch"]) == (b["global_step"], b["epoch"]) == (9, 3)
    assert_equal_tensors(a["loops"], b["loops"], "loops")
    assert_equal_tensors(a["state_dict"], b["state_dict"], "state_dict")
    assert_equal_tensors(a["optimizer_states"], b["optimizer_states"], "optimizer_states")
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert_equal_tensors(a["callbacks"]["ResumeState"], b["callbacks"]["ResumeState"], "rng")
    assert (EMA_STATE_KEY in a) == (EMA_STATE_KEY in b)
    if EMA_STATE_KEY in a:
        assert_equal_tensors(a[EMA_STATE_KEY], b[EMA_STATE_KEY], EMA_STATE_KEY)
        assert a["callbacks"]["EMA"] == b["callbacks"]["EMA"]
    assert a["mmtf"]["tokenizer"] == b["mmtf"]["tokenizer"]          # same JSON, byte for byte


def stream(args: list[str], cwd: Path, *, on_line: Any, timeout: float,
           fork_ranks: bool = False) -> tuple[int, str, bool]:
    """``python -m mmtf.train args`` in a forked child (tests/forked.py: a real process, no
    interpreter start; with ``fork_ranks`` its DDP rank 1 too), output read line by line;
    ``on_line(line, process)`` returns True once it acted. Fails if the run has not ended by
    itself within ``timeout`` seconds (generous: the point is that it ends, not how fast), or
    if a process it started (a DDP rank) outlived it.

    Returns:
        (exit code, output, whether ``on_line`` acted).
    """
    acted = threading.Event()

    def watch(line: str, process: Any) -> bool:
        if not acted.is_set() and on_line(line, process):
            acted.set()
        return acted.is_set()

    try:
        out = run_main("mmtf.train", args, cwd=cwd, env={**ENV, "HYDRA_FULL_ERROR": "1"},
                       merge_stderr=True, on_line=watch, timeout=timeout, fork_ranks=fork_ranks)
    except TimeoutError as error:
        pytest.fail(f"the run did not end: {error}")
    assert out.left_behind == [], f"processes left running: {out.left_behind}\n{out.stdout[-3000:]}"
    return out.returncode, out.stdout, acted.is_set()


# ---------------------------------------------------------------------------- kill and resume
# Every waveform augmentation on (data.augment): mixup pairs, speed, noise and gain are drawn
# from (seed, epoch, items), so the killed run resumes onto the same clips and loss weights.
AUGMENT = ["data.augment.mixup.p=0.5", "data.augment.speed.p=0.5", "data.augment.noise.p=0.5",
           "data.augment.gain.p=0.5"]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_ckpt_path_last_resumes_exactly(data_dir, tmp_path):
    """CLI (`python -m mmtf.train`, forked: tests/forked.py): reference run; the same run
    SIGKILLed after step 5 (last.ckpt of step 4 = epoch 1 after 1 of 3 batches);
    `ckpt_path=last hydra.run.dir=<same>` finishes it. With waveform
    augmentation, mixup and an EMA of the weights (callbacks=ema) on: the average resumes bit for
    bit too."""
    ref, run, starts = tmp_path / "ref", tmp_path / "run", tmp_path / "starts.jsonl"
    out = run_main("mmtf.train", [*exact_overrides(data_dir, *AUGMENT, *EMA_ON),
                                  f"hydra.run.dir={ref}"], cwd=tmp_path, env=ENV)
    assert out.returncode == 0, out.stderr[-3000:]

    out = run_main("mmtf.train", [*exact_overrides(data_dir, *AUGMENT, *EMA_ON),
                                  *cb("kill", KillAtStep, step=5), f"hydra.run.dir={run}"],
                   cwd=tmp_path, env=ENV)
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr[-3000:])
    killed = load(run / "checkpoints" / "last.ckpt")
    position = killed["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (killed["global_step"], killed["epoch"]) == (4, 1)
    assert position["_index_sampler_state"]["epoch"] == 1 and position["_num_yielded"] == 1
    assert killed["callbacks"]["EMA"]["updates"] == 2                 # after steps 2 and 4

    out = run_main("mmtf.train", [*exact_overrides(data_dir, *AUGMENT, *EMA_ON), "ckpt_path=last",
                                  *cb("rec", Recorder, path=str(starts)), f"hydra.run.dir={run}"],
                   cwd=tmp_path, env=ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [json.loads(x)["start_step"] for x in starts.read_text().splitlines()] == [4]
    assert_same_final_state(ref, run)
    final = load(run / "checkpoints" / "last.ckpt")
    assert final["callbacks"]["EMA"]["updates"] == 4
    assert max_abs_diff(final["state_dict"], final[EMA_STATE_KEY]) > 1e-4   # a real average
    assert not list((run / "checkpoints").glob("*.tmp"))


@pytest.mark.slow
def test_sigkill_at_epoch_boundary_resumes_exactly_and_keeps_the_tokenizer(data_dir, tmp_path):
    """train(): killed after step 3 (last.ckpt written after epoch 0's validation); resumed
    with ckpt_path=last. Controls: without ResumeState the resumed weights differ; with a
    different tokenizer spec the checkpoint's tokenizer is still the one used."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    train(compose_train(exact_overrides(data_dir), ref))
    code = run_forked(train, compose_train(exact_overrides(data_dir, *cb("kill", KillAtStep,
                                                                         step=3)), run),
                      timeout=180)
    assert code == -signal.SIGKILL
    killed = load(run / "checkpoints" / "last.ckpt")
    assert (killed["global_step"], killed["epoch"]) == (3, 0)
    for copy in ("no_resume_state", "other_tokenizer"):
        shutil.copytree(run, tmp_path / copy)

    train(compose_train(exact_overrides(data_dir, "ckpt_path=last", *cb("rec", Recorder)), run))
    assert [r["start_step"] for r in Recorder.records] == [3]
    assert_same_final_state(ref, run)

    # Control: the same resume without ResumeState (RNG not restored) is measurably different.
    train(compose_train(exact_overrides(data_dir, "ckpt_path=last",
                                        "callbacks.resume_state=null"),
                        tmp_path / "no_resume_state"))
    control = max_abs_diff(load(ref / "checkpoints" / "last.ckpt")["state_dict"],
                           load(tmp_path / "no_resume_state" / "checkpoints" /
                                "last.ckpt")["state_dict"])
    print(f"control without ResumeState: max |w_ref - w_resumed| = {control:.3g}")
    assert control > 1e-4, control

    # A resumed run that would train a different tokenizer (vocab 100, not 128) still uses
    # the checkpoint's: the ids the model learned stay the same and the run stays exact.
    other = tmp_path / "other_tokenizer"
    train(compose_train(exact_overrides(data_dir, "ckpt_path=last", "tokenizer.vocab_size=100",
                                        "model.decoder.vocab_size=128"), other))
    assert_same_final_state(ref, other)


# ---------------------------------------------------------------------------- checkpoint IO
def test_train_checkpoints_through_atomic_checkpoint_io(data_dir, tmp_path, monkeypatch):
    """Every save of mmtf.train goes through AtomicCheckpointIO (never Lightning's
    $TMPDIR-based _atomic_save); ckpt_path=auto with nothing in the run dir starts fresh."""
    import lightning.fabric.plugins.io.torch_io as lightning_io

    import mmtf.checkpoint_io as atomic_io

    saved: list[str] = []
    real = atomic_io.atomic_torch_save
    monkeypatch.setattr(atomic_io, "atomic_torch_save",
                        lambda obj, target: (saved.append(Path(target).name), real(obj, target)))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Lightning's non-atomic checkpoint save was used")

    monkeypatch.setattr(lightning_io, "_atomic_save", refuse)
    train(compose_train(tiny_overrides("audio_captioning", data_dir, "test=false",
                                       "ckpt_path=auto",
                                       "callbacks.periodic_checkpoint.every_n_train_steps=2",
                                       *cb("rec", Recorder)), tmp_path))
    assert Recorder.records == [{**Recorder.records[0], "start_step": 0,
                                 "checkpoint_io": "AtomicCheckpointIO"}]
    # step 2; validation at 3; the end of fit (the loops' final state)
    assert saved == ["last.ckpt", "epoch_000.ckpt", "last.ckpt", "last.ckpt"]
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert files == ["epoch_000.ckpt", "last.ckpt"]                 # no temp files left
    assert load(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 3


# ---------------------------------------------------------------------------- resolution errors
@pytest.mark.slow
def test_ckpt_path_last_with_nothing_or_a_truncated_file_is_a_one_line_error(data_dir, tmp_path):
    base = tiny_overrides("audio_captioning", data_dir, "ckpt_path=last")
    empty = tmp_path / "empty"
    one_line = {**ENV, "HYDRA_FULL_ERROR": "0"}     # the form a user sees (1 shows tracebacks)
    out = cli_in_process("mmtf.train", [*base, f"hydra.run.dir={empty}"], cwd=tmp_path,
                         env=one_line)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        f"mmtf: error: ResumeError: ckpt_path=last but {empty}/checkpoints/last.ckpt does not "
        f"exist and {empty}/checkpoints holds no *.ckpt (nor {empty}/hpc_ckpt_*.ckpt): nothing "
        f"to resume. Pass hydra.run.dir=<the run dir to resume> or ckpt_path=<file.ckpt>; "
        f"ckpt_path=auto starts fresh when there is nothing; drop ckpt_path to start fresh."]

    # A last.ckpt cut off mid-write (what a kill during a non-atomic save leaves).
    broken = tmp_path / "broken"
    (broken / "checkpoints").mkdir(parents=True)
    full = tmp_path / "full.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "loops": {}, "optimizer_states": [],
                "global_step": 4, "epoch": 1}, full)
    data = full.read_bytes()
    (broken / "checkpoints" / "last.ckpt").write_bytes(data[: len(data) // 2])
    out = cli_in_process("mmtf.train", [*base, f"hydra.run.dir={broken}"], cwd=tmp_path,
                         env=one_line)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith(f"mmtf: error: ResumeError: checkpoint {broken}/checkpoints/"
                               f"last.ckpt ({len(data) // 2} bytes) is corrupt"), lines[0]
    assert not (broken / "metrics.json").exists()      # failed before anything was built


# ---------------------------------------------------------------------------- SIGTERM
@pytest.mark.slow
def test_sigterm_saves_last_ckpt_exits_143_and_auto_resumes_from_it(data_dir, tmp_path):
    run = tmp_path / "run"
    args = [*tiny_overrides("audio_captioning", data_dir, "test=false", "trainer.max_epochs=50"),
            *cb("marker", StepMarker, sleep=0.3), f"hydra.run.dir={run}"]

    def term_after_step_2(line: str, proc: Any) -> bool:
        if "mmtf-test: rank 0 done step 2" in line:
            proc.send_signal(signal.SIGTERM)            # like `kill <pid>` from a scheduler
            return True
        return False

    code, out, acted = stream(args, tmp_path, on_line=term_after_step_2, timeout=240)
    assert acted and code == 143, out[-3000:]
    done = [int(x.rsplit(" ", 1)[1]) for x in out.splitlines() if "mmtf-test: rank 0 done" in x]
    ckpt = load(run / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == max(done) >= 2                  # the batch under way finished
    assert f"SIGTERM: saved {run}/checkpoints/last.ckpt at global step {max(done)}" in out

    # The same command with ckpt_path=auto continues from that checkpoint (the newest).
    train(compose_train(tiny_overrides("audio_captioning", data_dir, "test=false",
                                       "trainer.max_epochs=3", "ckpt_path=auto",
                                       *cb("rec", Recorder)), run))
    assert [r["start_step"] for r in Recorder.records] == [max(done)]
    assert load(run / "checkpoints" / "last.ckpt")["global_step"] == max(9, max(done))


# ---------------------------------------------------------------------------- DDP
@pytest.mark.slow
def test_multirun_of_ddp_jobs_runs_each_job_once_in_one_sweep_dir(data_dir, tmp_path):
    """2 jobs x 2 ranks: training starts exactly 4 times, each rank in its own job's dir; the
    second job gets a fresh process group (rank 0 runs both jobs in one process). Rank 0
    forked from the worker, each job's rank 1 forked from it (tests/forked.py)."""
    sweep, starts = tmp_path / "sweep", tmp_path / "starts.jsonl"
    out = run_main("mmtf.train", ["-m", *tiny_overrides("audio_captioning", data_dir, "test=false",
                                                        "trainer=ddp_cpu"),
                                  "model.decoder.depth=1,2", f"hydra.sweep.dir={sweep}",
                                  *cb("rec", Recorder, path=str(starts))],
                   cwd=tmp_path, env=ENV, timeout=280, fork_ranks=True)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(x) for x in starts.read_text().splitlines()]
    assert sorted((r["dir"], r["rank"]) for r in records) == [
        (str(sweep / job), rank) for job in ("0", "1") for rank in (0, 1)]
    # rank 0 is the sweep's own process (both jobs); each job starts one rank-1 child
    assert len({r["pid"] for r in records if r["rank"] == 0}) == 1
    assert len({r["pid"] for r in records if r["rank"] == 1}) == 2
    assert {r["checkpoint_io"] for r in records} == {"AtomicCheckpointIO"}
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("metrics.json")) \
        == ["sweep/0/metrics.json", "sweep/1/metrics.json"]
    assert not (tmp_path / "outputs").exists()
    for job, depth in (("0", 1), ("1", 2)):
        assert f"depth: {depth}" in (sweep / job / "config.yaml").read_text()
        # 12 clips over 2 ranks x batch 4: 2 steps per epoch on every rank
        assert load(sweep / job / "checkpoints" / "last.ckpt")["global_step"] == 2


@pytest.mark.slow
def test_a_failing_ddp_rank_ends_the_job_promptly_with_its_error(data_dir, tmp_path):
    run = tmp_path / "run"
    args = [*tiny_overrides("audio_captioning", data_dir, "test=false", "trainer=ddp_cpu",
                            "trainer.max_epochs=20"),
            *cb("boom", RaiseAtStep, step=2, rank=1), f"hydra.run.dir={run}"]
    # 240 s is well under the process group's 10-minute timeout that a hung rank would wait
    # (rank 1, forked from rank 0, is in its process group: stream() fails if it outlived it)
    code, out, acted = stream(
        args, tmp_path, timeout=240, fork_ranks=True,
        on_line=lambda line, proc: "mmtf-test: injected failure on rank 1" in line)
    assert acted and code != 0
    assert "RuntimeError: injected failure on rank 1 at step 2" in out


# ---------------------------------------------------------------------------- non-finite loss
def test_nan_loss_stops_training_naming_step_batch_and_ids(data_dir, tmp_path):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir, "test=false",
                                       "trainer.max_epochs=2",
                                       *cb("poison", PoisonBatch, steps=[4])), tmp_path)
    with pytest.raises(NonFiniteLossError,
                       match=r"non-finite training loss at global step 4, batch 1 \(loss = nan\)"
                             r"; batch ids: synth_development_\d+, .*callbacks.nonfinite_loss"
                             r".policy=skip"):
        train(cfg)
    last = load(tmp_path / "checkpoints" / "last.ckpt")           # epoch 0's, intact
    assert last["global_step"] == 3
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())


def test_nan_loss_with_policy_skip_skips_that_step_and_trains_on(data_dir, tmp_path, caplog):
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir, "test=false",
                                       "trainer.max_epochs=2", "callbacks.nonfinite_loss.policy=skip",
                                       *cb("poison", PoisonBatch, steps=[4])), tmp_path)
    with caplog.at_level("WARNING", logger="mmtf.reliability"):
        value = train(cfg)
    assert "Skipped the optimizer step at global step 4 (batch 1): non-finite loss; 1 step(s) " \
           "skipped so far." in caplog.text
    last = load(tmp_path / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 6
    assert last["callbacks"]["NonFiniteLossGuard"] == {"skipped": 1}
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())
    assert value is not None and math.isfinite(value)


def test_default_callbacks_include_the_reliability_set(data_dir, tmp_path):
    """The reliability callbacks are on by default, under the keys the docs name."""
    cfg = compose_train(tiny_overrides("audio_captioning", data_dir), tmp_path)
    targets = {k: v["_target_"] for k, v in cfg.callbacks.items() if v}
    assert targets["resume_state"] == "mmtf.reliability.ResumeState"
    assert targets["preemption"] == "mmtf.reliability.PreemptionCheckpoint"
    assert targets["ddp_fail_fast"] == "mmtf.reliability.DDPFailFast"
    assert targets["nonfinite_loss"] == "mmtf.reliability.NonFiniteLossGuard"
    assert cfg.callbacks.nonfinite_loss.policy == "raise"
    assert targets["periodic_checkpoint"] == "mmtf.reliability.LastCheckpoint"
    assert cfg.callbacks.periodic_checkpoint.every_n_train_steps > 0
    assert cfg.callbacks.model_checkpoint.save_last
    assert cfg.callbacks.model_checkpoint.save_on_train_epoch_end is False
    assert [p["_target_"] for p in cfg.trainer.plugins] == ["mmtf.checkpoint_io.AtomicCheckpointIO"]
    assert cfg.trainer.use_distributed_sampler is False
    ddp = compose_train(tiny_overrides("audio_captioning", data_dir, "trainer=ddp_cpu"), tmp_path)
    strategy = instantiate(ddp.trainer.strategy)
    assert isinstance(strategy, DDPStrategy) and strategy._timeout == timedelta(minutes=10)
    assert strategy.process_group_backend == "gloo" and ddp.trainer.use_distributed_sampler is False
