"""A user's own modules in a checkpoint's config: allowed only by the loading command."""

from __future__ import annotations

import textwrap

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mmtf.checkpoint_io import SAFE_TARGETS_ENV, check_targets, validate_safe_targets
from mmtf.errors import CheckpointError
from mmtf.tasks import build_task
from mmtf.train import train
from tests.integration.conftest import CONF


@pytest.fixture
def mylab(tmp_path, monkeypatch):
    """A package ``mylab.models`` on sys.path with an encoder class of the user's own."""
    pkg = tmp_path / "lab" / "mylab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(textwrap.dedent("""\
        from mmtf.encoders import AudioEncoder

        class LabEncoder(AudioEncoder):
            '''The user's own encoder (here: mmtf's, under another name).'''
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "lab"))
    monkeypatch.delenv(SAFE_TARGETS_ENV, raising=False)


def lab_checkpoint(safe_targets: list[str]) -> tuple[dict, torch.nn.Module]:
    """What mmtf.train stores: the composed config (naming mylab.models) and the weights."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[
            "model=classifier", "model/encoder=audio_tiny", "model.num_classes=3",
            "model.encoder._target_=mylab.models.LabEncoder", "data=synth_audio_labels",
            "paths.output_dir=/tmp/x", f"safe_targets=[{','.join(safe_targets)}]"])
    config = OmegaConf.to_container(cfg, resolve=True)
    task = instantiate(cfg.model)
    return {"state_dict": task.state_dict(), "mmtf": {"config": config}}, task


def test_own_module_loads_only_when_the_loader_allows_it(mylab, monkeypatch):
    checkpoint, trained = lab_checkpoint(["mylab.models"])
    with pytest.raises(CheckpointError, match=r"config.model.encoder: _target_ "
                                              r"'mylab.models.LabEncoder'.*lists safe_targets "
                                              r"\['mylab.models'\].*MMTF_SAFE_TARGETS="
                                              r"mylab.models"):
        build_task(checkpoint, "lab.ckpt")                   # stored list alone: refused
    task, _ = build_task(checkpoint, "lab.ckpt", safe_targets=["mylab.models"])
    assert type(task.encoder).__module__ == "mylab.models"
    for name, value in trained.state_dict().items():
        torch.testing.assert_close(task.state_dict()[name], value, rtol=0, atol=0)
    monkeypatch.setenv(SAFE_TARGETS_ENV, "mylab.models")    # the CLIs' way
    task, _ = build_task(checkpoint, "lab.ckpt")
    assert type(task.encoder).__name__ == "LabEncoder"


def test_prefix_matches_whole_module_names_only(mylab):
    check_targets({"_target_": "mylab.models.sub.X"}, "c", ["mylab.models"])
    with pytest.raises(CheckpointError, match=r"'mylab.modelsevil.X'"):
        check_targets({"_target_": "mylab.modelsevil.X"}, "c", ["mylab.models"])
    with pytest.raises(CheckpointError, match=r"'otherlab.Y'"):
        check_targets({"_target_": "otherlab.Y"}, "c", ["mylab.models"])


@pytest.mark.parametrize("entry", ["os", "os.path", "subprocess", "builtins", "importlib",
                                   "sys", "posix"])
def test_standard_library_entries_are_refused(entry):
    with pytest.raises(CheckpointError, match=rf"safe_targets entry '{entry}' names the "
                                              rf"standard-library module"):
        validate_safe_targets([entry])
    with pytest.raises(CheckpointError, match=r"standard-library"):
        check_targets({"_target_": "os.system"}, "c", [entry])


def test_malformed_entry_and_env(monkeypatch):
    with pytest.raises(CheckpointError, match=r"'mylab/models' is not a dotted module path"):
        validate_safe_targets(["mylab/models"])
    monkeypatch.setenv(SAFE_TARGETS_ENV, "mylab.models, os")
    with pytest.raises(CheckpointError, match=r"'os' names the standard-library"):
        check_targets({"_target_": "mmtf.tasks.ClassificationTask"}, "c")


def test_train_refuses_a_stdlib_entry(tmp_path):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["safe_targets=[subprocess]",
                                          f"paths.output_dir={tmp_path}"])
    with pytest.raises(CheckpointError, match=r"'subprocess' names the standard-library"):
        train(cfg)
