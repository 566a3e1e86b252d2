"""A checkpoint or export that would run code is refused by every mmtf entry point.

The "checkpoint" is a pickle whose unpickling writes a file. It is fed to train (resume),
evaluate, predict, export and to ``model.encoder.pretrained`` (as the pickle bytes renamed
``weights.safetensors``), with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` set as an attacker would
hope. An export whose ``config.yaml`` names ``_target_: os.system`` is refused too. Every call
exits with mmtf's one-line error (status 2) naming the file, and the target file never appears.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import save_file

from mmtf.errors import CheckpointError
from mmtf.export import load_exported

from .conftest import cli_in_process, run_cli, tiny_overrides

# HYDRA_FULL_ERROR=0: the one-line form of a user error (run_cli shows tracebacks under 1).
UNSAFE_ENV = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "HYDRA_FULL_ERROR": "0"}


class _WritesAFile:
    """Unpickling this object runs code: it creates the file named at pickling time."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (Path(self.target), "pwned"))


def _evil_checkpoint(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}, "payload": _WritesAFile(str(target))}, path)
    return path


def _pickle_as_safetensors(folder: Path, target: Path) -> Path:
    folder.mkdir(parents=True)
    _evil_checkpoint(folder / "weights.safetensors", target)
    (folder / "config.yaml").write_text("_target_: mmtf.encoders.audio.AudioEncoder\ndim: 32\n"
                                        "pretrained: null\nfreeze: false\n")
    return folder / "weights.safetensors"


def _os_system_export(folder: Path, target: Path) -> Path:
    """Real safetensors weights, but a config that would run a shell command if instantiated."""
    folder.mkdir(parents=True)
    save_file({"x": torch.zeros(2)}, str(folder / "weights.safetensors"))
    (folder / "config.yaml").write_text(f"_target_: os.system\ncommand: touch {target}\n")
    return folder / "config.yaml"


def test_the_payload_really_runs_when_unpickled(tmp_path):
    """Sanity: without weights_only the fixture does write its file."""
    target = tmp_path / "pwned.txt"
    torch.load(_evil_checkpoint(tmp_path / "evil.ckpt", target), weights_only=False)
    assert target.read_text() == "pwned"


def test_load_exported_refuses_a_config_naming_os_system(tmp_path):
    target = tmp_path / "pwned.txt"
    _os_system_export(tmp_path / "enc", target)
    with pytest.raises(CheckpointError, match=r"config\.yaml.*_target_ 'os\.system' is not an "
                                              r"mmtf/torch class"):
        load_exported(tmp_path / "enc")
    assert not target.exists()


def test_load_exported_refuses_pickle_bytes_as_weights(tmp_path):
    target = tmp_path / "pwned.txt"
    _pickle_as_safetensors(tmp_path / "enc", target)
    with pytest.raises(Exception, match=r"weights\.safetensors. is not a valid safetensors"):
        load_exported(tmp_path / "enc")
    assert not target.exists()


CASES = ["train_resume", "evaluate", "predict", "export", "pretrained_pickle",
         "pretrained_os_system"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES)
def test_every_entry_point_refuses_code_in_a_checkpoint(case, tmp_path):
    target = tmp_path / "pwned.txt"
    evil = _evil_checkpoint(tmp_path / "evil" / "evil.ckpt", target)
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"
    train = tiny_overrides("audio_captioning", tmp_path / "data", run_dir)
    if case == "train_resume":
        module, args, named = "mmtf.train", [*train, f"ckpt_path={evil}"], evil
    elif case == "evaluate":
        module, args, named = "mmtf.evaluate", [f"ckpt_path={evil}", run_dir], evil
    elif case == "predict":
        wav = tmp_path / "a.wav"
        sf.write(wav, np.zeros(16000, np.float32), 16000)
        module, args, named = "mmtf.predict", [f"ckpt_path={evil}", f"inputs=[{wav}]",
                                               run_dir], evil
    elif case == "export":
        module, args, named = "mmtf.export", [f"ckpt_path={evil}", "part=encoder",
                                              f"out={tmp_path / 'out'}", run_dir], evil
    elif case == "pretrained_pickle":
        named = _pickle_as_safetensors(tmp_path / "enc", target)
        module, args = "mmtf.train", [*train, f"model.encoder.pretrained={named.parent}"]
    else:
        _os_system_export(tmp_path / "enc", target)
        named = tmp_path / "enc" / "weights.safetensors"
        module, args = "mmtf.train", [*train, f"model.encoder.pretrained={named.parent}"]
    # One case through a real interpreter (the environment an attacker sets at its start);
    # the others in-process: the same main() and the same environment variable.
    runner = run_cli if case == "train_resume" else cli_in_process
    out = runner(module, args, cwd=tmp_path, env=UNSAFE_ENV)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("mmtf: error:")]
    assert len(errors) == 1 and str(named) in errors[0], out.stderr[-3000:]
    assert not target.exists()
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "data").exists()   # refused before any data was generated
