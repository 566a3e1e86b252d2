"""How long an experiment's training loader takes per epoch with and without decoded media kept
in memory (`data.media_cache_mb`), the loader iterated alone (no model).

Builds the experiment's data module from the composed config (a built-in set is generated on
first use), then, ``--runs`` times each and interleaved, iterates the training loader for
``--epochs`` epochs with ``data.media_cache_mb=0`` and with the experiment's value (or
``--cache-mb``). Epoch 1 of the cached loader decodes; later epochs read the cache.

    python experiments/data_throughput/cache_time.py [--experiment image_captioning]
        [--epochs 3] [--runs 2] [--threads 2] [--cache-mb N] [hydra overrides ...]

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
from omegaconf import DictConfig

from mmtf.perf.device import cpu_flags, describe_cpu, quantity_table
from mmtf.perf.results import append_result
from mmtf.tasks import resolve_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose_experiment(experiment: str, data_dir: str | None, *overrides: str) -> DictConfig:
    """The experiment's composed training config."""
    args = (f"experiment={experiment}", *overrides,
            *([f"paths.data_dir={data_dir}"] if data_dir else []))
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("train", overrides=list(args))


def epoch_seconds(experiment: str, cache_mb: float, epochs: int, data_dir: str | None,
                  overrides: list[str]) -> list[float]:
    """Seconds per epoch of the training loader with ``data.media_cache_mb=cache_mb``."""
    cfg = compose_experiment(experiment, data_dir, *overrides, f"data.media_cache_mb={cache_mb}")
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
    parser.add_argument("--experiment", default="image_captioning")
    parser.add_argument("overrides", nargs="*",
                        help="Hydra overrides, e.g. data.synthetic.sample_rate=44100 (with "
                             "--data-dir elsewhere: the set is generated at that rate)")
    parser.add_argument("--cache-mb", type=float, default=None,
                        help="the cached run's data.media_cache_mb (default: the experiment's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache_mb = args.cache_mb
    if cache_mb is None:
        cache_mb = float(compose_experiment(args.experiment, args.data_dir,
                                            *args.overrides).data.media_cache_mb)
    if cache_mb <= 0:
        parser.error(f"{args.experiment} keeps no decoded media (data.media_cache_mb is 0): "
                     f"give --cache-mb")
    runs: dict[float, list[list[float]]] = {0.0: [], cache_mb: []}
    for _ in range(args.runs):
        for mb in runs:
            runs[mb].append(epoch_seconds(args.experiment, mb, args.epochs, args.data_dir,
                                          args.overrides))
    rows = [("cpu", describe_cpu()), ("experiment", " ".join([args.experiment, *args.overrides])),
            ("threads", str(args.threads))]
    for mb, seconds in runs.items():
        rows.append((f"media_cache_mb={mb:g}: s per epoch, each run",
                     "; ".join(", ".join(f"{s:.2f}" for s in run) for run in seconds)))
    print(quantity_table(rows))
    later = {c: statistics.median(s for run in v for s in run[1:]) for c, v in runs.items()}
    print(json.dumps(append_result(__file__, {"experiment": args.experiment, "overrides": args.overrides,
                      "media_cache_mb": cache_mb,
                      "uncached_epoch_s": round(later[0.0], 3),
                      "cached_epoch_s_after_first": round(later[cache_mb], 3),
                      "runs": {f"{c:g}": [[round(s, 3) for s in run] for run in v]
                               for c, v in runs.items()},
                      "threads": args.threads, "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()})))


if __name__ == "__main__":
    main()
