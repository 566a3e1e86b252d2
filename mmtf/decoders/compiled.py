"""The decode step compiled for inference: what ``generate(..., compile=True)`` runs.

:meth:`TextDecoder.step` itself is compiled whole (``fullgraph``, dynamic shapes, inductor
``freezing``), the linear layers on oneDNN-packed copies frozen into the graph. The first two
steps of a call run eagerly (the first fills the cross-attention cache). A fingerprint of every
parameter and the packing switch is checked once per ``generate`` call and the step recompiled
when it changed, so stale weights are never used. Once inductor has compiled in a process,
children forked after its next backward cannot run autograd: train before compiling. Why:
docs/design/compiled-decoding.md.

Shapes: r decoder rows (batch * beams), v vocab.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from mmtf.nn.linear import Packs, pack_linear_weights, weight_state
from mmtf.utils.compat import check_cpu_compiler, inductor_freezing, is_compiler_failure

# Trace the step with a cache holding at least this many positions (see the module docstring).
MIN_COMPILED_LENGTH = 2


def _decode_step(decoder: nn.Module, tokens: Tensor, cache) -> Tensor:
    return decoder.step(tokens, cache)


def _fresh_copy(fn: Callable) -> Callable:
    """``fn`` with a code object of its own, so no compiled code (dynamo caches per code
    object): drops code that froze older weights without ``torch.compiler.reset()``."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


class CompiledDecodeStep:
    """``decoder.step(tokens, cache)`` compiled with frozen weights; get one with
    :func:`compiled_decode_step`.

    Attributes:
        compilations: how many times the step was built.
        packs: the packed copies it was built with; ``generate`` attaches exactly these
            (dynamo guards on their identity).
    """

    def __init__(self, decoder: nn.Module) -> None:
        self._decoder = weakref.ref(decoder)
        self._fn: Callable | None = None
        self._weights: tuple | None = None
        self._toolchain_checked = False
        self.compilations = 0
        self.packs: Packs = {}

    def refresh(self, *, pack: bool, rows: int) -> None:
        """Build the compiled function, again if the weights or the packing switch changed;
        ``rows`` as in :func:`~mmtf.nn.linear.pack_linear_weights`."""
        decoder = self._decoder()
        pack = pack and torch.backends.mkldnn.enabled
        weights = (tuple(weight_state(p) for p in decoder.parameters()), pack)
        if self._fn is None or weights != self._weights:
            self._fn = torch.compile(_fresh_copy(_decode_step), fullgraph=True, dynamic=True)
            self.packs = pack_linear_weights(decoder, rows=rows) if pack else {}
            self._weights = weights
            self.compilations += 1

    def __call__(self, tokens: Tensor, cache, *, same_call: bool = False) -> Tensor:
        """Logits (r, 1, v) of the next position; advances ``cache`` by one position.

        Args:
            tokens: (r, 1) the latest token of every row.
            cache: a :class:`DecoderCache` holding >= ``MIN_COMPILED_LENGTH`` positions.
            same_call: the previous call was a step of the same generation; then only the
                guards that tell compiled variants apart are evaluated.
        """
        if cache.length < MIN_COMPILED_LENGTH:
            raise ValueError(f"CompiledDecodeStep: the cache holds {cache.length} positions; run "
                             f"the first {MIN_COMPILED_LENGTH} steps with decoder.step (the first "
                             f"fills the cross-attention cache).")
        try:
            if not self._toolchain_checked and tokens.device.type == "cpu":
                check_cpu_compiler()
                self._toolchain_checked = True
            # Freezing is a global inductor flag read at compile time (options= ignores it).
            with torch.compiler.set_stance(skip_guard_eval_unsafe=same_call), \
                    inductor_freezing():
                return self._fn(self._decoder(), tokens, cache)
        except Exception as error:
            if not is_compiler_failure(error):
                raise
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise RuntimeError(
                f"generate(compile=True): torch.compile could not build the decode step "
                f"({type(error).__name__}: {first_line}). It needs inductor's toolchain: a C++ "
                f"compiler (g++ or clang) on CPU, Triton on GPU. Generate with compile=False "
                f"instead.") from error


_STEPS: weakref.WeakKeyDictionary[nn.Module, CompiledDecodeStep] = weakref.WeakKeyDictionary()


def compiled_decode_step(decoder: nn.Module, *, pack: bool = True, rows: int = 1,
                         ) -> CompiledDecodeStep:
    """The compiled step of ``decoder`` (one per decoder), refreshed for its current weights."""
    step = _STEPS.get(decoder)
    if step is None:
        step = _STEPS[decoder] = CompiledDecodeStep(decoder)
    step.refresh(pack=pack, rows=rows)
    return step
