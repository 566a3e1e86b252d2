"""The distributed world in one place: size and rank, gather and broadcast of python objects.

Outside an initialised ``torch.distributed`` process group every helper acts as a world of one
(size 1, rank 0), so the same code runs on one process, under DDP, and in tests.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["broadcast_object", "gather_objects", "is_distributed", "world"]


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
