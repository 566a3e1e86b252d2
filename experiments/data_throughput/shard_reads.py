"""Requests and bytes one training epoch reads from tar shards on an object store (counts, not
time: issue 40, defect 11).

Builds a synthetic sound-events set (600 training clips of 2-6 s, 16 kHz), writes it as 6 tar
shards of 100 clips, serves them from an in-memory file system that counts every ranged fetch
(what an object store bills as one request), and walks one training epoch of ``data=shards``
with the default order settings (batch 32, bucketing, ``shuffle_buffer`` 1000, 0 workers).
Also counts the most members the reading process holds read but not yet handed out (after
each fill, the batch included) and the epoch's padding fraction. Prints one JSON line and
appends it to ``results.jsonl``.

    python experiments/data_throughput/shard_reads.py [--data-dir data] [--shuffle-buffer 1000]
    python <another checkout, this script copied in>/experiments/data_throughput/shard_reads.py \
        --label ...      # mmtf and tests/ are imported from beside the script
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import fsspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # mmtf and tests/ of this checkout

from mmtf.data import CaptionDataModule  # noqa: E402
from mmtf.data.sampler import padding_fraction  # noqa: E402
from mmtf.data.shards.reader import ShardCaptionDataset, ShardDataModule  # noqa: E402
from mmtf.data.shards.writer import write_shards  # noqa: E402
from mmtf.perf.results import append_result  # noqa: E402
from mmtf.synthetic import ensure_synthetic  # noqa: E402
from mmtf.text import BPETokenizer  # noqa: E402
from tests.counting_fs import CountingMemory  # noqa: E402

SYNTH = {"kind": "audio_captions", "num_train": 600, "num_val": 0, "num_test": 0, "seed": 0,
         "sample_rate": 16000, "min_seconds": 2.0, "max_seconds": 6.0, "min_events": 1,
         "max_events": 3, "snr_db": [10.0, 30.0], "captions_per_clip": 5, "num_workers": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("MMTF_DATA_DIR", "data"))
    parser.add_argument("--shuffle-buffer", type=int, default=1000)
    parser.add_argument("--label", default="",
                        help="what mmtf is measured (e.g. 'before: main at d7f20a8')")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    data_dir = Path(args.data_dir).resolve()
    root, local = data_dir / "synth_audio_captions_600", data_dir / "synth_audio_captions_600_shards"
    ensure_synthetic(root, **SYNTH)
    if not (local / "train").is_dir():
        src = CaptionDataModule(format="clotho", root=str(root))
        write_shards(src.items("train"), local / "train", prefix="train", shard_size=100)
    fsspec.register_implementation("countmem", CountingMemory, clobber=True)
    fs = fsspec.filesystem("countmem")
    tars = sorted((local / "train").glob("*.tar"))
    for p in (local / "train").iterdir():       # the shards and their indexes
        fs.pipe(f"/set/{p.name}", p.read_bytes())
    dm = ShardDataModule(format="shards", root=str(local), shards={"train": "countmem://set/*.tar"},
                         sample_rate=16000, max_seconds=10.0, batches={"batch_size": 32},
                         loader={"num_workers": 0},
                         shuffle_buffer=args.shuffle_buffer, seed=0)
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=300))
    loader = dm.train_dataloader()
    held: list[int] = [0]
    fill = ShardCaptionDataset._fill

    def counted_fill(self: ShardCaptionDataset, items: list[int]) -> None:
        fill(self, items)
        held.append(sum(len(v) for v in self._held.values()))

    ShardCaptionDataset._fill = counted_fill    # 0 workers: the dataset lives in this process
    fs.requests = fs.bytes_read = 0     # index reads are not the epoch
    clips = sum(len(batch["ids"]) for batch in loader)
    sampler = loader.batch_sampler
    data_bytes = sum(p.stat().st_size for p in tars)
    result = {"label": args.label, "clips": clips, "shards": len(tars), "shard_bytes": data_bytes,
              "shuffle_buffer": args.shuffle_buffer, "requests": fs.requests,
              "bytes_read": fs.bytes_read,
              "bytes_read_per_data_byte": round(fs.bytes_read / data_bytes, 3),
              "peak_held_items": max(held),
              "padding_fraction": round(padding_fraction(sampler.batches(0), sampler.lengths), 4)}
    print(json.dumps(append_result(__file__, result)))


if __name__ == "__main__":
    main()
