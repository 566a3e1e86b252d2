"""mmtf.tasks.fsdp without a process group: the plan's limits (activation checkpointing is the
stack's: tests/unit/nn/test_activation_checkpointing.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmtf.nn.transformer import TransformerBlock
from mmtf.tasks.fsdp import FSDP2Strategy


def test_a_task_with_its_own_parameters_is_refused():
    class Task(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.block = TransformerBlock(dim=8, num_heads=2)

    with pytest.raises(RuntimeError, match=r"Task holds parameters \['scale'\] itself"):
        FSDP2Strategy().shard(Task())
