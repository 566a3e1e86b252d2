"""How long one training step of `experiment=image_captioning` takes, against variants of the
model given as Hydra overrides, interleaved in one run.

Builds the experiment's task and data module from the composed config (the built-in set is
generated on first use), takes ``--batches`` training batches of the cached loader, and times the
step that `mmtf.train` runs (forward, loss, backward, gradient clipping, the task's AdamW) on
them: per repeat, each
variant runs ``--steps`` steps after a warm-up, and every ratio is the median over repeats of the
per-repeat ratio to the experiment's own model (the machine is shared). The loader, Lightning's
hooks and validation are not timed: `python -m mmtf.train ... trainer.max_epochs=2` measures the
epoch they make.

    python experiments/image_captioning_synth/step_time.py \
        "model.encoder.dim=96" "model.encoder.dim=64" "model.encoder.block.mlp_ratio=2"

Each positional argument is one variant: space-separated overrides. Prints a table and a JSON
object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mmtf.perf.device import cpu_flags, describe_cpu
from mmtf.perf.results import append_result
from mmtf.tasks.captioning import batch_inputs
from mmtf.tasks.optim import build_optimizer
from mmtf.train import connect_tokenizer

CONF = Path(__file__).resolve().parents[2] / "conf"
BASELINE = "(experiment)"


class Variant:
    """One model of the experiment (its config plus ``overrides``), its optimizer and batches."""

    def __init__(self, overrides: list[str], batches: int, data_dir: str | None,
                 seed: int) -> None:
        extra = [f"paths.data_dir={data_dir}"] if data_dir else []
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            cfg = compose("train", overrides=["experiment=image_captioning", *extra, *overrides])
        torch.manual_seed(seed)
        self.task = instantiate(cfg.model)
        data = instantiate(cfg.data)
        data.prepare_data()
        connect_tokenizer(cfg, self.task, data, None)    # as mmtf.train: one tokenizer for both
        data.setup("fit")
        # The task's AdamW (its decay / no-decay groups and learning rate), as mmtf.train builds it.
        self.optimizer = build_optimizer(self.task.optimizer, [self.task.model],
                                         self.task.hparams.weight_decay)
        self.clip = float(cfg.trainer.gradient_clip_val or 0)
        loader = iter(data.train_dataloader())
        self.batches = [next(loader) for _ in range(batches)]
        self.parameters = sum(p.numel() for p in self.task.parameters())
        self.task.train()

    def step(self, batch: dict[str, Any]) -> None:
        inputs, lengths = batch_inputs(batch)
        loss = self.task.model(inputs, lengths, batch["tokens"]).loss
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.task.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def median_step_ms(self, steps: int) -> float:
        for batch in self.batches:                      # warm-up: allocator, oneDNN primitives
            self.step(batch)
        times = []
        for i in range(steps):
            start = time.perf_counter()
            self.step(self.batches[i % len(self.batches)])
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="*", help='e.g. "model.encoder.dim=96"')
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="paths.data_dir (default: the config's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = [BASELINE, *args.variants]
    built = {name: Variant([] if name == BASELINE else name.split(), args.batches,
                           args.data_dir, args.seed) for name in names}
    load_start = os.getloadavg()[0]
    ms: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            ms[name].append(built[name].median_step_ms(args.steps))
    ratio = {name: statistics.median(b / v for b, v in zip(ms[BASELINE], ms[name]))
             for name in names}

    print(f"cpu: {describe_cpu()}; threads {args.threads}; "
          f"load {load_start:.2f} -> {os.getloadavg()[0]:.2f}")
    width = max(len(n) for n in names)
    print(f"| {'variant':<{width}} | parameters | step ms (median per repeat) | speed-up |")
    print(f"|{'-' * (width + 2)}|-----------:|-----------------------------|---------:|")
    for name in names:
        per_repeat = ", ".join(f"{t:.1f}" for t in ms[name])
        print(f"| {name:<{width}} | {built[name].parameters / 1e6:.2f} M | {per_repeat} | "
              f"{ratio[name]:.2f}x |")
    print(json.dumps(append_result(__file__, {"step_ms": {n: round(statistics.median(v), 2) for n, v in ms.items()},
                      "speedup_vs_experiment": {n: round(r, 3) for n, r in ratio.items()},
                      "parameters": {n: built[n].parameters for n in names},
                      "threads": args.threads, "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "load_avg_start_end": [round(load_start, 2),
                                             round(os.getloadavg()[0], 2)]})))


if __name__ == "__main__":
    main()
