"""The attention core on a GPU: which SDPA kernel each role runs, and the core's cost over raw SDPA.

Question: on CUDA, does ``mmtf.nn.Attention`` run a fused kernel (flash / memory-efficient /
cuDNN) for causal self-attention, padded self-attention and cross-attention, and how much time
does it add over ``F.scaled_dot_product_attention`` between the same projections?
(``experiments/attention_benchmark`` asks the same on a CPU.)

    python experiments/gpu_check/attention.py [--dtype bfloat16] [--quick]

Last line: JSON with the kernel per role and the core / SDPA time ratio (forward + backward).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from einops import rearrange

from mmtf.nn import Attention
from mmtf.perf.device import sdpa_backends
from mmtf.perf.results import append_result

DIM, HEADS = 1024, 16                               # head_dim 64


def sdpa_reference(core: Attention, x: torch.Tensor) -> torch.Tensor:
    """Causal SDPA between the core's own projections: the floor the core is held to."""
    q = rearrange(core.to_q(x), "b n (h d) -> b h n d", h=HEADS)
    k, v = (rearrange(t, "b n (h d) -> b h n d", h=HEADS) for t in core.to_kv(x).chunk(2, -1))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return core.to_out(rearrange(out, "b h n d -> b n (h d)"))


def time_ms(fn, repeats: int) -> float:
    """Median milliseconds of forward + backward, CUDA events."""
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn().float().sum().backward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_float32_matmul_precision("high")
    roles = torch.nn.ModuleList([Attention(dim=DIM, num_heads=HEADS, causal=True),
                                 Attention(dim=DIM, num_heads=HEADS),
                                 Attention(dim=DIM, num_heads=HEADS, kv_dim=DIM)])
    kernels = sdpa_backends(roles, "cuda", dtype, batch=8, length=1024)
    core = roles[0].cuda()
    ratios = {}
    for n, b in ((1024, 16), (4096, 4)):
        x = torch.randn(b, n, DIM, device="cuda", requires_grad=True)
        pair = []
        for _ in range(3 if args.quick else 9):       # interleaved, paired
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                t_core = time_ms(lambda: core(x), 5)                        # noqa: B023
                t_sdpa = time_ms(lambda: sdpa_reference(core, x), 5)         # noqa: B023
            pair.append((t_core, t_sdpa))
        ratios[f"T{n}_B{b}"] = round(statistics.median(c / s for c, s in pair), 3)
        print(f"T={n} B={b}: core {statistics.median(c for c, _ in pair):.2f} ms, sdpa "
              f"{statistics.median(s for _, s in pair):.2f} ms (fwd+bwd, {args.dtype})")
    print(f"kernels: {kernels}")
    print(json.dumps(append_result(__file__, {"kernels": kernels, "core_over_sdpa": ratios, "dtype": args.dtype,
                      "device": torch.cuda.get_device_name()})))


if __name__ == "__main__":
    main()
