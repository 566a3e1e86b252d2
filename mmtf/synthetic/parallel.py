"""A process pool for the synthetic generators (fork where available: workers need no imports)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def parallel_map(fn: Callable[[Any], T], tasks: Sequence[Any], num_workers: int,
                 min_tasks: int = 64) -> list[T]:
    """``[fn(t) for t in tasks]``, over ``num_workers`` processes when there are enough tasks.

    Results come back in task order, so output never depends on the worker count."""
    if num_workers <= 1 or len(tasks) < min_tasks:
        return [fn(t) for t in tasks]
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    chunk = max(1, len(tasks) // (num_workers * 8))
    with ProcessPoolExecutor(max_workers=num_workers, mp_context=mp.get_context(method)) as ex:
        return list(ex.map(fn, tasks, chunksize=chunk))
