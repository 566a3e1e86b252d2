"""Sharded sets end to end: the writer CLI turns the built-in audio set into shards,
``experiment=audio_captioning data=shards`` trains on them, a SIGKILL mid-epoch then
``ckpt_path=last`` gives bit-equal weights and optimizer state, bad shards are one line and
exit 2 (the tiny config of tests/integration/conftest.py: 12 clips, batch 4, 3 steps an epoch).
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from mmtf.train import train
from tests.forked import run_main
from tests.unit.reliability.toy import run_forked

from .conftest import cli_in_process, compose_train, run_cli, tiny_overrides
from .test_reliability import (  # noqa: F401  (the fixture is used by every test here)
    ENV,
    KillAtStep,
    Recorder,
    _isolate_global_torch_state,
    assert_same_final_state,
    cb,
    load,
)


class RecordIds(Callback):
    """Append ``{"rank", "ids"}`` of every training batch to ``path`` (JSON lines)."""

    def __init__(self, *, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"rank": trainer.global_rank, "ids": list(batch["ids"])}) + "\n")


SYNTH = [o for o in tiny_overrides("audio_captioning", Path("."))
         if o.startswith("data.synthetic.")]


@pytest.fixture(scope="module")
def shards_root(data_dir, tmp_path_factory) -> Path:
    """The tiny built-in audio set as shards of 4 clips (python -m mmtf.data.shard)."""
    out = tmp_path_factory.mktemp("shards")
    res = cli_in_process("mmtf.data.shard", [f"paths.data_dir={data_dir}", *SYNTH, f"out={out}",
                                             "shard_size=4"], cwd=out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "train: 12 items -> 3 shard(s)" in res.stdout
    assert f"data=shards data.root={out}" in res.stdout
    return out


def shard_overrides(data_dir: Path, root: Path, *extra: str) -> list[str]:
    base = [o for o in tiny_overrides("audio_captioning", data_dir)
            if not o.startswith("data.synthetic.")]
    return [*base, "data=shards", f"data.root={root}", "data.shuffle_buffer=3", *extra]


@pytest.mark.slow
def test_the_writer_console_path_shards_the_image_set_and_data_check_passes(data_dir, tmp_path):
    """``python -m mmtf.data.shard`` in a real interpreter (the entry point's one run_cli
    test), on the built-in image set; ``mmtf.data.check data=shards_image`` finds it clean."""
    image = [o for o in tiny_overrides("image_captioning", Path("."))
             if o.startswith("data.synthetic.")]
    out = tmp_path / "img_shards"
    res = run_cli("mmtf.data.shard", ["data=synth_image_captions", f"paths.data_dir={data_dir}",
                                      *image, f"out={out}", "shard_size=5"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "train: 12 items -> 3 shard(s)" in res.stdout
    assert "data=shards_image data.root=" in res.stdout
    res = cli_in_process("mmtf.data.check", ["data=shards_image", f"data.root={out}"],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "Shards read: train 3, val 1, test 1" in res.stdout and "OK: no problems" in res.stdout


def test_the_writer_cli_refuses_a_classification_set(data_dir, tmp_path):
    res = cli_in_process("mmtf.data.shard", ["data=synth_audio_labels", f"out={tmp_path}",
                                             f"paths.data_dir={data_dir}"], cwd=tmp_path,
                         env={"HYDRA_FULL_ERROR": "0"})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(
        "mmtf: error: ConfigError: python -m mmtf.data.shard writes caption sets")


def test_a_missing_shard_is_one_line_and_exit_2(data_dir, shards_root, tmp_path):
    args = shard_overrides(data_dir, shards_root, "data.shards.train='train/train-{000000..000003}"
                           ".tar'", f"hydra.run.dir={tmp_path / 'run'}")
    res = cli_in_process("mmtf.train", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert res.returncode == 2, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("mmtf: error: ") and "train-000003.tar: shard not found" in last


@pytest.mark.slow
def test_a_sharded_set_trains_end_to_end(data_dir, shards_root, tmp_path):
    cfg = compose_train(shard_overrides(data_dir, shards_root, "trainer.max_epochs=2"),
                        tmp_path / "run")
    score = train(cfg)
    assert math.isfinite(score)
    ckpt = load(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert (ckpt["global_step"], ckpt["epoch"]) == (6, 2)          # 3 batches of 4 an epoch
    logged = "".join(p.read_text() for p in (tmp_path / "run").rglob("metrics.csv"))
    assert "test/cider_d" in logged and "val/cider_d" in logged


@pytest.mark.slow
def test_sigkill_mid_epoch_on_shards_then_ckpt_path_last_resumes_exactly(data_dir, shards_root,
                                                                         tmp_path):
    """As tests/integration/test_reliability.py does for the map-style set: a reference run;
    the same run SIGKILLed after step 5 (last.ckpt of step 4 = epoch 1 after 1 of 3 batches);
    ckpt_path=last finishes it with bit-equal weights, optimizer state and RNG."""
    def overrides(*extra: str) -> list[str]:
        return shard_overrides(data_dir, shards_root, "test=false", "trainer.max_epochs=3",
                               "model.encoder.block.dropout=0.1", "model.decoder.block.dropout=0.1",
                               "trainer.deterministic=true",
                               "callbacks.periodic_checkpoint.every_n_train_steps=2", *extra)

    ref, run = tmp_path / "ref", tmp_path / "run"
    train(compose_train(overrides(), ref))
    code = run_forked(train, compose_train(overrides(*cb("kill", KillAtStep, step=5)), run),
                      timeout=300)
    assert code == -signal.SIGKILL
    killed = load(run / "checkpoints" / "last.ckpt")
    position = killed["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (killed["global_step"], killed["epoch"]) == (4, 1)
    assert position["_index_sampler_state"]["epoch"] == 1 and position["_num_yielded"] == 1
    assert position["_index_sampler_state"]["streams"] == 1

    train(compose_train(overrides("ckpt_path=last", *cb("rec", Recorder)), run))
    assert [r["start_step"] for r in Recorder.records] == [4]
    assert_same_final_state(ref, run)


@pytest.mark.slow
def test_two_ddp_ranks_by_two_workers_read_disjoint_items_covering_the_epoch(data_dir,
                                                                            shards_root,
                                                                            tmp_path):
    """trainer=ddp_cpu (2 processes, both forked: tests/forked.py), data.loader.num_workers=2: each
    rank's batches hold 6 of the 12 clips (3 per stream, batch 2: 4 batches a rank), the
    ranks' clips are disjoint and together the whole training split."""
    ids = tmp_path / "ids.jsonl"
    out = run_main("mmtf.train", [*shard_overrides(data_dir, shards_root, "test=false",
                                                   "trainer=ddp_cpu", "data.loader.num_workers=2",
                                                   "data.batches.batch_size=2"),
                                  f"+callbacks.ids._target_={__name__}.RecordIds",
                                  f"+callbacks.ids.path={ids}", f"hydra.run.dir={tmp_path / 'run'}"],
                   cwd=tmp_path, env=ENV, timeout=280, fork_ranks=True)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(x) for x in ids.read_text().splitlines()]
    per_rank = {r: [i for rec in records if rec["rank"] == r for i in rec["ids"]] for r in (0, 1)}
    assert [sum(rec["rank"] == r for rec in records) for r in (0, 1)] == [4, 4]
    assert len(per_rank[0]) == len(per_rank[1]) == 6
    assert not set(per_rank[0]) & set(per_rank[1])
    assert set(per_rank[0]) | set(per_rank[1]) == {f"synth_development_{k:05d}" for k in range(12)}
