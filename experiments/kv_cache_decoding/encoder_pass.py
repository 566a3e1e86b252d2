"""One encoder pass with and without oneDNN-packed weights: the measurement that decides whether
``generate`` should pack the encoder too (it does not: 1.04x on the default encoder, under the
1.1x bar; docs/design/packed-linear.md). ``packed_linear_weights`` packs every linear layer of
the encoder, encodes, and drops the copies again; the packing is inside the timed region (a
generate call would pay it every time).

Encoders: `experiment=audio_captioning`'s (batch 32 of 4 s) and the same with Whisper-tiny's
width and depth (``dim=384 depth=4 num_heads=6``; batch 2 of 30 s). Random weights and
waveforms; no gradient; the two ways are interleaved over ``--repeats`` rounds and each reports
the median of its per-round medians of ``--calls`` calls.

    python experiments/kv_cache_decoding/encoder_pass.py [--threads 2] [--repeats 5]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from functools import partial
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mmtf.nn.linear import packed_linear_weights
from mmtf.perf.device import cpu_flags, describe_cpu, median_call_ms
from mmtf.perf.results import append_result

CONF = Path(__file__).resolve().parents[2] / "conf"
ENCODERS = {   # name: (overrides, batch, seconds)
    "default (dim 128, depth 3), 32 x 4 s": ([], 32, 4.0),
    "whisper-tiny size (dim 384, depth 4), 2 x 30 s":
        (["model.encoder.dim=384", "model.encoder.depth=4", "model.encoder.num_heads=6"], 2, 30.0),
}


def build(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=["experiment=audio_captioning", *overrides])
    torch.manual_seed(0)
    return instantiate(cfg.model).model.eval(), int(cfg.data.synthetic.sample_rate)


def encode(model, inputs: torch.Tensor, lengths: torch.Tensor, packed: bool) -> None:
    """One encoder pass, packing the encoder's linear layers for it if ``packed``."""
    if packed:
        with packed_linear_weights(model.encoder, rows=inputs.shape[0]):
            model.encode(inputs, lengths)
    else:
        model.encode(inputs, lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    results = {}
    with torch.no_grad():
        for name, (overrides, batch, seconds) in ENCODERS.items():
            model, rate = build(overrides)
            samples = int(seconds * rate)
            inputs = torch.randn(batch, samples) * 0.1                     # (b, samples)
            lengths = torch.full((batch,), samples)
            plain, packed = [], []
            for _ in range(args.repeats):
                plain.append(median_call_ms(partial(encode, model, inputs, lengths, False),
                                            args.calls))
                packed.append(median_call_ms(partial(encode, model, inputs, lengths, True),
                                             args.calls))
            reference = model.encode(inputs, lengths)[0]
            with packed_linear_weights(model.encoder, rows=batch):
                difference = float((model.encode(inputs, lengths)[0] - reference).abs().max())
            results[name] = {"plain_ms": round(statistics.median(plain), 1),
                             "packed_ms": round(statistics.median(packed), 1),
                             "speedup": round(statistics.median(plain)
                                              / statistics.median(packed), 3),
                             "max_abs_difference": difference}

    print(f"cpu: {describe_cpu()}; threads {args.threads}; "
          f"load {load_start:.2f} -> {os.getloadavg()[0]:.2f}")
    print("| encoder | F.linear ms | packed ms (incl. packing) | speed-up | max abs diff |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['plain_ms']} | {r['packed_ms']} | {r['speedup']:.2f}x | "
              f"{r['max_abs_difference']:.1e} |")
    print(json.dumps(append_result(__file__, {"encoders": results, "threads": args.threads, "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "load_avg_start_end": [round(load_start, 2),
                                             round(os.getloadavg()[0], 2)]})))


if __name__ == "__main__":
    main()
