"""AtomicCheckpointIO: a writer killed mid-save never damages last.ckpt; loads are weights-only."""

from __future__ import annotations

import hashlib
import io
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mmtf.checkpoint_io import AtomicCheckpointIO, stale_temp_files
from mmtf.errors import CheckpointError
from mmtf.reliability import resolve_resume


def checkpoint(step: int, numel: int = 1 << 18) -> dict:
    """A Lightning-shaped checkpoint (~1 MB of weights) that resolve_resume accepts."""
    return {"state_dict": {"w": torch.full((numel,), float(step))}, "loops": {},
            "optimizer_states": [], "global_step": step, "epoch": 0}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _slow_save_then_hang(target: str, half_written: mp.synchronize.Event) -> None:
    """Child: save step 2 over ``target`` through AtomicCheckpointIO with a torch.save that
    writes 4 KiB chunks slowly and signals once half the bytes are on disk."""
    real_save = torch.save

    def slow_save(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        for i in range(0, len(data), 4096):
            f.write(data[i:i + 4096])
            f.flush()
            if i >= len(data) // 2:
                half_written.set()
            time.sleep(0.01)

    torch.save = slow_save
    AtomicCheckpointIO().save_checkpoint(checkpoint(2), target)


def test_sigkill_during_save_keeps_previous_last_ckpt(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    last = ckpt_dir / "last.ckpt"
    io_ = AtomicCheckpointIO()
    io_.save_checkpoint(checkpoint(1), last)
    before = sha(last)

    ctx = mp.get_context("fork")
    half_written = ctx.Event()
    child = ctx.Process(target=_slow_save_then_hang, args=(str(last), half_written))
    child.start()
    assert half_written.wait(60), "the child never got halfway through its save"
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL

    # The old file is intact and loads; the partial write sits in a temp file beside it.
    assert sha(last) == before
    assert io_.load_checkpoint(last)["global_step"] == 1
    leftovers = list(ckpt_dir.glob(".last.ckpt.*.tmp"))
    assert len(leftovers) == 1
    assert leftovers[0].name.startswith(f".last.ckpt.{socket.gethostname().replace('.', '_')}."
                                        f"{child.pid}.")
    full = last.stat().st_size             # step 1 and step 2 checkpoints have the same size
    assert full // 2 <= leftovers[0].stat().st_size < full
    assert resolve_resume("last", tmp_path) == str(last)     # the temp file is never a candidate

    # The next successful save replaces last.ckpt and removes the dead writer's temp file.
    io_.save_checkpoint(checkpoint(3), last)
    assert io_.load_checkpoint(last)["global_step"] == 3
    assert list(ckpt_dir.glob(".last.ckpt.*.tmp")) == []


def test_temp_file_is_written_in_the_target_directory(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((Path(src).parent, Path(dst).parent))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    AtomicCheckpointIO().save_checkpoint(checkpoint(1, 8), tmp_path / "a" / "b.ckpt")
    assert seen == [(tmp_path / "a", tmp_path / "a")]


def test_only_dead_writers_of_this_host_are_cleaned(tmp_path):
    target = tmp_path / "last.ckpt"
    host = socket.gethostname().replace(".", "_")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"dead": f".last.ckpt.{host}.{dead.pid}.aaaa.tmp",
                 "alive": f".last.ckpt.{host}.{alive.pid}.bbbb.tmp",
                 "other_host": f".last.ckpt.otherhost.{dead.pid}.cccc.tmp",
                 "other_target": f".best.ckpt.{host}.{dead.pid}.dddd.tmp"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        assert stale_temp_files(target) == [tmp_path / names["dead"]]
    finally:
        alive.kill()
        alive.wait()


class _RunsCode:
    """Unpickling this object creates a file: the attack weights_only=True prevents."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (Path(self.target), "pwned"))


def test_load_is_weights_only_even_when_the_env_var_says_otherwise(tmp_path, monkeypatch):
    evil, pwned = tmp_path / "evil.ckpt", tmp_path / "pwned.txt"
    torch.save({"state_dict": {}, "payload": _RunsCode(str(pwned))}, evil)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match=r"evil.ckpt cannot be loaded safely"):
        AtomicCheckpointIO().load_checkpoint(evil)
    with pytest.raises(CheckpointError, match=r"refusing weights_only=False"):
        AtomicCheckpointIO().load_checkpoint(evil, weights_only=False)
    assert not pwned.exists()
    # Control: Lightning's own IO with weights_only unset obeys the env var and runs the code.
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        TorchCheckpointIO().load_checkpoint(evil)
    assert pwned.read_text() == "pwned"


def test_storage_options_are_refused(tmp_path):
    with pytest.raises(TypeError, match=r"storage_options is not supported"):
        AtomicCheckpointIO().save_checkpoint(checkpoint(1, 8), tmp_path / "x.ckpt",
                                             storage_options={"a": 1})
