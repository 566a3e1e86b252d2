"""Model FLOPs of a training step and the dense matmul rate of a device: the two halves of MFU.

Forward hooks count the matmul work of the shapes that run, times 3 for a training step (Kaplan
et al. 2020; PaLM's MFU). Per call (multiply-add = 2 FLOPs): ``nn.Linear`` ``2 * in * out`` per
row; ``nn.Conv1d/2d`` ``2 * in / groups * kernel * out`` per output position;
:class:`mmtf.nn.Attention` ``4 * h * d`` per (query, key) pair (``n (n + 1) / 2`` pairs when
causal without a cache). Elementwise work is not counted and padding is not subtracted, as in
nanoGPT's ``estimate_mfu``.

Shapes: b batch, n query length, m key length, h heads, d head dim."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor, nn

from mmtf.nn.attention import Attention

# Forward + backward (input and weight gradients) of every counted matmul.
TRAINING_MULTIPLIER = 3


def linear_flops(module: nn.Linear, output: Tensor) -> int:
    """Forward FLOPs of ``module`` producing ``output`` (..., out_features)."""
    rows = output.numel() // module.out_features
    return 2 * module.in_features * module.out_features * rows


def conv_flops(module: nn.Conv1d | nn.Conv2d, output: Tensor) -> int:
    """Forward FLOPs of a convolution producing ``output`` (b, c_out, *positions)."""
    per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
    return 2 * per_output * output.numel()


def attention_flops(module: Attention, x: Tensor, context: Tensor | None,
                    cache: Any = None) -> int:
    """Forward FLOPs of the score and weighted-sum matmuls of one :class:`Attention` call.

    Args:
        module: the attention layer.
        x: its queries, (b, n, c).
        context: the cross-attention source (b, m, c_kv), or None for self-attention.
        cache: the layer's KV cache, if any (then the keys are the cached plus the new ones).
    """
    b, n = x.shape[0], x.shape[1]
    if module.is_cross:
        m = context.shape[1] if context is not None else cache.length
        pairs = n * m
    else:
        offset = cache.length if cache is not None else 0
        # Causal: query i sees offset + i + 1 keys; bidirectional: all offset + n.
        pairs = n * offset + n * (n + 1) // 2 if module.causal else n * (offset + n)
    return 4 * b * module.num_heads * module.head_dim * pairs


class FlopCounter:
    """Forward matmul FLOPs of every call inside a ``with`` block (see the module docstring).

    Hooks live from ``__enter__`` to ``__exit__``; :attr:`training_flops` is three times
    :attr:`forward_flops`.

    Args:
        model: the module whose submodules are counted.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.forward_flops = 0
        self._handles: list[Any] = []

    @property
    def training_flops(self) -> int:
        """Model FLOPs of a training step: forward and backward."""
        return TRAINING_MULTIPLIER * self.forward_flops

    def _add_linear(self, module: nn.Module, _args: Any, output: Tensor) -> None:
        self.forward_flops += linear_flops(module, output)

    def _add_conv(self, module: nn.Module, _args: Any, output: Tensor) -> None:
        self.forward_flops += conv_flops(module, output)

    def __enter__(self) -> FlopCounter:
        for module in self.model.modules():
            if isinstance(module, nn.Linear):
                self._handles.append(module.register_forward_hook(self._add_linear))
            elif isinstance(module, (nn.Conv1d, nn.Conv2d)):
                self._handles.append(module.register_forward_hook(self._add_conv))
            elif isinstance(module, Attention):
                # Before the call: the cache length must be read before the new keys go in.
                self._handles.append(module.register_forward_pre_hook(
                    self._pre_attention, with_kwargs=True))
        return self

    def _pre_attention(self, module: Attention, args: tuple, kwargs: dict) -> None:
        context = args[1] if len(args) > 1 else kwargs.get("context")
        self.forward_flops += attention_flops(module, args[0], context, kwargs.get("cache"))

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def matmul_flops_per_s(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                       *, size: int | None = None, repeats: int = 5) -> float:
    """Dense square-matmul rate of ``device`` in ``dtype`` (FLOP/s, best of ``repeats``).

    The denominator of MFU, measured rather than read from a table, so that a shared or
    throttled CPU is judged by what it can do now.

    Args:
        device, dtype: where and in which (autocast) dtype to measure.
        size: matrix side; default 1024 (CPU) or 4096 (accelerators).
        repeats: timed matmuls after one warm-up; the fastest counts.
    """
    device = torch.device(device)
    size = size or (1024 if device.type == "cpu" else 4096)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = math.inf
    with torch.no_grad():
        for i in range(repeats + 1):
            sync()
            start = time.perf_counter()
            a @ b
            sync()
            if i:                                           # the first call warms up
                best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best
