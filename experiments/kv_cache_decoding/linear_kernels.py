"""One linear layer, two kernels: ``F.linear`` (MKL's SGEMM on a CPU) against mmtf's oneDNN-packed
copy (``mmtf.nn.Linear`` inside ``packed_linear_weights``), per shape of the decoding benchmark.

Shapes: the decoder-base layers of run.py (dim 512, MLP 2048, vocab 8000) at 8 rows (a decode
step of batch 8) and at 2048 rows (an encoder pass, or a training step's forward). Each
measurement is the 10th percentile of ``--calls`` calls after a warm-up; the two kernels are
interleaved over ``--rounds`` rounds and the best round counts. Weight read rate = weight bytes
/ time (the decode-step view, at 8 rows: every weight is read once per call); GFLOP/s = 2 * rows * in * out
/ time. fp32, inference mode.

    python experiments/kv_cache_decoding/linear_kernels.py [--threads 2] [--calls 200]

Prints a table and, last, one JSON line with the per-shape times and the speedup.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from mmtf.nn.linear import Linear, packed_linear_weights
from mmtf.perf.device import cpu_flags, describe_cpu
from mmtf.perf.results import append_result

SHAPES = [(8, 512, 512), (8, 512, 1024), (8, 512, 2048), (8, 2048, 512), (8, 512, 8000),
          (2048, 512, 2048), (2048, 2048, 512)]


def p10_us(layer: Linear, x: torch.Tensor, calls: int) -> float:
    for _ in range(10):
        layer(x)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        layer(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 10] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows_out, results = [], []
    for rows, fan_in, fan_out in SHAPES:
        layer = Linear(fan_in, fan_out, bias=False)    # outside inference mode: it can pack
        x = torch.randn(rows, fan_in)
        best = {"F.linear": float("inf"), "packed": float("inf")}
        with torch.inference_mode():
            for _ in range(args.rounds):
                with torch.backends.mkldnn.flags(enabled=False):        # no copy: F.linear
                    best["F.linear"] = min(best["F.linear"], p10_us(layer, x, args.calls))
                with packed_linear_weights(layer, rows=rows) as packed:
                    if packed != 1:
                        raise SystemExit("oneDNN is not available in this torch build")
                    best["packed"] = min(best["packed"], p10_us(layer, x, args.calls))
        weight_mb = fan_in * fan_out * 4 / 1e6
        flop = 2 * rows * fan_in * fan_out
        speedup = best["F.linear"] / best["packed"]
        results.append({"rows": rows, "in": fan_in, "out": fan_out,
                        "f_linear_us": round(best["F.linear"], 1),
                        "packed_us": round(best["packed"], 1), "speedup": round(speedup, 2)})
        # The weight read rate describes a decode step; at 2048 rows the GEMM is compute-bound.
        read = (f"{weight_mb / best['F.linear'] * 1e3:.0f} / "
                f"{weight_mb / best['packed'] * 1e3:.0f}" if rows <= 64 else "-")
        rows_out.append(
            f"| {rows} x {fan_in} -> {fan_out} | {best['F.linear']:.0f} / {best['packed']:.0f}"
            f" | {read} | {flop / best['F.linear'] / 1e3:.0f} / {flop / best['packed'] / 1e3:.0f}"
            f" | {speedup:.2f}x |")
    print(f"{describe_cpu()}; threads {args.threads}; fp32; p10 of {args.calls} calls, best of "
          f"{args.rounds} interleaved rounds")
    print("| rows x in -> out | us: F.linear / packed | weight GB/s | GFLOP/s | speedup |")
    print("|---|---|---|---|---|")
    print("\n".join(rows_out))
    print(json.dumps(append_result(__file__, {"shapes": results, "threads": args.threads, "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()})))


if __name__ == "__main__":
    main()
