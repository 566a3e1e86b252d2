"""mmtf.tasks.fsdp without a process group: activation recomputation and the plan's limits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmtf.nn.transformer import TransformerBlock
from mmtf.tasks.fsdp import FSDP2Strategy, _recompute_in_backward


def _grads(block: TransformerBlock, x: torch.Tensor) -> list[torch.Tensor]:
    block.zero_grad()
    block(x).pow(2).sum().backward()
    return [p.grad.clone() for p in block.parameters()]


def test_recomputed_block_matches_the_plain_one_with_dropout():
    torch.manual_seed(0)
    block = TransformerBlock(dim=16, num_heads=2, dropout=0.2, attn_dropout=0.1).train()
    x = torch.randn(2, 5, 16)
    torch.manual_seed(1)
    expected = _grads(block, x)
    block.forward = _recompute_in_backward(block.forward)
    torch.manual_seed(1)
    got = _grads(block, x)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_forward_reruns_in_backward_only_when_grad_is_on():
    block = TransformerBlock(dim=16, num_heads=2).eval()
    calls = []
    plain = block.forward

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return plain(*args, **kwargs)

    block.forward = _recompute_in_backward(counted)
    block(torch.randn(1, 3, 16)).sum().backward()
    assert calls == [True, True]                      # forward, then its rerun in backward
    calls.clear()
    with torch.no_grad():
        out = block(torch.randn(1, 3, 16))
    assert calls == [False] and out.shape == (1, 3, 16)


def test_a_task_with_its_own_parameters_is_refused():
    class Task(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.block = TransformerBlock(dim=8, num_heads=2)

    with pytest.raises(RuntimeError, match=r"Task holds parameters \['scale'\] itself"):
        FSDP2Strategy().shard(Task())
