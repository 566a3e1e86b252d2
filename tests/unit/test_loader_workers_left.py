"""tests/conftest.py's shutdown of the DataLoader workers a test leaves running: the given
iterators' workers stopped and reaped, no other iterator touched."""

from __future__ import annotations

import torch

from tests.conftest import _children, stop_loader_workers
from tests.forked import alive


def _iterators(n: int) -> list:
    """``n`` iterators of 2 workers each, one batch taken: neither exhausted nor closed."""
    data = torch.arange(64.0)
    its = []
    for _ in range(n):
        it = iter(torch.utils.data.DataLoader(data, batch_size=4, num_workers=2))
        next(it)
        its.append(it)
    return its


def test_leftover_workers_are_stopped_and_reaped():
    before = _children()
    its = _iterators(3)
    pids = {w.pid for it in its for w in it._workers}
    assert pids <= _children() - before
    stopped, _ = stop_loader_workers(pids)
    assert stopped == 6
    assert not any(alive(pid) for pid in pids)
    assert not pids & _children()                  # reaped, not left as zombies
    assert all(it._shutdown for it in its)


def test_only_the_given_workers_are_stopped():
    mine, other = _iterators(2)
    assert stop_loader_workers({w.pid for w in mine._workers})[0] == 2
    assert mine._shutdown and not other._shutdown
    assert all(alive(w.pid) for w in other._workers)
    del other                                     # exhausted by nobody: its __del__ stops it
