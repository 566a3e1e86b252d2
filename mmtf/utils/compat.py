"""Every private attribute of Lightning, Hydra, OmegaConf and torch that mmtf touches.

A library's private names can change in any release. Each one mmtf cannot do without is read
or written here, in one small function whose docstring says why no public API serves and which
versions were checked; ``tests/unit/utils/test_private_api.py`` fails when one is used anywhere
else in the package, or when an attribute named here disappears from the installed libraries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn


def module_apply(module: nn.Module, fn: Callable[[Tensor], Tensor], recurse: bool = True,
                 ) -> nn.Module:
    """torch's ``nn.Module._apply(fn, recurse)``: the one method ``.to()``, ``.half()`` and
    ``.cuda()`` send every parameter and buffer through.

    A module whose buffers must keep their dtype under ``.to(dtype)`` / ``.half()`` (the RoPE
    tables, the mel filterbank) overrides ``_apply`` and calls this for the default behaviour;
    torch has no public per-buffer dtype policy. Checked: torch 2.14.1 (mmtf supports 2.11 too;
    not run there).
    """
    return nn.Module._apply(module, fn, recurse)


def tensor_version(tensor: Tensor) -> int:
    """torch's in-place version counter of ``tensor`` (``Tensor._version``).

    It tells an in-place update (an optimizer step, ``load_state_dict``) from an untouched
    tensor at the same address; the compiled decode step uses it to notice that the weights it
    froze have changed. No public API exposes it. Checked: torch 2.14.1 (2.11: not run there).
    """
    return tensor._version


def is_compiler_failure(error: BaseException) -> bool:
    """Whether ``error`` is torch.compile's backend failing to build code (no C++ compiler, no
    Triton), as opposed to a bug in the traced function.

    torch re-exports no public type for it: ``BackendCompilerFailed`` lives in
    ``torch._dynamo.exc`` and inductor raises its own types from ``torch._inductor``.
    Checked: torch 2.14.1 (2.11: not run there).
    """
    from torch._dynamo.exc import BackendCompilerFailed

    return (isinstance(error, BackendCompilerFailed)
            or type(error).__module__.startswith("torch._inductor"))


def check_cpu_compiler() -> None:
    """Raise inductor's own error (``torch._inductor.exc.InvalidCxxCompiler``) now if it would
    find no C++ compiler for CPU code, as :func:`is_compiler_failure` recognises.

    Inductor looks for the compiler only when it writes the first kernel, after tracing and
    lowering the whole graph (~20 s for a small decoder on one CPU core); asking it first makes
    a missing toolchain a prompt error. ``cpp_builder.get_cpp_compiler`` searches
    ``torch._inductor.config.cpp.cxx`` as the kernel build does and caches the answer. No
    public API asks. Checked: torch 2.14.1 (2.11: not run there); where it is missing, nothing
    is checked up front and the build's own failure still reaches the caller.
    """
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:
        return
    get_cpp_compiler()


def onednn_linear_available() -> bool:
    """Whether torch has oneDNN's packed inner product: built with oneDNN and the two private
    ops of :func:`onednn_pack_linear_weight` and :func:`onednn_linear` present.
    Checked: torch 2.14.1 (2.11: not run there; where the ops are missing this says False and
    mmtf keeps ``F.linear``).
    """
    import torch

    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def onednn_bf16_supported() -> bool:
    """Whether oneDNN's bf16 kernels run on this CPU (``torch.ops.mkldnn._is_mkldnn_bf16_supported``:
    AVX512BW+VL+DQ or AVX-NE-CONVERT, within ``ONEDNN_MAX_CPU_ISA``), the condition under which
    ``_reorder_linear_weight`` accepts a bf16 weight; inductor asks the same op before it packs
    bf16 weights. No public API says it. Checked: torch 2.14.1 (2.11: not run there; where the
    op is missing this says False).
    """
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return check is not None and bool(check())


def onednn_pack_linear_weight(weight: Tensor, rows: int) -> Tensor:
    """oneDNN's blocked copy of a linear layer's ``weight`` (out, in), laid out for inputs of
    about ``rows`` rows (``torch.ops.mkldnn._reorder_linear_weight``): an opaque tensor that only
    :func:`onednn_linear` reads.

    It is what inductor's freezing pass makes for bf16 weights (and for fp32 ones with a
    symbolic batch); torch has no public op for it. The copy's sizes are marked static for
    torch.compile (``torch._dynamo.mark_static``; no public API either).
    Checked: torch 2.14.1 (2.11: not run there).
    """
    import torch

    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)        # under no_grad
    # Its sizes are the weight's. Left dynamic (torch.compile(dynamic=True) makes a plain tensor
    # attribute's sizes symbols), freezing bakes the tensor in while the kernels that index the
    # layer's output still read the symbol, which no input binds: NameError at run time.
    torch._dynamo.mark_static(packed)
    return packed


def onednn_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` on the packed copy of ``weight``
    (``torch.ops.mkldnn._linear_pointwise`` with no fused activation), x (..., in) -> (..., out).

    Inference only: the op has no autograd formula. Inductor lowers it to the same call when it
    meets it in a graph whose packed weight is a frozen constant. Checked: torch 2.14.1 (2.11:
    not run there).
    """
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def inductor_freezing() -> Any:
    """A context in which inductor compiles with ``freezing``: parameters become constants it
    folds and prepacks.

    ``torch.compile(..., options={"freezing": True})`` does not freeze in torch 2.14.1 (the
    compiled graph still takes the weights as inputs: measured, docs/design/packed-linear.md);
    the global ``torch._inductor.config.freezing`` flag does, and ``config.patch`` sets it for
    the block only. Checked: torch 2.14.1 (2.11: not run there).
    """
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


# ---------------------------------------------------------------------------- Lightning: resume
def restore_train_loader_position(trainer: Any) -> bool:
    """Hand the train loader the position saved in the checkpoint if Lightning has not.

    When ``configure_optimizers`` reads ``trainer.estimated_stepping_batches``, Lightning builds
    the train loader before it restores the loops, and ``FitLoop.setup_data`` then never loads
    the saved loader state. This does what it would have done: load the state and re-create the
    fetcher's iterator. No public API loads a pending loader state (checked with lightning
    2.6.6). Returns True when it loaded one.
    """
    fit_loop = trainer.fit_loop
    pending = getattr(fit_loop, "_combined_loader_states_to_load", None)
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    if (not pending or not fit_loop.restarting or fetcher is None
            or getattr(fit_loop, "_combined_loader", None) is None):
        return False
    fit_loop._load_combined_loader_states()
    iter(fetcher)            # the loader's new iterator starts from the loaded position
    return True


# ---------------------------------------------------------------------------- Lightning: SIGTERM
def request_sigterm_stop(trainer: Any) -> None:
    """Set Lightning's own "SIGTERM received" flag, so its loops stop after the current batch.

    ``Trainer.received_sigterm`` is a read-only property over the signal connector's flag; no
    public setter exists (checked with lightning 2.6.6).
    """
    trainer._signal_connector.received_sigterm = True


# ---------------------------------------------------------------------------- Lightning: last.ckpt
def checkpoint_monitor_candidates(callback: Any, trainer: Any) -> dict[str, Any]:
    """``ModelCheckpoint``'s values for formatting a file name (metrics, epoch, step).

    Private in ``ModelCheckpoint`` (checked with lightning 2.6.6); :class:`LastCheckpoint`
    needs the same values to name and write ``last.ckpt`` as its base class does.
    """
    return callback._monitor_candidates(trainer)


def checkpoint_save_last(callback: Any, trainer: Any, candidates: dict[str, Any]) -> None:
    """Write ``last.ckpt`` the way ``ModelCheckpoint(save_last=True)`` does (link or copy,
    bookkeeping of ``last_model_path``); private, no public equivalent (checked with lightning
    2.6.6)."""
    callback._save_last_checkpoint(trainer, candidates)


def checkpoint_saved_at_step(callback: Any) -> int:
    """The global step of ``callback``'s latest save; private (checked with lightning 2.6.6)."""
    return int(callback._last_global_step_saved)


def checkpoint_every_n_train_steps(callback: Any) -> int:
    """``ModelCheckpoint``'s step trigger (0: none); only the constructor argument is public,
    the stored value is private (checked with lightning 2.6.6)."""
    return int(callback._every_n_train_steps)


def dispatched_ops(fn: Callable[[], Any]) -> list[str]:
    """Names of the ATen ops ``fn()`` reaches below autograd, in call order.

    Through ``torch.utils._python_dispatch.TorchDispatchMode``: the one way to see which
    kernel ``scaled_dot_product_attention`` picked (``_scaled_dot_product_flash_attention``,
    ``..._efficient_attention``, ``..._cudnn_attention``, ``..._flash_attention_for_cpu``, or the
    math path's plain ops) without the profiler, whose Kineto start-up prints to stderr on
    every call. Checked: torch 2.14.1 (2.11 has the same class; not run there).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with _Record() as record:
        fn()
    return record.ops


def shutdown_loader_workers(loader: Any, iterator: Any) -> int:
    """End the worker processes of ``iterator``, a pass of ``loader`` (a torch ``DataLoader``
    or torchdata ``StatefulDataLoader``) now; how many it had (0: none running).

    torch has no public way to stop a pass's workers before its end: they stop when the pass
    is exhausted or its iterator is collected. ``_shutdown_workers`` is what both call, and what
    Lightning calls for its own loaders; ``_shutdown`` says whether it already ran, ``_workers``
    lists the processes. The loader's ``_iterator`` (its persistent-workers iterator, and
    torchdata's current one) is cleared so the next pass starts new workers. Checked: torch
    2.14.1, torchdata 0.11 (torch 2.11: not run there).
    """
    if getattr(iterator, "_shutdown", True):      # single-process, or already shut down
        return 0
    iterator._shutdown_workers()
    if getattr(loader, "_iterator", None) is iterator:
        loader._iterator = None
    return len(iterator._workers)
