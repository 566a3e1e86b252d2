"""The decode step compiled for inference: what ``generate(..., compile=True)`` runs.

Why: at batch 8 a cached decode step of a 6 x 512 decoder is ~40 GEMMs of 8 rows, 12
single-query attention reads and ~30 small norm/RoPE/residual ops. Eagerly, the small ops and
their dispatch cost a third of the step. ``torch.compile`` (inductor) fuses them into a few C++
(or Triton) loops, turns each single-query attention into one fused pass over the cached K/V
(:func:`mmtf.nn.attention.single_query_attention`), and with ``freezing`` treats the weights as
constants and prepacks them for MKL/oneDNN. The result is the same tokens, 1.3-1.6x faster than
the eager step on CPU (``experiments/kv_cache_decoding``).

How it stays correct and compiles once:

* The compiled function is :meth:`TextDecoder.step` itself, on the same :class:`KVCache`, traced
  whole (``fullgraph``) with dynamic shapes: the cached length (a plain int attribute), the batch
  and the memory length are symbolic, so one compilation serves every position, batch size,
  beam width and memory length.
* The first step of a call, which projects the cross-attention K/V from the memory, runs
  eagerly, and so does the second: a length of 1 is always specialised by the compiler, so the
  compiled step is first traced at length 2.
* Frozen weights are baked into the compiled code. A fingerprint of every parameter (storage,
  version counter, dtype, device) is checked once per ``generate`` call; when it changed (an
  optimizer step, ``load_state_dict``, ``.to()``) the step is compiled again from a fresh copy of
  the function, so stale weights are never used. Compiling takes tens of seconds on a CPU: use
  ``compile=True`` for inference on fixed weights (evaluation, serving, benchmarks), not for
  validation during training.
* A PyTorch limit to know: once inductor has compiled in a process, the next backward pass there
  starts autograd's device threads, and children forked after that cannot run autograd. Train
  before compiling, or in a fresh process (Lightning's default DDP launches fresh processes).

Shapes: r decoder rows (batch * beams), v vocab.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from mmtf.utils.compat import is_compiler_failure, tensor_version

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
    return tuple((p.data_ptr(), tensor_version(p), p.dtype, p.device)
                 for p in module.parameters())


class CompiledDecodeStep:
    """``decoder.step(tokens, cache)`` compiled with frozen weights; see the module docstring.

    Get one with :func:`compiled_decode_step` (one per decoder, kept while the decoder lives).

    Attributes:
        compilations: how many times the step was built (1, plus one per weight change seen).
    """

    def __init__(self, decoder: nn.Module) -> None:
        self._decoder = weakref.ref(decoder)
        self._fn: Callable | None = None
        self._weights: tuple | None = None
        self.compilations = 0

    def refresh(self) -> None:
        """Build the compiled function, again if the weights changed since it was built."""
        weights = _fingerprint(self._decoder())
        if self._fn is None or weights != self._weights:
            self._fn = torch.compile(_fresh_copy(_decode_step), fullgraph=True, dynamic=True,
                                     options={"freezing": True})
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
                evaluated, not all of them (a visible share of a step at decoder-base size).
        """
        if cache.length < MIN_COMPILED_LENGTH:
            raise ValueError(f"CompiledDecodeStep: the cache holds {cache.length} positions; run "
                             f"the first {MIN_COMPILED_LENGTH} steps with decoder.step (the first "
                             f"fills the cross-attention cache).")
        if self._fn is None:
            self.refresh()
        try:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=same_call):
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


def compiled_decode_step(decoder: nn.Module) -> CompiledDecodeStep:
    """The compiled step of ``decoder``, checked against its current weights."""
    step = _STEPS.get(decoder)
    if step is None:
        step = _STEPS[decoder] = CompiledDecodeStep(decoder)
    step.refresh()
    return step
