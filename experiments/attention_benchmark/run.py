"""Attention benchmark: the mmtf core against raw SDPA and the textbook module, on CPU.

Question: does ``mmtf.nn.Attention`` add overhead over calling
``torch.nn.functional.scaled_dot_product_attention`` between the same Linear layers, and how much
faster and leaner is it than the textbook ``softmax(q k^T / sqrt(d)) v`` with a (T, T) mask?

Three modules with the same projections (to_q, to_kv, to_out, bias=False, weights copied from the
core) are timed at dim 512, 8 heads, causal:

* ``core``: ``mmtf.nn.Attention(dim=512, num_heads=8, causal=True)``;
* ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` between the Linears;
* ``naive``: the textbook module (nanoGPT style): scores, ``masked_fill(-inf)`` with a (T, T)
  triangular buffer, softmax, ``@ v``.

This file is, with ``mmtf/nn``, the one place allowed to call SDPA / write textbook attention:
they are the baselines.

Timing: forward in eval mode under ``torch.inference_mode``; forward+backward in train mode
(dropout is 0) with a gradient for the input and the weights. After a warm-up the three modules
are interleaved call by call (the order cycles through all 6 permutations); a repeat averages
each module's calls over enough rounds to last >= 0.1 s, and each (T, mode) gets as many repeats
as fit its time budget. The machine is shared: other jobs come and go and only ever add time. So
the table's times are the minimum over repeats, and every ratio is a paired ratio: per repeat,
one module's mean over the other's (calls alternated, so under the same load), then the median
over repeats. The ratio of minima is printed too, as a noise gauge, with the load average before
and after the run.

Memory: peak resident memory (RSS) above a baseline, measured in a fresh subprocess in which glibc
is told to serve every allocation >= 64 KiB with its own mmap (``MALLOC_MMAP_THRESHOLD_``), so
freed tensors leave RSS at once and RSS follows live memory. Per measurement: one warm-up call at
the same shape, then the kernel's peak-RSS mark is reset (``/proc/self/clear_refs`` = 5) and the
peak above the current RSS is read back (``VmHWM - VmRSS``). The baseline already holds the
weights, their gradients, the input and the output gradient, so the number is the activation and
workspace memory of one call (plus the input gradient). Linux only.

FLOPs counted per call: projections ``8 B T c^2`` plus attention ``4 B h T^2 d`` (q k^T and
p v, dense: the causal mask makes about half of it useless, and it is NOT halved here); forward +
backward counts 3x the forward.

Shapes: b batch, h heads, n query length (= T), m key length, c = dim, d = head_dim.

Run: ``python experiments/attention_benchmark/run.py [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.nn import Attention
from mmtf.perf.results import append_result

DIM, HEADS = 512, 8
TIME_CONFIGS = ((128, 8), (512, 8), (2048, 2))                 # (T, B)
MEM_CONFIGS = ((128, 8), (512, 8), (512, 2), (2048, 2))        # 512 also at B=2: equal batch
MODULES = ("core", "sdpa", "naive")


class SDPAAttention(nn.Module):
    """Raw SDPA between the core's three Linear layers (the zero-overhead baseline)."""

    def __init__(self, *, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(dim, 2 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x: (b, n, c) -> (b, n, c)."""
        q, k, v = self.heads(x)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)    # (b, h, n, d)
        return self.to_out(out.transpose(1, 2).reshape(x.shape))

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v, each (b, h, n, d), with plain view/transpose (no einops: the raw baseline)."""
        b, n, c = x.shape
        k, v = self.to_kv(x).split(c, dim=2)                              # (b, n, c) each
        return tuple(t.view(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)
                     for t in (self.to_q(x), k, v))


class TextbookAttention(SDPAAttention):
    """Causal attention as tutorials write it: a (T, T) mask buffer, masked_fill, softmax."""

    def __init__(self, *, dim: int, num_heads: int, max_len: int) -> None:
        super().__init__(dim=dim, num_heads=num_heads)
        # nanoGPT's "bias" buffer: lower-triangular ones, sliced to (T, T) each call.
        self.register_buffer("tril", torch.tril(torch.ones(max_len, max_len)).view(
            1, 1, max_len, max_len), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """x: (b, n, c) -> (b, n, c)."""
        n = x.shape[1]
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])        # (b, h, n, m)
        scores = scores.masked_fill(self.tril[:, :, :n, :n] == 0, float("-inf"))
        out = scores.softmax(dim=-1) @ v                                  # (b, h, n, d)
        return self.to_out(out.transpose(1, 2).reshape(x.shape))


def build_modules(max_len: int = 2048) -> dict[str, nn.Module]:
    """The three modules, sharing the core's (seeded) weights."""
    torch.manual_seed(0)
    core = Attention(dim=DIM, num_heads=HEADS, causal=True)
    sdpa = SDPAAttention(dim=DIM, num_heads=HEADS)
    naive = TextbookAttention(dim=DIM, num_heads=HEADS, max_len=max_len)
    sdpa.load_state_dict(core.state_dict())
    naive.load_state_dict(core.state_dict())
    return {"core": core, "sdpa": sdpa, "naive": naive}


def check_equal(mods: dict[str, nn.Module], b: int = 2, n: int = 256) -> None:
    """Assert the three modules compute the same function: outputs and all gradients."""
    torch.manual_seed(1)
    x0, g = torch.randn(b, n, DIM), torch.randn(b, n, DIM)
    results = {}
    for name, mod in mods.items():
        x = x0.clone().requires_grad_(True)
        mod.zero_grad(set_to_none=True)
        out = mod(x)
        out.backward(g)
        results[name] = [out.detach(), x.grad] + [p.grad for p in mod.parameters()]
    for name in ("sdpa", "naive"):
        for got, ref in zip(results[name], results["core"]):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    for mod in mods.values():
        mod.zero_grad(set_to_none=True)


def flops(b: int, n: int) -> tuple[float, float]:
    """(projection, dense attention) FLOPs of one forward call."""
    return 8.0 * b * n * DIM * DIM, 4.0 * b * HEADS * n * n * (DIM // HEADS)


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """float32 (size x size) @ (size x size) GFLOP/s, best of ``repeats`` after a warm-up."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * size**3 / min(times) / 1e9


def make_call(mod: nn.Module, x: Tensor, g: Tensor, mode: str,
              set_to_none: bool = True) -> Callable[[], None]:
    """A zero-argument call: eval forward under inference_mode, or train forward+backward.

    ``set_to_none=False`` keeps the weight gradients allocated between calls (zeroed in place).
    """
    if mode == "fwd":
        def call() -> None:
            mod.eval()
            with torch.inference_mode():
                mod(x)
    else:
        def call() -> None:
            mod.train()
            x.grad = None
            mod.zero_grad(set_to_none=set_to_none)
            mod(x).backward(g)
    return call


def time_config(mods: dict[str, nn.Module], b: int, n: int, mode: str, *, budget_s: float,
                min_repeats: int, max_repeats: int, min_sample_s: float, naive_repeats: int,
                ) -> dict[str, list[float]]:
    """Seconds per call of each module, one entry per repeat, modules interleaved call by call.

    A repeat runs ``inner`` rounds; a round calls every module once, in one of the possible orders
    (cycled, so each module follows each other one equally often); a module's sample is its mean
    call time over the repeat, >= ``min_sample_s`` in total. As many repeats as core + sdpa fit
    in ``budget_s`` (estimated from the warm-up), within [``min_repeats``, ``max_repeats``]; the
    textbook module, slow and compared with a wide margin, joins only the first ``naive_repeats``
    repeats, so the budget goes to the core / sdpa pairs, whose ratio needs the precision.
    """
    torch.manual_seed(2)
    x = torch.randn(b, n, DIM, requires_grad=(mode == "fwdbwd"))
    g = torch.randn(b, n, DIM)
    calls = {name: make_call(mod, x, g, mode) for name, mod in mods.items()}
    one = {}
    for name, call in calls.items():       # warm-up (first-call init), then one timed call each;
        for _ in range(2):                 # a warm-up over 1 s is its own estimate (saves time)
            t0 = time.perf_counter()
            call()
            one[name] = time.perf_counter() - t0
            if one[name] > 1.0:
                break
    inner = max(1, math.ceil(min_sample_s / one["core"]))
    per_repeat = inner * (one["core"] + one["sdpa"])
    repeats = min(max_repeats, max(min_repeats, int(budget_s / per_repeat)))
    times: dict[str, list[float]] = {name: [] for name in mods}
    rounds = 0
    for r in range(repeats):
        active = [name for name in mods if name != "naive" or r < naive_repeats]
        orders = list(itertools.permutations(active))
        total = dict.fromkeys(active, 0.0)
        for _ in range(inner):
            for name in orders[rounds % len(orders)]:
                t0 = time.perf_counter()
                calls[name]()
                total[name] += time.perf_counter() - t0
            rounds += 1
        for name in active:
            times[name].append(total[name] / inner)
    return times


# ---- memory (runs in a fresh subprocess, see the module docstring) ----------------------------

def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024


def _peak_mib(call: Callable[[], None]) -> float:
    """Peak RSS above the current RSS while ``call`` runs (MiB)."""
    with open("/proc/self/clear_refs", "w") as f:                     # reset VmHWM to VmRSS
        f.write("5")
    base = _status_mib("VmRSS")
    call()
    return _status_mib("VmHWM") - base


def memory_worker(configs: list[tuple[int, int]]) -> None:
    """Print one JSON line: {module: {"T,B": [inference MiB, fwd+bwd MiB]}}."""
    mods = build_modules()
    result: dict[str, dict[str, list[float]]] = {name: {} for name in mods}
    for n, b in configs:
        torch.manual_seed(2)
        x = torch.randn(b, n, DIM, requires_grad=True)
        g = torch.randn(b, n, DIM)
        for name, mod in mods.items():
            peaks = []
            for mode in ("fwd", "fwdbwd"):
                call = make_call(mod, x, g, mode, set_to_none=False)  # weight grads stay
                call()                                                 # warm-up, same shape
                peaks.append(_peak_mib(call))
            result[name][f"{n},{b}"] = peaks
            mod.zero_grad(set_to_none=True)
            x.grad = None
    print(json.dumps(result))


def measure_memory(configs: tuple[tuple[int, int], ...],
                   ) -> dict[str, dict[str, list[float]]] | None:
    """Run ``memory_worker`` in a fresh process; None where /proc is not available."""
    if not os.path.exists("/proc/self/clear_refs"):
        print("memory: /proc/self/clear_refs not found (Linux only); memory not measured.",
              file=sys.stderr)
        return None
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}
    cmd = [sys.executable, __file__, "--memory-worker", *(f"{n},{b}" for n, b in configs)]
    proc = subprocess.run(cmd, env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- where the core's time goes (--profile) ----------------------------------------------------

def profile_ops(mods: dict[str, nn.Module], b: int = 2, n: int = 2048, calls: int = 3) -> None:
    """Print, for forward+backward, the aten ops whose count or time differ between core and sdpa."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(2)
    x = torch.randn(b, n, DIM, requires_grad=True)
    g = torch.randn(b, n, DIM)
    stats = {}
    for name in ("core", "sdpa"):
        call = make_call(mods[name], x, g, "fwdbwd")
        call()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                call()
        stats[name] = {e.key: (e.count / calls, e.self_cpu_time_total / calls / 1e3)
                       for e in prof.key_averages() if e.key.startswith("aten::")}
    print(f"\nfwd+bwd aten ops at T={n} B={b}, per call (count, self ms), where core != sdpa:")
    for op in sorted(set(stats["core"]) | set(stats["sdpa"])):
        c, s = stats["core"].get(op, (0, 0.0)), stats["sdpa"].get(op, (0, 0.0))
        if c[0] != s[0] or abs(c[1] - s[1]) > 5.0:
            print(f"  {op:<60} core {c[0]:4.0f} {c[1]:8.2f} ms   sdpa {s[0]:4.0f} {s[1]:8.2f} ms")


# ---- main --------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (< 1 min)")
    parser.add_argument("--profile", action="store_true",
                        help="only list the ops where core and sdpa differ (fwd+bwd, T=2048)")
    parser.add_argument("--memory-worker", nargs="*", metavar="T,B", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker is not None:
        memory_worker([tuple(map(int, c.split(","))) for c in args.memory_worker])
        return
    timing = (dict(budget_s=2.0, min_repeats=2, max_repeats=9, min_sample_s=0.05,
                   naive_repeats=2) if args.quick
              else dict(budget_s=20.0, min_repeats=7, max_repeats=41, min_sample_s=0.1,
                        naive_repeats=7))
    wall0, load0 = time.perf_counter(), os.getloadavg()

    mods = build_modules()
    check_equal(mods)
    if args.profile:
        profile_ops(mods)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, dim {DIM}, "
          f"{HEADS} heads, causal; outputs and gradients of core/sdpa/naive checked equal.")
    # The matmul is timed before every (T, mode) block and the best is kept: under the same load
    # as the attention timings, which are also best-of.
    matmul, times = [], {}
    for n, b in TIME_CONFIGS:
        for mode in ("fwd", "fwdbwd"):
            matmul.append(matmul_gflops(repeats=1 if args.quick else 3))
            times[(n, b, mode)] = time_config(mods, b, n, mode, **timing)
    peak = max(matmul)
    print(f"float32 matmul 2048x2048 @ 2048x2048: {peak:.1f} GFLOP/s (best of {len(matmul)}x3, "
          f"timed between the blocks; worst block {min(matmul):.1f})")
    repeats = sorted({len(t["core"]) for t in times.values()})
    best = {key: {name: min(ts) for name, ts in val.items()} for key, val in times.items()}
    def ratio(num: str, den: str, n: int, b: int, mode: str) -> float:
        """Median over repeats of the paired ratio num / den."""
        t = times[(n, b, mode)]
        return statistics.median(u / v for u, v in zip(t[num], t[den]))

    def ratio_of_min(num: str, den: str, n: int, b: int, mode: str) -> float:
        return best[(n, b, mode)][num] / best[(n, b, mode)][den]

    # --quick measures memory only at B=2, the pair the memory ratio needs.
    mem = measure_memory(MEM_CONFIGS[2:] if args.quick else MEM_CONFIGS)

    print(f"\ntimes: best of {repeats[0]}-{repeats[-1]} interleaved repeats (textbook: the first "
          f"{timing['naive_repeats']}); /core: median paired "
          f"ratio; GFLOP/s: projections + dense attention (fwd+bwd = 3x fwd); memory: peak RSS "
          f"above baseline, MiB.")
    head = (f"{'module':<6} {'T':>5} {'B':>2} {'fwd ms':>9} {'GF/s':>6} {'f+b ms':>9} "
            f"{'GF/s':>6} {'/core f':>7} {'/core fb':>8} {'mem inf':>8} {'mem f+b':>8}")
    print(head)
    print("-" * len(head))
    nan2 = (math.nan, math.nan)
    for n, b in TIME_CONFIGS:
        fl = sum(flops(b, n))
        for name in MODULES:
            tf, tb = best[(n, b, "fwd")][name], best[(n, b, "fwdbwd")][name]
            rf, rb = ratio(name, "core", n, b, "fwd"), ratio(name, "core", n, b, "fwdbwd")
            mi, mb = mem[name].get(f"{n},{b}", nan2) if mem else nan2
            print(f"{name:<6} {n:>5} {b:>2} {tf * 1e3:>9.2f} {fl / tf / 1e9:>6.1f} "
                  f"{tb * 1e3:>9.2f} {3 * fl / tb / 1e9:>6.1f} {rf:>7.2f} {rb:>8.2f} "
                  f"{mi:>8.1f} {mb:>8.1f}")
    if mem:
        print("\nmemory at equal batch B=2 (MiB, inference / fwd+bwd):")
        for name in MODULES:
            (i512, b512), (i2k, b2k) = mem[name]["512,2"], mem[name]["2048,2"]
            print(f"  {name:<6} T=512: {i512:7.1f} / {b512:7.1f}   T=2048: {i2k:7.1f} / "
                  f"{b2k:7.1f}   ratio 2048/512: {i2k / i512:5.2f} / {b2k / b512:5.2f}")
    print("\nFLOPs per forward call (GFLOP): " + ", ".join(
        f"T={n} B={b}: proj {flops(b, n)[0] / 1e9:.2f} + attn {flops(b, n)[1] / 1e9:.2f}"
        for n, b in TIME_CONFIGS))


    rows = {f"{mode}_t{n}": (n, b, mode) for n, b in TIME_CONFIGS for mode in ("fwd", "fwdbwd")}
    core_over_sdpa = {k: ratio("core", "sdpa", *row) for k, row in rows.items()}
    core_over_sdpa_min = {k: ratio_of_min("core", "sdpa", *row) for k, row in rows.items()}
    print("core / sdpa, median paired ratio: " + ", ".join(
        f"{k} {v:.3f}" for k, v in core_over_sdpa.items()))
    print("core / sdpa, ratio of minima (noise gauge): " + ", ".join(
        f"{k} {v:.3f}" for k, v in core_over_sdpa_min.items()))
    print(f"load average 1 min: {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end "
          f"({os.cpu_count()} CPUs); wall time {time.perf_counter() - wall0:.0f} s")

    def mem_ratio(name: str, idx: int) -> float:
        return mem[name]["2048,2"][idx] / mem[name]["512,2"][idx] if mem else math.nan

    summary = {
        "core_over_sdpa_max": round(max(core_over_sdpa.values()), 3),
        "naive_over_core_fwd_t2048": round(ratio("naive", "core", 2048, 2, "fwd"), 3),
        "naive_over_core_fwdbwd_t2048": round(ratio("naive", "core", 2048, 2, "fwdbwd"), 3),
        "core_mem_2048_over_512": round(mem_ratio("core", 1), 3),
        "naive_mem_2048_over_512": round(mem_ratio("naive", 1), 3),
        "core_mem_inference_2048_over_512": round(mem_ratio("core", 0), 3),
        "core_over_sdpa_max_ratio_of_min": round(max(core_over_sdpa_min.values()), 3),
        "matmul_gflops": round(peak, 1),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
    }
    print(json.dumps(summary))
    append_result(__file__, summary)

if __name__ == "__main__":
    main()
