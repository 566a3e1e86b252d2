"""Every private attribute of Lightning, Hydra, OmegaConf and torch that mmtf touches.

A library's private names can change in any release. Each one mmtf cannot do without is read
or written here, in one small function whose docstring says why no public API serves and which
versions were checked; ``tests/unit/utils/test_private_api.py`` fails when one is used anywhere
else in the package, or when an attribute named here disappears from the installed libraries.
"""

from __future__ import annotations

from collections.abc import Callable

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
