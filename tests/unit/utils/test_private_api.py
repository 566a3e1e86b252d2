"""Private attributes of other libraries are touched only in mmtf/utils/compat.py.

A private name of Lightning, Hydra, OmegaConf or torch can change in any release; keeping every
use in one module makes the list short and visible (issue #12). mmtf's own private names
(defined somewhere in mmtf) may be used across mmtf's modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "mmtf"
COMPAT = PACKAGE / "utils" / "compat.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_private_names(files: list[Path]) -> set[str]:
    """Private names mmtf defines: functions, methods, classes, class and self attributes."""
    names: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if _private(n)}


def _is_foreign_private(node: ast.AST, own: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return _private(node.attr) and node.attr not in own
    if isinstance(node, ast.Call):        # getattr(obj, "_x"), hasattr, setattr
        name = node.args[1] if len(node.args) >= 2 else None
        return (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr")
                and isinstance(name, ast.Constant) and isinstance(name.value, str)
                and _private(name.value) and name.value not in own)
    if isinstance(node, ast.ImportFrom):
        if not node.module or node.level or node.module.startswith("mmtf") \
                or node.module == "__future__":
            return False
        return any(_private(p) for p in node.module.split(".")) or \
            any(_private(a.name) for a in node.names)
    if isinstance(node, ast.Import):
        return any(_private(p) for a in node.names for p in a.name.split("."))
    return False


def foreign_private_uses(source: str, own: set[str]) -> list[str]:
    """``obj._x`` / ``getattr(obj, "_x")`` of names mmtf does not define, and imports of
    private modules or names of other packages, as ``line: code``."""
    return [f"{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if _is_foreign_private(node, own)]


def test_scanner_flags_foreign_private_uses():
    # Control: the check can fail.
    source = ("from hydra._internal.utils import _locate\n"
              "x = getattr(trainer, '_signal_connector', None)\n"
              "y = fit_loop._combined_loader\n"
              "z = self._mine\n")
    assert len(foreign_private_uses(source, own={"_mine"})) == 3


def test_private_attributes_only_in_compat():
    files = sorted(PACKAGE.rglob("*.py"))
    own = own_private_names([f for f in files if f != COMPAT])
    offenders = {str(f.relative_to(PACKAGE.parent)): uses for f in files if f != COMPAT
                 for uses in [foreign_private_uses(f.read_text(), own)] if uses}
    assert not offenders, (
        f"private attributes of other libraries outside mmtf/utils/compat.py: {offenders}; "
        f"use the public API or add a function to compat.py that says why.")


@pytest.mark.parametrize("name", [n for n in dir(__import__("mmtf.utils.compat", fromlist=["x"]))
                                  if not n.startswith("_") and n != "annotations"])
def test_compat_functions_are_documented(name):
    import mmtf.utils.compat as compat

    fn = getattr(compat, name)
    if callable(fn) and getattr(fn, "__module__", "") == compat.__name__:
        assert fn.__doc__ and "checked" in fn.__doc__.lower(), (
            f"mmtf.utils.compat.{name} must say which versions were checked.")


def test_private_names_behind_compat_still_exist():
    """What compat.py reaches for is still there in the installed libraries (fails on upgrade)."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    for name in ("_combined_loader_states_to_load", "_data_fetcher", "_combined_loader",
                 "_load_combined_loader_states"):
        assert hasattr(trainer.fit_loop, name), f"lightning FitLoop lost {name}"
    assert hasattr(trainer._signal_connector, "received_sigterm")
    checkpoint = ModelCheckpoint()
    for name in ("_monitor_candidates", "_save_last_checkpoint", "_last_global_step_saved",
                 "_every_n_train_steps"):
        assert hasattr(checkpoint, name), f"lightning ModelCheckpoint lost {name}"
    assert isinstance(torch.zeros(1)._version, int)
    assert callable(torch.nn.Module._apply)
    import torch._inductor.config as inductor_config
    import torchdata.stateful_dataloader as stateful
    from torch._dynamo.exc import BackendCompilerFailed  # noqa: F401
    from torch._inductor.cpp_builder import get_cpp_compiler  # noqa: F401
    assert hasattr(inductor_config, "freezing"), "inductor lost config.freezing"
    assert callable(torch._dynamo.mark_static)
    if torch.backends.mkldnn.is_available():
        for name in ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported"):
            assert hasattr(torch.ops.mkldnn, name), f"torch.ops.mkldnn lost {name}"
    for cls in (torch.utils.data.DataLoader, stateful.StatefulDataLoader):
        loader = cls(torch.arange(8.0), batch_size=4, num_workers=1)
        iterator = iter(loader)
        for name in ("_shutdown", "_workers", "_shutdown_workers"):
            assert hasattr(iterator, name), f"{cls.__name__}'s iterator lost {name}"
        assert hasattr(loader, "_iterator"), f"{cls.__name__} lost _iterator"
        iterator._shutdown_workers()
