"""Checkpoint loading never unpickles code, whatever the environment says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmtf.checkpoint_io import check_targets, load_checkpoint
from mmtf.errors import CheckpointError


class _WritesAFile:
    """Unpickling this object runs code: it would create the file named at pickling time."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (Path(self.target), "pwned"))


def write_malicious_checkpoint(path: Path, target: Path) -> None:
    torch.save({"state_dict": {}, "payload": _WritesAFile(str(target))}, path)


def test_malicious_checkpoint_is_refused_and_runs_nothing(tmp_path):
    ckpt, target = tmp_path / "evil.ckpt", tmp_path / "pwned.txt"
    write_malicious_checkpoint(ckpt, target)
    with pytest.raises(CheckpointError, match=r"evil.ckpt cannot be loaded safely"):
        load_checkpoint(ckpt)
    assert not target.exists()
    # Sanity: the file really is dangerous when unpickled without restrictions.
    torch.load(ckpt, weights_only=False)
    assert target.exists()


def test_env_var_cannot_turn_unsafe_loading_back_on(tmp_path, monkeypatch):
    """torch reads the variable at every ``torch.load`` call (so in-process is the real case)."""
    ckpt, target = tmp_path / "evil.ckpt", tmp_path / "pwned.txt"
    write_malicious_checkpoint(ckpt, target)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="forcing weights_only=False"):
        torch.load(ckpt)                       # control: the variable does unlock a plain load
    assert target.exists()
    target.unlink()
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)
    assert not target.exists()


def test_plain_checkpoint_loads(tmp_path):
    path = tmp_path / "ok.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "mmtf": {"config": {"a": 1}}}, path)
    assert torch.equal(load_checkpoint(path)["state_dict"]["w"], torch.ones(2))


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope.ckpt does not exist"):
        load_checkpoint(tmp_path / "nope.ckpt")


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "cut.ckpt"
    torch.save({"w": torch.randn(100)}, path)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"cut.ckpt cannot be loaded safely"):
        load_checkpoint(path)


def test_stored_targets_are_allowlisted():
    check_targets({"model": {"_target_": "mmtf.tasks.CaptioningTask",
                             "optimizer": {"_target_": "torch.optim.AdamW"}}}, "config")
    with pytest.raises(CheckpointError, match=r"config.model.encoder: _target_ 'os.system'"):
        check_targets({"model": {"encoder": {"_target_": "os.system"}}}, "config")
    check_targets({"dtype": {"_target_": "hydra.utils.get_object", "path": "torch.float32"}}, "c")
    with pytest.raises(CheckpointError, match=r"only name torch objects, not 'os.system'"):
        check_targets({"dtype": {"_target_": "hydra.utils.get_object", "path": "os.system"}}, "c")
    with pytest.raises(CheckpointError, match=r"builtins.eval"):
        check_targets({"x": [{"_target_": "builtins.eval"}]}, "config")
