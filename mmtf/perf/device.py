"""What the device offers a training step: CPU flags, the SDPA kernel the core runs, bf16 speed.

:func:`cpu_flags` (from ``/proc/cpuinfo``), :func:`bf16_warning` (bf16 without native support is
emulated: a warning, never a refusal), :func:`sdpa_backends` (the kernel torch dispatches to for
each attention shape of a model). Why the defaults never depend on these:
docs/design/training-precision.md."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from mmtf.nn.attention import Attention
from mmtf.utils.compat import dispatched_ops

# The flags that decide matmul speed on x86 CPUs, in the order they are printed.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# A CPU with one of these runs bf16 matmuls natively (oneDNN); without, bf16 is emulated.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# ATen ops of SDPA's fused kernels -> the backend name (the CPU's fused kernel: "flash (cpu)").
# The math path has no op of its own below autograd (it decomposes into bmm and softmax).
SDPA_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "fused (other)",
}


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, bool] | None:
    """``{flag: present}`` for :data:`CPU_FLAGS`, or None where ``cpuinfo`` is unreadable
    (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    present: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            break
    return {flag: flag in present for flag in CPU_FLAGS}


def describe_cpu(flags: dict[str, bool] | None = None) -> str:
    """One line: torch's CPU capability and the :data:`CPU_FLAGS` present or missing."""
    flags = cpu_flags() if flags is None else flags
    capability = torch.backends.cpu.get_cpu_capability()
    if flags is None:
        return f"cpu capability {capability} (flags unknown: no /proc/cpuinfo)"
    listed = " ".join(f"{k}={'yes' if v else 'no'}" for k, v in flags.items())
    return f"cpu capability {capability}, {listed}"


def quantity_table(rows: list[tuple[str, str]]) -> str:
    """The benchmarks' two-column markdown table (``| quantity | value |``), keys padded."""
    width = max(len(key) for key, _ in rows)
    lines = [f"| {'quantity':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
    return "\n".join([*lines, *(f"| {key:<{width}} | {value} |" for key, value in rows)])


def median_call_ms(fn: Callable[[], object], calls: int) -> float:
    """The benchmarks' timing of one way: median milliseconds of ``calls`` calls of ``fn`` after
    one warm-up call (first-call costs: oneDNN primitives, allocator growth, kernel caches)."""
    times = []
    for _ in range(calls + 1):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def has_native_bf16(flags: dict[str, bool] | None = None) -> bool | None:
    """Whether the CPU computes bf16 matmuls natively; None when the flags are unknown."""
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return None
    return any(flags[f] for f in NATIVE_BF16_FLAGS)


def bf16_warning(precision: str, device_type: str,
                 flags: dict[str, bool] | None = None) -> str | None:
    """The warning for bf16 training on a CPU without native bf16, else None.

    Args:
        precision: Lightning's ``trainer.precision`` (``32-true``, ``bf16-mixed``, ...).
        device_type: the training device (``cpu``, ``cuda``, ...); only a CPU is judged.
        flags: :func:`cpu_flags` (default: this machine's).
    """
    if device_type != "cpu" or "bf16" not in str(precision):
        return None
    flags = cpu_flags() if flags is None else flags
    if has_native_bf16(flags) is not False:
        return None
    return (f"trainer.precision={precision} on a CPU without avx512_bf16 or amx_bf16 "
            f"({describe_cpu(flags)}): bf16 matmuls are emulated there, and a step is expected "
            f"to run several times slower than float32 (about 10x measured on the default "
            f"audio captioning run). Use trainer.precision=32-true on this CPU.")


def _first(model: nn.Module, *, causal: bool, cross: bool) -> Attention | None:
    for module in model.modules():
        if isinstance(module, Attention) and module.causal == causal and module.is_cross == cross:
            return module
    return None


def sdpa_backends(model: nn.Module, device: torch.device | str, dtype: torch.dtype,
                  *, batch: int = 2, length: int = 64) -> dict[str, str]:
    """The SDPA kernel each attention role of ``model`` runs on ``device``.

    Calls copies of the model's :class:`Attention` layers on random inputs and reads the ATen
    op each call dispatched to.

    Args:
        model: a model built from mmtf's attention core (on any device; layers are copied).
        device: where the training step runs.
        dtype: the compute dtype (float32, or the autocast dtype of mixed precision).
        batch, length: probe shapes; half of the keys of the padded shapes are masked.

    Returns:
        ``{"causal self-attention": ..., "padded self-attention": ..., "cross-attention": ...}``
        for the roles the model has; values from :data:`SDPA_OPS`, or "math".
    """
    device = torch.device(device)
    key_mask = torch.ones(batch, length, dtype=torch.bool, device=device)   # (b, m)
    key_mask[1::2, length // 2:] = False                  # every other row: half its keys padded
    probes = {
        "causal self-attention": (_first(model, causal=True, cross=False), False, None),
        "padded self-attention": (_first(model, causal=False, cross=False), False, key_mask),
        "cross-attention": (_first(model, causal=False, cross=True), True, key_mask),
    }
    found: dict[str, str] = {}
    for role, (layer, cross, mask) in probes.items():
        if layer is None:
            continue
        layer = _probe_copy(layer, device)
        x = torch.randn(batch, length, layer.dim, device=device)
        context = torch.randn(batch, length, layer.kv_dim, device=device) if cross else None
        autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
        with torch.no_grad(), autocast:
            ops = dispatched_ops(lambda: layer(x, context, key_mask=mask))  # noqa: B023
        fused = [SDPA_OPS[op] for op in ops if op in SDPA_OPS]
        found[role] = fused[0] if fused else "math"
    return found


def _probe_copy(layer: Attention, device: torch.device) -> Attention:
    """A fresh layer of the same configuration on ``device`` (the model's weights stay put)."""
    probe = Attention(dim=layer.dim, num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads,
                      causal=layer.causal, rope=None, kv_dim=layer.kv_dim)
    return probe.to(device).eval()
