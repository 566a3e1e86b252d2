"""The linear layer of every mmtf block, with optional oneDNN-packed weights for CPU decoding.

:class:`Linear` is an ``nn.Linear`` (same parameters, names and init). Inside
:func:`packed_linear_weights` (entered only by ``generate``) it runs a oneDNN-packed copy of its
weight, but only where the copy cannot be stale or change what is computed: no autograd, no CPU
autocast, input in the weight's dtype, the weight unchanged since packing, and
``torch.backends.mkldnn`` enabled. Why: docs/design/packed-linear.md.

Shapes: r input rows (any leading dims), i in_features, o out_features.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.utils.compat import (
    onednn_bf16_supported,
    onednn_linear,
    onednn_linear_available,
    onednn_pack_linear_weight,
    tensor_version,
)

# A layer's packed copy and the weight_state it was made from.
Packs = dict["Linear", tuple[Tensor, tuple]]


class Linear(nn.Linear):
    """``nn.Linear`` that runs a oneDNN-packed copy of its weight while one is attached."""

    packed_weight: Tensor | None = None            # opaque oneDNN tensor, (o, i) reordered
    _packed_key: tuple | None = None               # the weight it was packed from

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., i) -> (..., o)."""
        packed = self.packed_weight
        if packed is not None and not torch.is_grad_enabled():
            if torch.compiler.is_compiling():
                # The compiled decode step: the copy is a frozen constant of its graph, and
                # mmtf.decoders.compiled recompiles when the weights change.
                if x.device.type == "cpu" and x.dtype == packed.dtype:
                    return onednn_linear(x, packed, self.bias)
                return F.linear(x, self.weight, self.bias)
            if (x.dtype == self.weight.dtype and not torch.is_autocast_enabled("cpu")
                    and torch.backends.mkldnn.enabled
                    and self._packed_key == weight_state(self.weight)):
                return onednn_linear(x, packed, self.bias)
        return F.linear(x, self.weight, self.bias)

    def __getstate__(self) -> dict:
        # The copy is an opaque oneDNN tensor, which neither deepcopy nor pickle can read (the
        # EMA callback copies the model); a copy of the layer packs again when it decodes.
        state = self.__dict__.copy()
        state.pop("packed_weight", None)
        state.pop("_packed_key", None)
        return state


@functools.cache
def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN can pack a CPU weight of ``dtype`` here: fp32 wherever torch has the
    ops, bf16 only where oneDNN's bf16 inner product runs; other dtypes never."""
    if dtype == torch.float32:
        return onednn_linear_available()
    return dtype == torch.bfloat16 and onednn_linear_available() and onednn_bf16_supported()


def weight_state(weight: Tensor) -> tuple:
    """Address, in-place version, dtype and device of ``weight``: a copy made from it (packed,
    or a compiled step's frozen constant) is current while this is unchanged."""
    return weight.data_ptr(), tensor_version(weight), weight.dtype, weight.device


def _packable(weight: Tensor) -> bool:
    # A plain CPU tensor (not a subclass such as FSDP's sharded DTensor, gathered only inside
    # the forward), not an inference-mode tensor (whose in-place version is not tracked).
    return (type(weight) in (nn.Parameter, torch.Tensor) and weight.device.type == "cpu"
            and not weight.is_inference() and can_pack(weight.dtype))


def pack_linear_weights(module: nn.Module, *, rows: int) -> Packs:
    """A packed copy of the weight of every :class:`Linear` of ``module`` that can have one,
    laid out for about ``rows`` input rows (any row count computes correctly)."""
    if not torch.backends.mkldnn.enabled:
        return {}
    with torch.no_grad():
        return {layer: (onednn_pack_linear_weight(layer.weight, max(1, rows)),
                        weight_state(layer.weight))
                for layer in module.modules()
                if isinstance(layer, Linear) and _packable(layer.weight)}


@contextmanager
def packed_linear_weights(module: nn.Module, *, rows: int, packs: Packs | None = None,
                          ) -> Iterator[int]:
    """Within the block, every :class:`Linear` of ``module`` that can runs a packed weight.

    Args:
        module: e.g. a :class:`~mmtf.decoders.TextDecoder` about to generate.
        rows: input rows the layers will see (batch x beams).
        packs: copies made before (the compiled step's); default: packed now.

    Yields:
        How many layers run packed (0 on a GPU, for float16 weights, or without oneDNN).
    """
    packs = pack_linear_weights(module, rows=rows) if packs is None else packs
    for layer, (packed, key) in packs.items():
        layer.packed_weight, layer._packed_key = packed, key
    try:
        yield len(packs)
    finally:
        for layer in packs:
            layer.packed_weight = layer._packed_key = None
