"""Optimizer parameter groups and the warmup + cosine learning-rate schedule shared by all tasks."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from mmtf.errors import UserError


def param_groups(modules: Iterable[nn.Module], weight_decay: float,
                 include_frozen: bool = False) -> list[dict]:
    """Split trainable parameters into decayed and non-decayed groups.

    Norm weights, biases (every tensor with fewer than 2 dims) and embedding tables get no weight
    decay: decaying them only pulls scales and token vectors towards zero.
    """
    no_decay_ids: set[int] = set()
    seen: set[int] = set()
    decay, no_decay = [], []
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, nn.Embedding):
                no_decay_ids.update(id(p) for p in sub.parameters(recurse=False))
        for param in module.parameters():
            if id(param) in seen or not (param.requires_grad or include_frozen):
                continue
            seen.add(id(param))
            if param.ndim < 2 or id(param) in no_decay_ids:
                no_decay.append(param)
            else:
                decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def warmup_cosine(warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0,
                  ) -> Callable[[int], float]:
    """LR multiplier: linear warmup from ~0 to 1 over ``warmup_steps``, then cosine to
    ``min_lr_ratio`` at ``total_steps`` (and flat after it)."""
    if warmup_steps < 0 or total_steps < 1:
        raise UserError(f"warmup_cosine: warmup_steps ({warmup_steps}) must be >= 0 and "
                         f"total_steps ({total_steps}) >= 1.")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise UserError(f"warmup_cosine: min_lr_ratio ({min_lr_ratio}) must be in [0, 1].")
    warmup_steps = min(warmup_steps, max(total_steps - 1, 0))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_optimizer(optimizer: Callable[..., torch.optim.Optimizer], modules: Iterable[nn.Module],
                    weight_decay: float, include_frozen: bool = False) -> torch.optim.Optimizer:
    """Call a partial optimizer (from Hydra, ``_partial_: true``) on the parameter groups."""
    return optimizer(param_groups(modules, weight_decay, include_frozen))


def configure_adamw_cosine(optimizer: Callable[..., torch.optim.Optimizer],
                           modules: list[nn.Module], *, weight_decay: float, warmup_steps: int,
                           min_lr_ratio: float, total_steps: int,
                           include_frozen: bool = False) -> dict[str, Any]:
    """Lightning's ``configure_optimizers`` result: the optimizer over decay/no-decay groups and
    the warmup + cosine schedule over ``total_steps``, stepped every optimizer step."""
    opt = build_optimizer(optimizer, modules, weight_decay, include_frozen)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(warmup_steps, max(1, total_steps), min_lr_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
