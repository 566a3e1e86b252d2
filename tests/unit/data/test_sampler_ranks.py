"""Two gloo ranks whose item lists differ: the samplers refuse in one line instead of hanging."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mmtf.data.sampler import BucketBatchSampler
from mmtf.data.shards import ShardStreamSampler
from mmtf.errors import UserError

SHARD_OF = [0] * 6 + [1] * 6 + [2] * 6        # three shards of six items
LENGTHS = [1.0 + 0.1 * i for i in range(len(SHARD_OF))]


def _walk(sampler: BucketBatchSampler) -> int:
    """What DDP does with the batches: one gradient all-reduce per batch, then a barrier. Ranks
    with different counts leave one rank waiting in an all-reduce the others never join."""
    n = 0
    for _ in sampler:
        dist.all_reduce(torch.ones(1))
        n += 1
    dist.barrier()
    return n


def _worker(rank: int, store: str, out_dir: str) -> None:
    # A short collective timeout: a hang becomes an error in this child, not a stuck test.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=20))
    out: dict[str, object] = {}
    try:
        same = ShardStreamSampler(shard_of=SHARD_OF, lengths=LENGTHS, batch_size=2, seed=0)
        out["same"] = [len(same), _walk(same)]
        cases = {
            # rank 1 lost shard 2 (skipped under data.on_error=skip, or absent on its node)
            "missing_shard": lambda: ShardStreamSampler(
                shard_of=SHARD_OF[:12] if rank else SHARD_OF,
                lengths=LENGTHS[:12] if rank else LENGTHS, batch_size=2, seed=0),
            # as many items, but one rank read another duration: a budget cuts other batches
            "other_lengths": lambda: BucketBatchSampler(
                lengths=[x + rank for x in LENGTHS], batch_size=None, budget=4.0, seed=0),
        }
        for name, build in cases.items():
            try:
                out[name] = ["walked", _walk(build())]
            except UserError as err:
                out[name] = ["refused", str(err)]
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_with_other_items_refuse_in_one_line_instead_of_hanging(tmp_path):
    # forked, not spawned: two new interpreters would spend ~10 s importing torch before gloo
    mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="fork")
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert got[0]["same"] == got[1]["same"] == [5, 5]   # 9 examples per rank in batches of 2
    for rank in range(2):
        kind, message = got[rank]["missing_shard"]
        assert kind == "refused", message
        assert "rank 1" in message and "12 items" in message and "18" in message, message
        kind, message = got[rank]["other_lengths"]
        assert kind == "refused", message
        assert "rank 1" in message and "lengths" in message, message
