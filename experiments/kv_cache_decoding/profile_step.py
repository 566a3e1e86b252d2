"""Where does a cached decode step go? Per-step time by operator, mmtf vs the HF peer.

Same shapes as run.py (B=8, memory 256, 6 x 512, vocab 8000), greedy, ``--tokens`` steps,
torch.profiler self-CPU time grouped into GEMM, attention kernel, other ATen ops and the rest of
the wall time (Python and dispatch). A second pass on a tiny model (dim 64, vocab 200, memory
16: negligible arithmetic) measures the per-step framework overhead alone. ``--compile`` adds a
row for ``generate(compile=True)``: its MKL GEMMs count as GEMM, inductor's fused kernels that
contain the softmax as attention and its other fused kernels as "other" (the kernels are
profiled by name via ``torch._inductor.config.cpp.enable_kernel_profile``).

    python experiments/kv_cache_decoding/profile_step.py [--threads 1] [--tokens 32] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).parent))
import run as bench  # noqa: E402

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "mkl::_mkl_linear"}
ATTN = {"aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_attention_math"}


def breakdown(fn, steps: int) -> dict[str, float]:
    """ms per step: wall, GEMM, attention kernel, other ATen, Python/dispatch (the rest)."""
    start = time.perf_counter()
    with profile() as prof:
        fn()
    wall = (time.perf_counter() - start) * 1e3 / steps
    groups = {"gemm": 0.0, "attention": 0.0, "other aten": 0.0}
    for e in prof.key_averages():
        fused = e.key.startswith("graph_") and "cpp_fused" in e.key      # an inductor kernel
        if not (e.key.startswith("aten::") or e.key in GEMM or fused):
            continue
        attention = e.key in ATTN or (fused and "softmax" in e.key)
        key = "gemm" if e.key in GEMM else "attention" if attention else "other aten"
        groups[key] += e.self_cpu_time_total / 1e3 / steps
    groups["python + dispatch"] = wall - sum(groups.values())
    return {"wall": wall, **groups}


def shapes(**kw) -> argparse.Namespace:
    base = dict(batch=8, frames=256, dim=512, depth=6, heads=8, ffn=2048, vocab=8000)
    return argparse.Namespace(**(base | kw))


def overhead(args: argparse.Namespace, repeats: int = 5) -> dict[str, float]:
    """Median ms per step of a model with negligible arithmetic."""
    memory = torch.randn(args.batch, args.frames, args.dim)
    systems = {"mmtf": bench.build_mmtf(args), "bart": bench.build_peer("bart", args)}
    times = {k: [] for k in systems}
    for _ in range(repeats):
        for name, model in systems.items():
            if name == "mmtf":
                total = bench.run_mmtf(model, memory, args.tokens, True)[0]
            else:
                total = bench.run_peer(model, memory, args.tokens)
            times[name].append(total * 1e3 / args.tokens)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--compile", action="store_true",
                        help="also profile generate(compile=True) (compiles first, ~1 min)")
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    if cli.compile:
        import torch._inductor.config as inductor_config
        inductor_config.cpp.enable_kernel_profile = True
    args = shapes(tokens=cli.tokens)
    memory = torch.randn(args.batch, args.frames, args.dim)
    dec, peer = bench.build_mmtf(args), bench.build_peer("bart", args)
    bench.run_mmtf(dec, memory, 4, True), bench.run_peer(peer, memory, 4)
    rows = {"mmtf": [], "HF bart": []}
    if cli.compile:
        bench.run_mmtf(dec, memory, cli.tokens, True, compile=True)      # compiles
        rows["mmtf compiled"] = []
    for _ in range(2):                                   # interleaved, best of two
        rows["mmtf"].append(breakdown(lambda: bench.run_mmtf(dec, memory, cli.tokens, True),
                                      cli.tokens))
        if cli.compile:
            rows["mmtf compiled"].append(breakdown(
                lambda: bench.run_mmtf(dec, memory, cli.tokens, True, compile=True), cli.tokens))
        rows["HF bart"].append(breakdown(lambda: bench.run_peer(peer, memory, cli.tokens),
                                         cli.tokens))
    print(f"ms per step, {cli.tokens} tokens, threads {cli.threads} (profiled run with the "
          f"lower wall time)")
    print("| system | wall | gemm | attention | other aten (and fused) | python + dispatch |")
    print("|---|---|---|---|---|---|")
    for name, runs in rows.items():
        best = min(runs, key=lambda r: r["wall"])
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in best.values()) + " |")
    tiny = overhead(shapes(frames=16, dim=64, ffn=256, vocab=200, tokens=64))
    print(f"framework overhead per step (dim 64, vocab 200, memory 16; no profiler): "
          f"mmtf {tiny['mmtf']:.2f} ms, HF bart {tiny['bart']:.2f} ms")


if __name__ == "__main__":
    main()
