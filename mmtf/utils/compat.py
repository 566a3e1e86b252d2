"""Every private attribute of Lightning, Hydra, OmegaConf and torch that mmtf touches.

Each private name mmtf cannot do without is used here only, in one small function whose
docstring says why no public API serves and which versions were checked;
``tests/unit/utils/test_private_api.py`` holds both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn


def module_apply(module: nn.Module, fn: Callable[[Tensor], Tensor], recurse: bool = True,
                 ) -> nn.Module:
    """torch's ``nn.Module._apply``, which ``.to()`` / ``.half()`` send every tensor through;
    modules whose buffers keep their dtype override ``_apply`` and call this (no public
    per-buffer dtype policy). Checked: torch 2.14.1 (2.11: not run there)."""
    return nn.Module._apply(module, fn, recurse)


def tensor_version(tensor: Tensor) -> int:
    """torch's in-place version counter (``Tensor._version``): tells an updated weight from an
    untouched one at the same address; no public API. Checked: torch 2.14.1 (2.11: not run
    there)."""
    return tensor._version


def is_compiler_failure(error: BaseException) -> bool:
    """Whether ``error`` is torch.compile's backend failing to build code (no C++ compiler, no
    Triton), not a bug in the traced function; torch has no public type for it. Checked: torch
    2.14.1 (2.11: not run there)."""
    from torch._dynamo.exc import BackendCompilerFailed

    return (isinstance(error, BackendCompilerFailed)
            or type(error).__module__.startswith("torch._inductor"))


def check_cpu_compiler() -> None:
    """Raise inductor's own error now if it would find no C++ compiler for CPU code, rather
    than after tracing the whole graph (``cpp_builder.get_cpp_compiler``; no public API asks).
    Checked: torch 2.14.1 (2.11: not run there; where it is missing, nothing is checked)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:
        return
    get_cpp_compiler()


def onednn_linear_available() -> bool:
    """Whether torch has oneDNN and the two private ops of :func:`onednn_pack_linear_weight`
    and :func:`onednn_linear`. Checked: torch 2.14.1 (2.11: not run there; False without them)."""
    import torch

    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def onednn_bf16_supported() -> bool:
    """Whether oneDNN's bf16 kernels run on this CPU (``_is_mkldnn_bf16_supported``, as
    inductor asks before packing bf16 weights). Checked: torch 2.14.1 (2.11: not run there;
    False without the op)."""
    import torch

    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return check is not None and bool(check())


def onednn_pack_linear_weight(weight: Tensor, rows: int) -> Tensor:
    """oneDNN's blocked copy of a linear ``weight`` (out, in) for about ``rows`` input rows
    (``_reorder_linear_weight``, as inductor's freezing makes), sizes marked static for
    torch.compile; only :func:`onednn_linear` reads it. Checked: torch 2.14.1 (2.11: not run
    there)."""
    import torch

    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)        # under no_grad
    # Its sizes are the weight's. Left dynamic (torch.compile(dynamic=True) makes a plain tensor
    # attribute's sizes symbols), freezing bakes the tensor in while the kernels that index the
    # layer's output still read the symbol, which no input binds: NameError at run time.
    torch._dynamo.mark_static(packed)
    return packed


def onednn_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` on the packed copy (``_linear_pointwise``), x (..., in) ->
    (..., out); inference only (no autograd formula). Checked: torch 2.14.1 (2.11: not run
    there)."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def inductor_freezing() -> Any:
    """A context in which inductor compiles with ``freezing`` (parameters folded as
    constants); ``options={"freezing": True}`` does not freeze, the global flag does. Checked:
    torch 2.14.1 (2.11: not run there)."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


# ---------------------------------------------------------------------------- Lightning: resume
def restore_train_loader_position(trainer: Any) -> bool:
    """Hand the train loader the position saved in the checkpoint if Lightning has not (it
    skips it when the loader was built before the loops restored); True when it loaded one.
    No public API loads a pending loader state (checked with lightning 2.6.6)."""
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
    """Set Lightning's "SIGTERM received" flag, so its loops stop after the current batch; no
    public setter (checked with lightning 2.6.6)."""
    trainer._signal_connector.received_sigterm = True


# ---------------------------------------------------------------------------- Lightning: last.ckpt
def checkpoint_monitor_candidates(callback: Any, trainer: Any) -> dict[str, Any]:
    """``ModelCheckpoint``'s values for formatting a file name; private (checked with
    lightning 2.6.6)."""
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
    """Names of the ATen ops ``fn()`` reaches below autograd, in call order (which SDPA kernel
    ran) through ``TorchDispatchMode``, without the profiler. Checked: torch 2.14.1 (2.11: not
    run there)."""
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
    """End the worker processes of ``iterator``, a pass of ``loader`` (``DataLoader`` or
    ``StatefulDataLoader``), now; how many it had. No public way stops them before the pass
    ends; the loader's cached iterator is cleared so the next pass starts new workers.
    Checked: torch 2.14.1, torchdata 0.11 (torch 2.11: not run there)."""
    if getattr(iterator, "_shutdown", True):      # single-process, or already shut down
        return 0
    iterator._shutdown_workers()
    if getattr(loader, "_iterator", None) is iterator:
        loader._iterator = None
    return len(iterator._workers)
