"""The linear layer of every mmtf block, and oneDNN-prepacked weights for decoding on a CPU.

A cached decode step multiplies a few rows (batch x beams) by every weight matrix of the
decoder, so each linear layer is a pass over its weight. ``F.linear`` on a CPU calls MKL's
SGEMM; oneDNN's inner product over a weight reordered once into its blocked layout ran the
decoder-base layers 1.8-5.2x faster at 8 rows on the AMD CPU measured (where MKL ran at AVX2
rates even with AVX-512 present), 1.4-3.0x with oneDNN capped at AVX2, and 1.1-2.4x at 2048
rows (experiments/kv_cache_decoding/linear_kernels.py, docs/design/packed-linear.md).
Inductor's freezing pass emits the same op, so the compiled decode step and the eager one share
it.

:class:`Linear` is an ``nn.Linear`` (same parameters, names and init; state dicts, LoRA, FSDP
and the pretrained name tables see no difference). Only inside :func:`packed_linear_weights`
does it hold a packed copy, and it uses the copy only where that copy cannot be stale or
change what is computed: no autograd recording, no CPU autocast, the input in the weight's
dtype, and the weight still the tensor (storage and in-place version) that was packed. Eager
calls also honour ``torch.backends.mkldnn.flags(enabled=False)``: F.linear then.

Shapes: r input rows (any leading dims), i in_features, o out_features.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmtf.utils.compat import (
    onednn_linear,
    onednn_linear_available,
    onednn_pack_linear_weight,
    tensor_version,
)

log = logging.getLogger(__name__)

# oneDNN's inner product packs these; float16 and float64 stay on F.linear.
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


class Linear(nn.Linear):
    """``nn.Linear`` that runs a oneDNN-packed copy of its weight while one is attached.

    Attach and release copies with :func:`packed_linear_weights`; outside it this is
    ``nn.Linear``. Args as ``nn.Linear``.
    """

    packed_weight: Tensor | None = None            # opaque oneDNN tensor, (o, i) reordered
    _packed_key: tuple | None = None               # the weight it was packed from
    _keep_packed = False                           # asked for by a compiled decode step

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

    def can_pack(self) -> bool:
        """Whether this layer's weight can get a packed copy where oneDNN is available: a plain
        CPU tensor (not a tensor subclass such as FSDP's sharded ``DTensor``, gathered only
        inside the forward), fp32 or bf16, not an inference-mode tensor (whose in-place version
        is not tracked)."""
        weight = self.weight
        return (type(weight) in (nn.Parameter, torch.Tensor) and weight.device.type == "cpu"
                and weight.dtype in PACKABLE_DTYPES and not weight.is_inference())

    def pack(self, rows: int) -> bool:
        """Attach a packed copy of the current weight, laid out for about ``rows`` input rows;
        an attached copy of the same weight is kept.

        Returns:
            Whether a copy is attached. False where oneDNN refuses a weight that
            :meth:`can_pack` let through; the layer then runs ``F.linear``, and the reason is
            logged once.
        """
        try:
            key = weight_state(self.weight)
            if self.packed_weight is None or self._packed_key != key:
                with torch.no_grad():
                    self.packed_weight = onednn_pack_linear_weight(self.weight, max(1, rows))
                self._packed_key = key
        except RuntimeError as error:
            self.release()
            _log_unpackable(error)
            return False
        return True

    def __getstate__(self) -> dict:
        # The copy is an opaque oneDNN tensor, which neither deepcopy nor pickle can read (the
        # EMA callback copies the model); a copy of the layer packs again when it decodes.
        state = self.__dict__.copy()
        for name in ("packed_weight", "_packed_key", "_keep_packed"):
            state.pop(name, None)
        return state

    def release(self) -> None:
        """Drop the packed copy (its memory is the weight's size)."""
        self.packed_weight = None
        self._packed_key = None
        self._keep_packed = False


_logged_unpackable = False


def _log_unpackable(error: RuntimeError) -> None:
    global _logged_unpackable
    if not _logged_unpackable:
        _logged_unpackable = True
        log.info("mmtf.nn.Linear: a weight could not be packed for oneDNN (%s); such layers "
                 "run F.linear (MKL on a CPU) instead of a packed copy.",
                 (str(error).strip() or type(error).__name__).splitlines()[0])


def weight_state(weight: Tensor) -> tuple:
    """What changes when a weight does: its address (a new tensor, ``.to()``), its in-place
    version (an optimizer step, ``load_state_dict``), dtype and device. A copy made from a weight
    (a packed copy, a compiled step's frozen constant) is current while this is unchanged."""
    return weight.data_ptr(), tensor_version(weight), weight.dtype, weight.device


@contextmanager
def packed_linear_weights(module: nn.Module, *, rows: int, keep: bool = False,
                          ) -> Iterator[int]:
    """Within the block, every :class:`Linear` of ``module`` that can runs a packed weight.

    Args:
        module: e.g. a :class:`~mmtf.decoders.TextDecoder` about to generate.
        rows: input rows the layers will see (batch x beams); the layout is tuned for it, any
            row count is computed correctly.
        keep: leave the copies attached afterwards (the compiled decode step holds them as
            constants of its graph; they are repacked only when a weight changes), also when
            an enclosing block attached them. By default the copies this block attached are
            released on exit, unless a block inside it asked to keep them; those attached
            before it stay.

    Yields:
        How many layers run packed (0 on a GPU, for float16 weights, or without oneDNN).
    """
    layers = []
    available = onednn_linear_available()
    for layer in (m for m in module.modules() if isinstance(m, Linear)):
        if available and layer.can_pack():
            layers.append(layer)
        else:
            layer.release()     # a copy kept from before .to(device / dtype) is stale
    attached_before = {id(m) for m in layers if m.packed_weight is not None}
    try:
        count = 0
        for layer in layers:
            if layer.pack(rows):
                count += 1
                layer._keep_packed = layer._keep_packed or keep
        yield count
    finally:
        for layer in layers:
            if id(layer) not in attached_before and not layer._keep_packed:
                layer.release()
