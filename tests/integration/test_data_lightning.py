"""The data modules inside a real Lightning fit, and the sampler inside a real process group."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import socket

import lightning as L
import numpy as np
import pytest
import soundfile as sf
import torch
import torch.distributed as dist

from mmtf.data import BucketBatchSampler, CaptionDataModule
from mmtf.synthetic import ensure_synthetic
from mmtf.text import BPETokenizer
from tests.unit.data.conftest import TINY_AUDIO
from tests.unit.presets import flat


class Probe(L.LightningModule):
    """Records what the training loop receives."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list[str], list[list[int]], set[str]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch["ids"], batch["tokens"].tolist(), set(batch)))
        return (self.w * batch["audio"].mean()).sum() + self.w.square().sum()

    def validation_step(self, batch, batch_idx):
        assert batch["audio"].shape[0] == len(batch["references"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_sets_epochs_and_counts_skips(tmp_path):
    root = tmp_path / "set"
    shutil.copytree(ensure_synthetic(tmp_path / "src", "audio_captions", **TINY_AUDIO), root)
    bad = sorted((root / "development").glob("*.wav"))[3]
    x = np.zeros(8000, np.float32)
    x[5] = np.nan
    sf.write(str(bad), x, 16000, subtype="FLOAT")
    dm = flat(CaptionDataModule, format="clotho", root=str(root), batch_size=3, on_error="skip",
                           seed=0)
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=100))
    probe = Probe()
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, use_distributed_sampler=False,
                        default_root_dir=str(tmp_path))
    trainer.fit(probe, datamodule=dm)
    assert [s[0] for s in probe.seen] == [0, 0, 1, 1, 2, 2]
    assert all("_skipped" not in s[3] for s in probe.seen)        # never reaches the model
    assert dm.error_counts["non_finite"] == 3                      # once per epoch
    assert dm.stats["train"]["epoch"] == 2 and dm.stats["train"]["skipped"] == {"non_finite": 1}
    by_epoch = [sorted(zip(*s[1:3])) for s in probe.seen]
    tokens = [dict(x for b in by_epoch[2 * e:2 * e + 2] for x in b) for e in range(3)]
    assert len({str(t) for t in tokens}) > 1   # Lightning's epoch reached the caption draw


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, queue, kw: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        lengths = np.random.default_rng(0).uniform(2, 6, size=50)
        s = BucketBatchSampler(lengths=lengths, seed=0, **kw)  # world from dist
        s.set_epoch(1)
        batches = list(s)
        queue.put((rank, s.world(), [k[0] for b in batches for k in b], len(s), len(batches)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kw", [{"batch_size": 4}, {"batch_size": None, "budget": 14.0}],
                         ids=["batch_size", "budget"])
@pytest.mark.parametrize("world", [2, 3])
def test_sampler_shards_by_itself_under_torch_distributed(world, kw):
    """Also batched by a budget (seconds): every rank the same number of batches."""
    ctx = mp.get_context("fork")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, queue, kw)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert [r[1] for r in results] == [(world, r) for r in range(world)]
    assert len({r[3] for r in results} | {r[4] for r in results}) == 1   # same number of batches
    items = [set(r[2]) for r in results]
    assert set().union(*items) == set(range(50))
    assert sum(len(r[2]) for r in results) - 50 == (-50) % world   # only the tail repeats
