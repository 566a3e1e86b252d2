"""The decode step compiled for inference: what ``generate(..., compile=True)`` runs.

``torch.compile`` (inductor, ``freezing`` on) fuses the many small ops of a cached decode step
and turns each single-query attention into one pass over the cached K/V
(:func:`mmtf.nn.attention.single_query_attention`); the linear layers run on oneDNN-packed
copies of the weights (:mod:`mmtf.nn.linear`), frozen as constants of the graph. The tokens are
the eager step's. Why and how much: see docs/design/compiled-decoding.md.

Contract:

* The compiled function is :meth:`TextDecoder.step` itself, on the same :class:`KVCache`, traced
  whole (``fullgraph``) with dynamic shapes: one compilation serves every position, batch size,
  beam width and memory length.
* The first two steps of a call run eagerly (the first fills the cross-attention cache; the
  compiler specialises a length of 1), so the compiled step is first traced at length 2.
* Weights are baked into the compiled code. A fingerprint of every parameter (storage, version
  counter, dtype, device) and of the packing switch is checked once per ``generate`` call; when
  it changed the step is compiled again, so stale weights are never used. Compiling takes tens
  of seconds on a CPU: use ``compile=True`` for inference on fixed weights, not for validation
  during training.
* The step owns the packed copies it was compiled with, and ``generate`` attaches exactly those
  objects for each call: dynamo guards on their identity, so new copies would recompile.
* Once inductor has compiled in a process, children forked after its next backward pass cannot
  run autograd: train before compiling, or in a fresh process.

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
    """``fn`` with a code object of its own. Dynamo keeps compiled code per code object, so a copy
    starts with no cache entries: the way to drop code that froze older weights without resetting
    every other compiled function in the process (``torch.compiler.reset()``)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def _fingerprint(module: nn.Module) -> tuple:
    return tuple(weight_state(p) for p in module.parameters())


class CompiledDecodeStep:
    """``decoder.step(tokens, cache)`` compiled with frozen weights; see the module docstring.

    Get one with :func:`compiled_decode_step` (one per decoder, kept while the decoder lives).

    Attributes:
        compilations: how many times the step was built (1, plus one per weight change seen).
        packs: the packed weight copies the step was built with (empty when packing is off),
            for :func:`~mmtf.nn.linear.packed_linear_weights` to attach during a call.
    """

    def __init__(self, decoder: nn.Module) -> None:
        self._decoder = weakref.ref(decoder)
        self._fn: Callable | None = None
        self._weights: tuple | None = None
        self._toolchain_checked = False
        self.compilations = 0
        self.packs: Packs = {}

    def refresh(self, *, pack: bool, rows: int) -> None:
        """Build the compiled function, again if the weights or the packing switch (``pack``,
        and ``torch.backends.mkldnn.enabled``) changed since it was built; ``rows``: the packed
        copies' layout, as in :func:`~mmtf.nn.linear.pack_linear_weights`."""
        decoder = self._decoder()
        pack = pack and torch.backends.mkldnn.enabled
        weights = (_fingerprint(decoder), pack)
        if self._fn is None or weights != self._weights:
            self._fn = torch.compile(_fresh_copy(_decode_step), fullgraph=True, dynamic=True)
            self.packs = pack_linear_weights(decoder, rows=rows) if pack else {}
            self._weights = weights
            self.compilations += 1

    def __call__(self, tokens: Tensor, cache, *, same_call: bool = False) -> Tensor:
        """Logits (r, 1, v) of the next position; advances ``cache`` by one position.

        Args:
            tokens: (r, 1) the latest token of every row.
            cache: a :class:`DecoderCache` whose cross-attention K/V are filled and which holds
                at least ``MIN_COMPILED_LENGTH`` positions.
            same_call: the previous call was a step of the same generation (same decoder, cache
                and shapes). Then only the guards that tell compiled variants apart are
                evaluated, not all of them (docs/design/compiled-decoding.md says why).
        """
        if cache.length < MIN_COMPILED_LENGTH:
            raise ValueError(f"CompiledDecodeStep: the cache holds {cache.length} positions; run "
                             f"the first {MIN_COMPILED_LENGTH} steps with decoder.step (the first "
                             f"fills the cross-attention cache).")
        try:
            if not self._toolchain_checked and tokens.device.type == "cpu":
                check_cpu_compiler()
                self._toolchain_checked = True
            # Freezing is a global inductor flag, read when a graph is compiled, which may be
            # any call (options={"freezing": True} is ignored: docs/design/packed-linear.md).
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
    """The compiled step of ``decoder``, checked against its current weights and the packing
    switch (see :meth:`CompiledDecodeStep.refresh`)."""
    step = _STEPS.get(decoder)
    if step is None:
        step = _STEPS[decoder] = CompiledDecodeStep(decoder)
    step.refresh(pack=pack, rows=rows)
    return step
