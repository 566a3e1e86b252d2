"""FSDP2 for mmtf's tasks: every transformer block its own shard unit (``trainer=fsdp``).

:class:`FSDP2Strategy` is Lightning's ``ModelParallelStrategy`` with mmtf's plan, applied by a
task's ``configure_model`` through :func:`shard_model`: each ``TransformerBlock`` is one unit,
each child of the task that holds parameters a root unit for the rest, with methods such as
``generate`` registered to gather too. Shards within a node, replicas across nodes (HSDP);
checkpoints are one full file written by rank 0. Why: docs/design/fsdp.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

from mmtf.errors import ConfigError
from mmtf.nn.transformer import TransformerBlock

__all__ = ["FSDP2Strategy", "shard_model"]


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over all ranks with one shard unit per transformer block.

    Args:
        activation_checkpointing: moved to the parts; any value but None is a ConfigError.
        reshard_after_forward: free gathered parameters after each unit's forward (ZeRO-3);
            False keeps them until backward (ZeRO-2).
        forward_methods: methods besides ``forward`` of the task's children that use their
            parameters.
        **kwargs: ``ModelParallelStrategy`` arguments (``process_group_backend``, ``timeout``).
    """

    def __init__(self, *, activation_checkpointing: bool | None = None,
                 reshard_after_forward: bool = True,
                 forward_methods: Sequence[str] = ("generate", "pool"), **kwargs: Any) -> None:
        if activation_checkpointing is not None:
            raise ConfigError(
                f"trainer.strategy.activation_checkpointing ({activation_checkpointing}) is no "
                f"longer an FSDP option: set model.encoder.activation_checkpointing="
                f"{str(activation_checkpointing).lower()} and/or model.decoder."
                f"activation_checkpointing={str(activation_checkpointing).lower()} (they work on "
                f"every strategy) and drop the trainer.strategy key.")
        super().__init__(save_distributed_checkpoint=False, **kwargs)
        self.reshard_after_forward = reshard_after_forward
        self.forward_methods = tuple(forward_methods)

    def shard(self, module: nn.Module) -> None:
        """Apply the plan to ``module`` (a task) in place; once: a second call changes nothing."""
        if any(isinstance(m, FSDPModule) for m in module.modules()):
            return
        own = [name for name, _ in module.named_parameters(recurse=False)]
        if own:
            raise RuntimeError(f"FSDP2Strategy: {type(module).__name__} holds parameters {own} "
                               "itself; FSDP2 shards the parameters of its child modules only.")
        shard = functools.partial(fully_shard, mesh=self.device_mesh,
                                  reshard_after_forward=self.reshard_after_forward)
        for block in [m for m in module.modules() if isinstance(m, TransformerBlock)]:
            shard(block)
        for child in module.children():
            if next(child.parameters(), None) is None:
                continue
            shard(child)
            for name in self.forward_methods:          # after fully_shard: needs an FSDPModule
                if callable(getattr(child, name, None)):
                    register_fsdp_forward_method(child, name)


def shard_model(task: L.LightningModule) -> None:
    """A task's ``configure_model``: shard it under :class:`FSDP2Strategy`, else do nothing."""
    strategy = task.trainer.strategy
    if isinstance(strategy, FSDP2Strategy):
        strategy.shard(task)

