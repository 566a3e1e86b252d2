"""How long the training loader of `experiment=image_captioning` takes per epoch, with and without
decoded images kept in memory (`data.image_cache_mb`), the loader iterated alone (no model).

Builds the experiment's data module from the composed config (the built-in set is generated on
first use), then, ``--runs`` times each and interleaved, iterates the training loader for
``--epochs`` epochs with ``data.image_cache_mb=0`` and with the experiment's value. Epoch 1 of the
cached loader decodes; later epochs read the cache.

    python experiments/image_captioning_synth/loader_time.py [--epochs 3] [--runs 2] [--threads 2]

Prints a table and a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mmtf.perf.device import cpu_flags, describe_cpu, quantity_table
from mmtf.tasks import resolve_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf"


def epoch_seconds(cache_mb: float, epochs: int, data_dir: str | None) -> list[float]:
    """Seconds per epoch of the training loader with ``data.image_cache_mb=cache_mb``."""
    overrides = ["experiment=image_captioning", f"data.image_cache_mb={cache_mb}"]
    if data_dir:
        overrides.append(f"paths.data_dir={data_dir}")
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=overrides)
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    data.connect(resolve_tokenizer(cfg.tokenizer, train_captions=data.train_captions))
    loader = data.train_dataloader()
    seconds = []
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch)
        start = time.perf_counter()
        for _ in loader:
            pass
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default=None, help="paths.data_dir (default: the config's)")
    parser.add_argument("--cache-mb", type=float, default=64.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs: dict[float, list[list[float]]] = {0.0: [], args.cache_mb: []}
    for _ in range(args.runs):
        for cache_mb in runs:
            runs[cache_mb].append(epoch_seconds(cache_mb, args.epochs, args.data_dir))
    rows = [("cpu", describe_cpu()), ("threads", str(args.threads))]
    for cache_mb, seconds in runs.items():
        rows.append((f"image_cache_mb={cache_mb:g}: s per epoch, each run",
                     "; ".join(", ".join(f"{s:.2f}" for s in run) for run in seconds)))
    print(quantity_table(rows))
    later = {c: statistics.median(s for run in v for s in run[1:]) for c, v in runs.items()}
    print(json.dumps({"uncached_epoch_s": round(later[0.0], 3),
                      "cached_epoch_s_after_first": round(later[args.cache_mb], 3),
                      "runs": {f"{c:g}": [[round(s, 3) for s in run] for run in v]
                               for c, v in runs.items()},
                      "threads": args.threads, "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}))


if __name__ == "__main__":
    main()
