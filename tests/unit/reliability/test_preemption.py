"""SIGTERM -> last.ckpt at the end of the current batch, exit status 143, exact resume; DDP runs
that fail or are preempted end promptly with the right status."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from mmtf.reliability import PREEMPTED_EXIT_CODE, PreemptionCheckpoint
from tests.forked import alive, run_main, start_main
from tests.unit.reliability.toy import assert_same_training_state, fit, run_forked

SCRIPT = Path(__file__).with_name("ddp_script.py")
REPO = Path(__file__).resolve().parents[3]


class TermAt(Callback):
    """Send this process SIGTERM at the start of training batch ``step`` (as a scheduler
    would, at an arbitrary point inside the batch)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("term_at, run, data, ckpt_step", [
    (8, {"max_steps": 15}, {}, 9),                                       # mid-epoch
    pytest.param(5, {"max_epochs": 3}, {"val": True, "num_workers": 2, "noise": "sample"}, 6,
                 marks=pytest.mark.slow),                                # last batch
])
def test_sigterm_saves_last_ckpt_exits_143_and_resumes_exactly(tmp_path, term_at, run, data,
                                                               ckpt_step):
    reference = fit(tmp_path / "ref", **run, **data)
    code = run_forked(fit, tmp_path / "run", extra_callbacks=[TermAt(term_at),
                                                              PreemptionCheckpoint()],
                      **run, **data)
    assert code == PREEMPTED_EXIT_CODE == 143
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == ckpt_step   # batch completed
    resumed = fit(tmp_path / "run", ckpt_path=str(last), **run, **data)
    assert resumed[0].global_step == (15 if "max_steps" in run else 18)
    assert_same_training_state(reference, resumed)


def test_without_the_callback_lightning_exits_0_and_saves_nothing(tmp_path):
    """Control: Lightning 2.6's own SIGTERM handling."""
    code = run_forked(fit, tmp_path, max_steps=15, extra_callbacks=[TermAt(8)])
    assert code == 0
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"filename": "last.pt"}, r"filename \('last.pt'\) must end with \.ckpt"),
    ({"exit_code": 300}, r"exit_code \(300\) must be in 0\.\.255"),
])
def test_preemption_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PreemptionCheckpoint(**kwargs)


# ---------------------------------------------------------------------------- DDP (subprocess)
def run_ddp(out: Path, mode: str, rank: int, step: int, *, sigterm_after: str | None = None,
            timeout: float = 240) -> tuple[int, str]:
    """Run the 2-rank script; (exit code, output). Rank 0, the launcher, is a forked child of
    this worker (tests/forked.py: a real process without the interpreter start); rank 1 is
    the process Lightning's launcher starts, forked from rank 0 too (``fork_ranks``). Fails if the job has not ended by itself within
    ``timeout`` seconds (generous: the point is that it ends, not how fast)."""
    def on_line(line: str, launcher) -> bool:
        if sigterm_after and sigterm_after in line:
            launcher.send_signal(signal.SIGTERM)           # to rank 0 only, like `kill <pid>`
            return True
        return False

    try:
        done = run_main(SCRIPT, [mode, str(rank), str(step), str(out)], cwd=REPO,
                        env={"PYTHONPATH": str(REPO)}, merge_stderr=True, on_line=on_line,
                        timeout=timeout, fork_ranks=True)
    except TimeoutError as error:
        pytest.fail(f"the DDP job did not end: {error}")
    return done.returncode, done.stdout


def run_ranks(out: Path, mode: str, rank: int, step: int, *, sigterm_after: str | None = None,
              timeout: float = 240) -> tuple[list[int], str]:
    """The script's 2 ranks as torchrun starts them: both started here (forked children of
    this worker, tests/forked.py), each told its rank through torchelastic's variables, so
    Lightning launches nothing. ([exit code of each rank], both ranks' output.) SIGTERM goes to
    rank 0 alone when its output shows ``sigterm_after``."""
    with socket.socket() as probe:                         # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = {"PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
              "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
              "TORCHELASTIC_RUN_ID": "tests"}

    def on_line(line: str, process) -> bool:
        if sigterm_after and sigterm_after in line:
            process.send_signal(signal.SIGTERM)            # to rank 0 only, like `kill <pid>`
            return True
        return False

    runs = [start_main(SCRIPT, [mode, str(rank), str(step), str(out)], cwd=REPO,
                       env={**common, "RANK": str(r), "LOCAL_RANK": str(r)}, merge_stderr=True,
                       on_line=on_line if r == 0 else None)
            for r in (0, 1)]
    try:
        done = [run.wait(timeout) for run in runs]
    except TimeoutError as error:
        for run in runs:
            run.process.kill()
        pytest.fail(f"the DDP job did not end: {error}")
    return [d.returncode for d in done], "".join(d.stdout for d in done)


@pytest.mark.slow
@pytest.mark.parametrize("failing_rank", [1, 0])
def test_ddp_rank_failure_ends_the_job(tmp_path, failing_rank):
    """Rank 1 failing: Lightning's child observer kills the job. Rank 0 (the launcher)
    failing: DDPFailFast kills the children. Either way: the job ends by itself, non-zero,
    the error shown, no process left behind."""
    code, out = run_ddp(tmp_path, "raise", failing_rank, 3)
    assert code != 0
    assert f"RuntimeError: boom on rank {failing_rank} at step 3" in out
    pids = [int(p) for p in re.findall(r"rank \d pid (\d+)", out)]
    assert len(pids) == 2 and not [pid for pid in pids if alive(pid)]   # no rank left behind


@pytest.mark.slow
def test_ddp_sigterm_to_rank_0_checkpoints_on_both_ranks_and_exits_143(tmp_path):
    """Rank 1's loss is NaN at step 2 (both ranks skip it, no hang); SIGTERM to rank 0 after
    step 4: both ranks stop at the same batch and exit 143, one last.ckpt with both ranks' RNG
    states. The ranks started as torchrun starts them (``run_ranks``)."""
    codes, out = run_ranks(tmp_path, "sigterm", 1, 2, sigterm_after="rank 0 done step 4")
    assert codes == [PREEMPTED_EXIT_CODE] * 2, out[-3000:]
    assert "Skipped the optimizer step at global step 2" in out
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    # both ranks write to one pipe: a line may start mid-way through the other rank's output
    done = [int(step) for step in re.findall(r"rank 0 done step (\d+)", out)]
    assert ckpt["global_step"] == max(done) >= 4
    assert len(ckpt["callbacks"]["ResumeState"]["rng"]) == 2
    assert ckpt["callbacks"]["NonFiniteLossGuard"]["skipped"] == 1
    pids = [int(p) for p in re.findall(r"rank \d pid (\d+)", out)]
    assert len(pids) == 2 and not [pid for pid in pids if alive(pid)]


def _assert_same_end_state(a: dict, b: dict) -> None:
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), f"weight {k} differs"
    assert a["optimizer"].keys() == b["optimizer"].keys() and a["optimizer"]
    for i, state in a["optimizer"].items():
        for k, v in state.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optimizer"][i][k])), \
                f"optimizer state {i}.{k} differs"
    for gen in ("torch",):
        assert torch.equal(a["rng"][gen], b["rng"][gen]), f"{gen} generator differs"
    assert torch.equal(a["rng"]["python"]["internal"], b["rng"]["python"]["internal"])
    assert torch.equal(a["rng"]["numpy"]["keys"], b["rng"]["numpy"]["keys"])


@pytest.mark.slow
def test_ddp_sigterm_then_resume_ends_bit_exact_on_every_rank(tmp_path):
    """Two gloo ranks (started as torchrun starts them), dropout and per-rank random targets: SIGTERM to rank 1 at step 4 ->
    both ranks save at the end of that batch (step 5) and exit 143; resuming from last.ckpt to
    step 10 gives, on each rank, the weights, optimizer state and generator state of the
    uninterrupted run, bit for bit (gloo's sum of two ranks is deterministic)."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    ref.mkdir(), run.mkdir()
    codes, out = run_ranks(ref, "exact", 1, -1)
    assert codes == [0, 0], out[-3000:]
    codes, out = run_ranks(run, "exact", 1, 4)
    assert codes == [PREEMPTED_EXIT_CODE] * 2, out[-3000:]
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 5 and len(ckpt["callbacks"]["ResumeState"]["rng"]) == 2
    assert not (run / "end_rank0.pt").exists()
    codes, out = run_ranks(run, "exact-resume", 1, -1)
    assert codes == [0, 0], out[-3000:]
    ends = {name: [torch.load(d / f"end_rank{r}.pt", weights_only=True) for r in (0, 1)]
            for name, d in (("ref", ref), ("run", run))}
    for rank in (0, 1):
        _assert_same_end_state(ends["ref"][rank], ends["run"][rank])
    # the resumed run trained on: its end differs from the checkpoint it started from
    k = next(iter(ckpt["state_dict"]))
    assert not torch.equal(ckpt["state_dict"][k], ends["run"][0]["weights"][k])
