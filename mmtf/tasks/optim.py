"""Optimizer parameter groups and the warmup + cosine learning-rate schedule shared by all tasks.

Each part may have an lr multiplier and layer-wise decay (BEiT / ELECTRA): block i of a stack of
depth L gets ``decay ** (L - i)``, what comes before the stack ``decay ** (L + 1)``, what comes
after it 1. Every group carries a ``name`` (what LearningRateMonitor logs) and its ``lr_scale``.
Why: docs/design/finetuning-controls.md
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mmtf.errors import UserError
from mmtf.nn.transformer import TransformerStack

BASE_GROUP = "base"   # parameters at the optimizer's own lr: new layers, parts at scale 1


@dataclass(frozen=True)
class PartOptim:
    """How one (possibly pretrained) part of a model is optimised.

    Attributes:
        module: the part (``task.export_parts()[name]``).
        lr_scale: multiplier of the optimizer's lr for this part.
        include_frozen: put its frozen parameters in the optimizer too (they unfreeze later;
            without a gradient AdamW leaves them alone).
        trainable: ids of the part's parameters that can ever train (LoRA), None = all.
        own_group: one group named after the part, never weight-decayed and without layer-wise
            decay, whatever its lr scale (a learned temperature: decay would pull it to 1).
    """

    module: nn.Module
    lr_scale: float = 1.0
    include_frozen: bool = False
    trainable: frozenset[int] | None = None
    own_group: bool = False


def layer_ids(part: nn.Module, owner: str = "part") -> tuple[dict[int, int], int]:
    """Layer index of every parameter of ``part`` for layer-wise decay, and the stack depth L:
    block i is layer i + 1, what is registered before the stack 0, the stack's final norm and
    what comes after it L + 1.

    Raises:
        UserError: the part holds no TransformerStack or several (``owner`` names it).
    """
    stacks = [m for m in part.modules() if isinstance(m, TransformerStack)]
    if len(stacks) != 1:
        raise UserError(f"model.layer_decay: {owner} ({type(part).__name__}) holds "
                        f"{len(stacks)} transformer stacks, layer-wise decay needs exactly one; "
                        f"set model.layer_decay=null.")
    stack = stacks[0]
    depth = len(stack.blocks)
    in_stack = {id(p) for p in stack.parameters()}
    ids: dict[int, int] = {}
    for i, block in enumerate(stack.blocks):
        ids.update((id(p), i + 1) for p in block.parameters())
    after = False
    for _, param in part.named_parameters():
        after = after or id(param) in in_stack
        ids.setdefault(id(param), depth + 1 if after else 0)
    return ids, depth


def param_groups(modules: Iterable[nn.Module], weight_decay: float,
                 include_frozen: bool = False, *, parts: Mapping[str, PartOptim] | None = None,
                 layer_decay: float | None = None) -> list[dict]:
    """Parameter groups by learning-rate scale, each split into decayed and non-decayed.

    Tensors with fewer than 2 dims and embedding tables get no weight decay.

    Args:
        modules: every module the optimizer trains (shared parameters counted once).
        include_frozen: keep frozen parameters that belong to no part.
        parts: named parts with their own lr scale; the rest is in the ``base`` groups.
        layer_decay: layer-wise decay inside each part (None = off), see :func:`layer_ids`.

    Returns:
        Non-empty groups ``{"name", "params", "weight_decay", "lr_scale"}`` in order of first
        parameter, each name before its ``<name>.no_decay``.
    """
    where: dict[int, tuple[str, PartOptim]] = {}       # id(param) -> (group name, part)
    scales: dict[str, float] = {BASE_GROUP: 1.0}
    no_decay_ids: set[int] = set()
    for name, part in (parts or {}).items():
        if part.own_group:
            own = [p for p in part.module.parameters() if id(p) not in where]
            where.update((id(p), (name, part)) for p in own)
            no_decay_ids.update(id(p) for p in own)
            scales[name] = part.lr_scale
        elif layer_decay is not None:
            ids, depth = layer_ids(part.module, f"model.{name}")
            for pid, layer in ids.items():
                label = f"{name}.layer{layer}"
                where.setdefault(pid, (label, part))
                scales[label] = part.lr_scale * layer_decay ** (depth + 1 - layer)
        else:
            label = name if part.lr_scale != 1.0 else BASE_GROUP
            where.update((id(p), (label, part)) for p in part.module.parameters()
                         if id(p) not in where)
            scales.setdefault(label, part.lr_scale)
    seen: set[int] = set()
    groups: dict[str, dict[str, Any]] = {}
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, nn.Embedding):
                no_decay_ids.update(id(p) for p in sub.parameters(recurse=False))
        for param in module.parameters():
            label, part = where.get(id(param), (BASE_GROUP, None))
            keep_frozen = (part.include_frozen and (part.trainable is None
                                                    or id(param) in part.trainable)
                           if part is not None else include_frozen)
            if id(param) in seen or not (param.requires_grad or keep_frozen):
                continue
            seen.add(id(param))
            for key, decay in ((label, weight_decay), (f"{label}.no_decay", 0.0)):
                groups.setdefault(key, {"name": key, "params": [], "weight_decay": decay,
                                        "lr_scale": scales[label]})
            no_decay = param.ndim < 2 or id(param) in no_decay_ids
            groups[f"{label}.no_decay" if no_decay else label]["params"].append(param)
    return [g for g in groups.values() if g["params"]]


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
                    weight_decay: float, include_frozen: bool = False, *,
                    parts: Mapping[str, PartOptim] | None = None,
                    layer_decay: float | None = None) -> torch.optim.Optimizer:
    """Call a partial optimizer (from Hydra, ``_partial_: true``) on :func:`param_groups` and
    set each group's ``lr`` to the optimizer's lr times the group's ``lr_scale``."""
    opt = optimizer(param_groups(modules, weight_decay, include_frozen, parts=parts,
                                 layer_decay=layer_decay))
    for group in opt.param_groups:
        # Before any scheduler exists: LambdaLR takes each group's scaled lr as its base lr.
        group["lr"] = group["lr"] * group["lr_scale"]
    return opt


def configure_adamw_cosine(optimizer: Callable[..., torch.optim.Optimizer],
                           modules: list[nn.Module], *, weight_decay: float, warmup_steps: int,
                           min_lr_ratio: float, total_steps: int,
                           include_frozen: bool = False,
                           parts: Mapping[str, PartOptim] | None = None,
                           layer_decay: float | None = None) -> dict[str, Any]:
    """Lightning's ``configure_optimizers`` result: the optimizer over :func:`param_groups` and
    the warmup + cosine schedule over ``total_steps``, stepped every optimizer step."""
    opt = build_optimizer(optimizer, modules, weight_decay, include_frozen, parts=parts,
                          layer_decay=layer_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(warmup_steps, max(1, total_steps), min_lr_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
