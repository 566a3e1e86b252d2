"""Non-finite losses: a clear error naming where, or a skipped optimizer step; DDP ranks agree."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from mmtf.reliability import NonFiniteLossError, NonFiniteLossGuard, check_finite_loss
from tests.unit.reliability.toy import ToyModule, fit


def test_finite_loss_passes():
    assert check_finite_loss(torch.tensor(1.5), step=0, batch_idx=0, policy="raise")


def test_raise_names_step_batch_and_ids():
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss at global step 12, "
                                                 r"batch 3 \(loss = nan\); batch ids: a, b\. "
                                                 r"Lower the learning rate"):
        check_finite_loss(torch.tensor(float("nan")), step=12, batch_idx=3, batch_ids=["a", "b"])


def test_skip_returns_false_and_bad_policy_is_refused():
    assert not check_finite_loss(torch.tensor(float("inf")), step=0, batch_idx=0, policy="skip")
    with pytest.raises(ValueError, match=r"policy \('ignore'\) must be one of"):
        check_finite_loss(torch.tensor(1.0), step=0, batch_idx=0, policy="ignore")
    with pytest.raises(ValueError, match=r"NonFiniteLossGuard: policy \('x'\)"):
        NonFiniteLossGuard(policy="x")


def test_guard_raise_stops_training_at_the_poisoned_step(tmp_path):
    with pytest.raises(NonFiniteLossError, match=r"global step 3, batch 3 .*batch ids: s\d+, "):
        fit(tmp_path, max_steps=8, module=ToyModule(nan_at_steps=(3,)),
            extra_callbacks=[NonFiniteLossGuard(policy="raise")])


class Snapshots(Callback):
    """Weights and AdamW step counts before and after every training batch."""

    def __init__(self) -> None:
        self.before: dict[int, list[torch.Tensor]] = {}
        self.after: dict[int, list[torch.Tensor]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before[trainer.global_step] = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[trainer.global_step - 1] = [p.detach().clone()
                                               for p in pl_module.parameters()]


def test_guard_skip_leaves_weights_and_optimizer_untouched(tmp_path):
    snaps, guard = Snapshots(), NonFiniteLossGuard(policy="skip")
    trainer, model = fit(tmp_path, max_steps=8, module=ToyModule(nan_at_steps=(3,)),
                         extra_callbacks=[snaps, guard])
    assert guard.skipped == 1
    assert trainer.logged_metrics["train/nonfinite_skipped"] == 1.0
    for a, b in zip(snaps.before[3], snaps.after[3]):       # the skipped step
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(snaps.before[4], snaps.after[4]))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    adam_steps = {float(s["step"]) for s in trainer.optimizers[0].state.values()}
    assert adam_steps == {7.0}                               # 8 loop steps, 1 skipped
    assert guard.state_dict() == {"skipped": 1}


def test_without_the_guard_one_nan_step_poisons_the_weights(tmp_path):
    """Control: Lightning by itself steps the optimizer with NaN gradients."""
    _, model = fit(tmp_path, max_steps=5, module=ToyModule(nan_at_steps=(3,)))
    assert not all(torch.isfinite(p).all() for p in model.parameters())


def test_guard_gives_up_after_max_skips(tmp_path):
    guard = NonFiniteLossGuard(policy="skip", max_skips=1)
    with pytest.raises(NonFiniteLossError, match=r"global step 5"):
        fit(tmp_path, max_steps=8, module=ToyModule(nan_at_steps=(2, 5)), extra_callbacks=[guard])
    assert guard.skipped == 1


def _rank(rank: int, init_file: str, policy: str, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    loss = torch.tensor(float("nan") if rank == 1 else 0.5)     # only rank 1 is bad
    try:
        result = check_finite_loss(loss, step=7, batch_idx=2, policy=policy)
    except NonFiniteLossError as err:
        result = str(err)
    dist.barrier()                     # would hang if the ranks had taken different branches
    out.put((rank, result))
    dist.destroy_process_group()


@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_ddp_ranks_agree_when_one_rank_is_non_finite(tmp_path, policy):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "pg"), policy, out))
             for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    if policy == "skip":
        assert results == {0: False, 1: False}
    else:
        assert "non-finite on 1 of 2 ranks; this rank: 0.5" in results[0]
        assert "non-finite on 1 of 2 ranks; this rank: nan" in results[1]
