"""run_cli's error policy and the config checks of mmtf.utils.config."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException, InstantiationException
from omegaconf import OmegaConf

from mmtf.errors import CheckpointError, ConfigError, DataError
from mmtf.utils.config import find_missing, require_values, run_cli


def _raises(err: BaseException):
    def body(cfg):
        raise err
    return body


def _wrapped(inner: BaseException) -> InstantiationException:
    """What hydra.utils.instantiate raises when a _target_ raises ``inner``."""
    try:
        try:
            raise inner
        except Exception as e:
            raise InstantiationException("Error in call to target 'x.Y':\n" + repr(e)) from e
    except InstantiationException as outer:
        return outer


@pytest.mark.parametrize(("err", "line"), [
    (ConfigError("split ('x') must be one of ('val', 'test')."),
     "mmtf: error: ConfigError: split ('x') must be one of ('val', 'test')."),
    (CheckpointError("checkpoint a.ckpt does not exist; pass ckpt_path=..."),
     "mmtf: error: CheckpointError: checkpoint a.ckpt does not exist; pass ckpt_path=..."),
    (_wrapped(DataError("x.csv (line 3): empty caption; fix it.")),
     "mmtf: error: DataError: x.csv (line 3): empty caption; fix it."),
    (ConfigCompositionException("Could not override 'model.dimm'."),
     "mmtf: error: ConfigCompositionException: Could not override 'model.dimm'."),
])
def test_a_user_error_is_one_line_and_exit_status_2(err, line, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(_raises(err), OmegaConf.create())
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize("err", [
    ValueError("Expected all tensors to be on the same device"),   # deep inside torch: a bug
    _wrapped(ValueError("dim must be positive")),
    KeyError("tokens"),
])
def test_anything_else_is_a_bug_and_keeps_its_traceback(err, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(type(err)) as info:
        run_cli(_raises(err), OmegaConf.create())
    assert info.value is err
    assert capsys.readouterr().err == ""


def test_hydra_full_error_shows_user_errors_too(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    err = ConfigError("bad value")
    with pytest.raises(ConfigError) as info:
        run_cli(_raises(err), OmegaConf.create())
    assert info.value is err


def test_run_cli_returns_the_result():
    assert run_cli(lambda cfg: cfg.x + 1, OmegaConf.create({"x": 1})) == 2


def test_missing_values_are_named_with_their_dotted_paths():
    cfg = OmegaConf.create({"ckpt_path": "???", "data": {"root": "???", "ok": 1},
                            "model": {"encoder": {"dim": 32}}, "splits": ["???", "a"]})
    assert find_missing(cfg) == ["ckpt_path", "data.root", "splits[0]"]
    with pytest.raises(ConfigError, match=r"missing required config value\(s\): ckpt_path, "
                                          r"data\.root, splits\[0\]; set them on the command "
                                          r"line, e\.g\. ckpt_path=\.\.\."):
        require_values(cfg)
    require_values(OmegaConf.create({"a": {"b": 1}}))
