"""How fast does the data pipeline feed a model, and how much padding does bucketing save?

Measures, on the built-in sound-events set (3000 training clips of 2-6 s, 16 kHz):

* clips/s through decode (soundfile) + resample (torchaudio, cached kernel) + random crop +
  collate, for one training epoch through ``CaptionDataModule.train_dataloader()``, with 0 and 2
  DataLoader workers: on the set itself (16 kHz files, the model rate: no resampling) and on a
  400-clip copy written at 44.1 kHz, Clotho's rate, resampled to 16 kHz;
* the same epoch read three ways (issue #22), at 0, 2 and 4 workers: the files (Clotho layout),
  the same set as WebDataset tar shards (``data=shards``: each stream read front to back, one per
  worker), and a two-source mixture (``data=mixture``: the files and the shards at weight 1:1,
  3000 draws an epoch);
* the padding fraction of the padded ``(b, samples)`` batches with and without length bucketing
  (batch 32, the default sampler settings), measured on the real batches of the timed epoch and
  averaged over 5 epochs' batch plans;
* optionally (``--time-generation``) the time to generate the default set from scratch.

Prints a table, then one JSON object on the last line.

    python experiments/data_throughput/run.py [--data-dir data] [--time-generation]

The first run generates the set (and a 400-clip 44.1 kHz copy, ~140 MB) under --data-dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mmtf.data import CaptionDataModule, padding_fraction
from mmtf.data.mixture import MixtureDataModule
from mmtf.data.shards.reader import ShardDataModule
from mmtf.data.shards.writer import write_shards
from mmtf.perf.results import append_result
from mmtf.synthetic import SyntheticCaptionDataModule, ensure_synthetic
from mmtf.text import BPETokenizer

SYNTH = {"kind": "audio_captions", "num_train": 3000, "num_val": 300, "num_test": 300,
         "seed": 0, "sample_rate": 16000, "min_seconds": 2.0, "max_seconds": 6.0,
         "min_events": 1, "max_events": 3, "snr_db": [10.0, 30.0], "captions_per_clip": 5,
         "num_workers": 2}


SYNTH_44K = {**SYNTH, "num_train": 400, "num_val": 0, "num_test": 0, "sample_rate": 44100}


def _dm(root: Path, synth: dict, *, workers: int = 0, bucketing: bool = True
        ) -> SyntheticCaptionDataModule:
    dm = SyntheticCaptionDataModule(format="clotho", root=str(root), synthetic=synth,
                                    sample_rate=16000, max_seconds=10.0,
                                    batches={"batch_size": 32, "bucketing": bucketing},
                                    loader={"num_workers": workers}, seed=0)
    dm.setup("fit")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=300))
    return dm


def time_epoch(root: Path, synth: dict, workers: int) -> dict[str, float]:
    """One training epoch through the real loader: clips/s and the padding it produced."""
    dm = _dm(root, synth, workers=workers)
    loader = dm.train_dataloader()
    t0 = time.perf_counter()
    clips = sum(len(batch["ids"]) for batch in loader)
    seconds = time.perf_counter() - t0
    return {"clips": clips, "seconds": seconds, "clips_per_s": clips / seconds,
            "padding_fraction": dm.stats["train"]["padding_fraction"]}


LOADER = {"sample_rate": 16000, "max_seconds": 10.0, "batches": {"batch_size": 32}, "seed": 0}


def write_shard_copy(root: Path, out: Path) -> None:
    """The set as tar shards of 250 clips (once; the writer's index beside each shard)."""
    if (out / "train").is_dir():
        return
    src = CaptionDataModule(format="clotho", root=str(root))
    for split in ("train", "val", "test"):
        write_shards(src.items(split), out / split, prefix=split, shard_size=250)


def source_dm(kind: str, root: Path, shards: Path, workers: int) -> CaptionDataModule:
    """files | shards | mixture (files + shards, 1:1, 3000 draws), connected to a tokenizer."""
    patterns = {s: f"{s}/*.tar" for s in ("train", "val", "test")}
    if kind == "files":
        dm = CaptionDataModule(format="clotho", root=str(root), loader={"num_workers": workers},
                               **LOADER)
    elif kind == "shards":
        dm = ShardDataModule(format="shards", root=str(shards), shards=patterns,
                             loader={"num_workers": workers}, **LOADER)
    else:
        sources = {"files": {"_target_": "mmtf.data.CaptionDataModule", "format": "clotho",
                             "root": str(root), "max_seconds": 10.0, "weight": 1.0},
                   "shards": {"_target_": "mmtf.data.shards.ShardDataModule",
                              "format": "shards", "root": str(shards), "shards": patterns,
                              "max_seconds": 10.0, "weight": 1.0}}
        dm = MixtureDataModule(sources=sources, epoch_samples=3000,
                               loader={"num_workers": workers}, batches={"batch_size": 32},
                               seed=0)
    dm.setup("fit")
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=300))
    return dm


def time_source(kind: str, root: Path, shards: Path, workers: int) -> dict[str, float]:
    dm = source_dm(kind, root, shards, workers)
    loader = dm.train_dataloader()
    t0 = time.perf_counter()
    clips = sum(len(batch["ids"]) for batch in loader)
    seconds = time.perf_counter() - t0
    return {"clips": clips, "seconds": seconds, "clips_per_s": clips / seconds}


def padding_plans(root: Path, epochs: int = 5) -> dict[str, float]:
    """Mean padding fraction of the batch plans of ``epochs`` epochs, bucketed vs plain."""
    out = {}
    for bucketing in (True, False):
        dm = _dm(root, SYNTH, bucketing=bucketing)
        sampler = dm.batch_sampler("train")
        out["bucketed" if bucketing else "plain"] = float(np.mean(
            [padding_fraction(sampler.batches(e), sampler.lengths) for e in range(epochs)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("MMTF_DATA_DIR", "data"))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the main process (workers always use 1)")
    parser.add_argument("--time-generation", action="store_true",
                        help="also generate the default set from scratch in a temp dir")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # With 0 workers collate runs here; on a busy 2-core machine two OpenMP threads spin-wait
    # and run collate several times slower than one thread does.
    torch.set_num_threads(args.threads)
    result: dict = {"torch_threads": args.threads, "cpus": os.cpu_count(),
                    "load_avg_1min": round(os.getloadavg()[0], 2)}

    if args.time_generation:
        with tempfile.TemporaryDirectory(dir=args.data_dir if Path(args.data_dir).is_dir()
                                         else None) as tmp:
            t0 = time.perf_counter()
            ensure_synthetic(Path(tmp) / "set", **SYNTH)
            result["generation_seconds"] = round(time.perf_counter() - t0, 1)

    data_dir = Path(args.data_dir).resolve()
    root, root_44k = data_dir / "synth_audio_captions", data_dir / "synth_audio_captions_44k"
    t0 = time.perf_counter()
    ensure_synthetic(root, **SYNTH)  # no-op when cached
    ensure_synthetic(root_44k, **SYNTH_44K)
    result["ensure_seconds"] = round(time.perf_counter() - t0, 2)

    rows = []
    for rate, r_root, synth in ((16000, root, SYNTH), (44100, root_44k, SYNTH_44K)):
        for workers in args.workers:
            r = time_epoch(r_root, synth, workers)
            rows.append({"rate": rate, "workers": workers, **r})
    plans = padding_plans(root)
    shard_root = data_dir / "synth_audio_captions_shards"
    write_shard_copy(root, shard_root)
    sources = [{"kind": kind, "workers": w, **time_source(kind, root, shard_root, w)}
               for w in args.workers for kind in ("files", "shards", "mixture")]

    print(f"{'pipeline':<34} {'workers':>7} {'clips':>6} {'seconds':>8} {'clips/s':>8} "
          f"{'padding':>8}")
    for r in rows:
        what = "decode+crop+collate (16 kHz files)" if r["rate"] == 16000 else \
            "decode+resample 44.1->16 kHz+collate"
        print(f"{what:<34} {r['workers']:>7} {r['clips']:>6} {r['seconds']:>8.2f} "
              f"{r['clips_per_s']:>8.1f} {100 * r['padding_fraction']:>7.1f}%")
    print(f"\n{'the same epoch read as':<34} {'workers':>7} {'clips':>6} {'seconds':>8} "
          f"{'clips/s':>8} {'vs files':>8}")
    files = {r["workers"]: r["clips_per_s"] for r in sources if r["kind"] == "files"}
    for r in sources:
        print(f"{r['kind']:<34} {r['workers']:>7} {r['clips']:>6} {r['seconds']:>8.2f} "
              f"{r['clips_per_s']:>8.1f} {r['clips_per_s'] / files[r['workers']]:>7.2f}x")
    reduction = plans["plain"] / plans["bucketed"]
    print(f"\npadding fraction, batch 32, mean of 5 epochs: bucketed {100 * plans['bucketed']:.1f}%"
          f", plain {100 * plans['plain']:.1f}% -> {reduction:.1f}x fewer padded samples")
    if "generation_seconds" in result:
        print(f"generating the default set (3000/300/300 clips): "
              f"{result['generation_seconds']} s")
    result.update({
        "clips_per_s": {f"files{r['rate']}Hz_w{r['workers']}": round(r["clips_per_s"], 1)
                        for r in rows},
        "sources_clips_per_s": {f"{r['kind']}_w{r['workers']}": round(r["clips_per_s"], 1)
                                for r in sources},
        "padding_fraction": {k: round(v, 4) for k, v in plans.items()},
        "padding_reduction": round(reduction, 2),
    })
    print(json.dumps(result))
    append_result(__file__, result)


if __name__ == "__main__":
    sys.exit(main())
