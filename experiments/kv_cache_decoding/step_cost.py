"""What an eager decode step costs the CPU, by thread count: mmtf's eager step against HF bart.

Same shapes as run.py (B=8, memory 256, 6 x 512, vocab 8000), fp32, greedy. Counts the ATen
operators one cached mmtf step dispatches (``mmtf.utils.compat.dispatched_ops``: a count, the
same on any machine), then per thread count times ``--calls`` generate calls of ``--tokens``
tokens per system after a warm-up: wall ms per step and the process's user / system CPU ms per
step (``getrusage``). Two threads against one shows what the second core adds in this hour.

    python experiments/kv_cache_decoding/step_cost.py [--threads 1 2] [--tokens 64] [--calls 3]

Last line: JSON with the operator count and the per-thread-count numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import run as bench  # noqa: E402
from profile_step import shapes  # noqa: E402

from mmtf.perf.device import describe_cpu, quantity_table  # noqa: E402
from mmtf.perf.results import append_result  # noqa: E402
from mmtf.utils.compat import dispatched_ops  # noqa: E402


def ops_per_step(dec, memory: torch.Tensor) -> int:
    """ATen operators of one cached step after the first (the cross K/V already cached)."""
    cache = dec.make_cache(batch_size=memory.shape[0], max_len=8, context_len=memory.shape[1])
    token = torch.full((memory.shape[0], 1), bench.BOS, dtype=torch.long)
    with torch.inference_mode():
        dec.step(token, cache, memory=memory)
        dec.step(token, cache)
        return len(dispatched_ops(lambda: dec.step(token, cache)))


def cost(fn, calls: int, steps: int) -> dict[str, float]:
    """ms per step: wall, user CPU, system CPU, over ``calls`` calls after one warm-up."""
    fn()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(calls):
        fn()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    n = calls * steps
    return {"wall": 1e3 * (t1 - t0) / n, "user": 1e3 * (r1.ru_utime - r0.ru_utime) / n,
            "sys": 1e3 * (r1.ru_stime - r0.ru_stime) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    dims = shapes(tokens=args.tokens)
    dec, peer = bench.build_mmtf(dims), bench.build_peer("bart", dims)
    memory = torch.randn(dims.batch, dims.frames, dims.dim, generator=torch.Generator().manual_seed(0))
    load = os.getloadavg()[0]
    result: dict = {"ops_per_eager_step": ops_per_step(dec, memory), "threads": {}}
    for threads in args.threads:
        torch.set_num_threads(threads)
        mmtf = cost(lambda: bench.run_mmtf(dec, memory, args.tokens, use_cache=True),
                    args.calls, args.tokens)
        bart = cost(lambda: bench.run_peer(peer, memory, args.tokens), args.calls, args.tokens)
        result["threads"][threads] = {"mmtf": mmtf, "bart": bart,
                                      "bart_over_mmtf": bart["wall"] / mmtf["wall"]}
    rows = [("cpu", describe_cpu()),
            ("setting", f"B={dims.batch}, memory {dims.frames}, {args.tokens} tokens x "
                        f"{args.calls} calls, depth {dims.depth}, dim {dims.dim}, fp32, eager"),
            ("ATen operators per mmtf eager step", str(result["ops_per_eager_step"]))]
    for threads, r in result["threads"].items():
        m, b = r["mmtf"], r["bart"]
        rows.append((f"{threads} thread(s): mmtf / bart ms per step (wall)",
                     f"{m['wall']:.1f} / {b['wall']:.1f} (bart / mmtf {r['bart_over_mmtf']:.2f}x)"))
        rows.append((f"{threads} thread(s): mmtf user / sys CPU ms per step",
                     f"{m['user']:.1f} / {m['sys']:.1f}"))
    if len(result["threads"]) > 1:
        walls = {t: r["mmtf"]["wall"] for t, r in result["threads"].items()}
        lo, hi = min(walls), max(walls)
        result["mmtf_thread_speedup"] = walls[lo] / walls[hi]
        rows.append((f"mmtf: {hi} threads over {lo}", f"{result['mmtf_thread_speedup']:.2f}x"))
    rows.append(("load average (1 min) before / after", f"{load:.2f} / {os.getloadavg()[0]:.2f}"))
    print(quantity_table(rows))
    print(json.dumps(result))
    append_result(__file__, result)


if __name__ == "__main__":
    main()
