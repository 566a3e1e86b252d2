"""The distributed world in one place: size and rank, gather and broadcast of python objects.

Outside an initialised ``torch.distributed`` process group every helper acts as a world of one
(size 1, rank 0), so the same code runs on one process, under DDP, and in tests.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["all_gather_rows", "broadcast_object", "gather_objects", "is_distributed", "world"]


def is_distributed() -> bool:
    """True inside an initialised process group (of any size)."""
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """``(world_size, rank)`` of this process; ``(1, 0)`` without a process group."""
    if is_distributed():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def gather_objects(obj: Any) -> list[Any]:
    """All ranks' ``obj`` in rank order (``[obj]`` in a world of one). Collective."""
    size, _ = world()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself in a world of one). Collective."""
    if world()[0] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_rows(x: Tensor, *, grad: bool = False) -> tuple[Tensor, int]:
    """Every rank's rows of ``x`` in rank order, and where this rank's rows start. Collective.

    Ranks may hold different row counts (a last batch): the counts are gathered first and each
    rank pads to the longest, so every collective moves equal shapes.

    Args:
        x: (n_rank, ...) this rank's rows; every other dim equal on all ranks.
        grad: gradients flow back to each rank's own rows
            (``torch.distributed.nn.functional.all_gather``): the backward sums, over all ranks,
            the gradient each rank's graph put on this rank's rows. A world of one returns ``x``.

    Returns:
        ``(rows (N, ...), offset)`` with N the sum of the ranks' counts.
    """
    size, rank = world()
    if size == 1:
        return x, 0
    count = torch.tensor([x.shape[0]], device=x.device)
    counts = [torch.empty_like(count) for _ in range(size)]
    dist.all_gather(counts, count)
    counts_list = [int(c) for c in counts]
    longest = max(counts_list)
    padded = x
    if x.shape[0] < longest:                                       # (longest, ...)
        padded = torch.cat([x, x.new_zeros(longest - x.shape[0], *x.shape[1:])])
    if grad:
        from torch.distributed.nn.functional import all_gather

        parts = list(all_gather(padded.contiguous()))
    else:
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded.contiguous())
    rows = torch.cat([p[:n] for p, n in zip(parts, counts_list)])   # (N, ...)
    return rows, sum(counts_list[:rank])
