"""mmtf.errors.in_config: a rule's owner raises, the part that built it says where."""

from __future__ import annotations

import pytest

from mmtf.errors import ConfigError, DataError, UserError, in_config


def test_in_config_prefixes_the_node_once_and_keeps_the_type_and_attributes():
    with pytest.raises(DataError) as caught, in_config("model"), in_config("model.encoder"):
        raise DataError("x.wav: empty; fix it.", reason="empty_file", path="x.wav")
    assert str(caught.value) == "model.encoder: x.wav: empty; fix it."
    assert (caught.value.reason, caught.value.path) == ("empty_file", "x.wav")


def test_in_config_leaves_other_errors_and_named_keys_alone():
    with pytest.raises(TypeError, match=r"^plain$"), in_config("model.encoder"):
        raise TypeError("plain")
    with pytest.raises(ConfigError, match=r"^model\.encoder\.dim \(3\) is odd$"), \
            in_config("model.encoder"):
        raise ConfigError("model.encoder.dim (3) is odd")


def test_every_user_facing_error_is_a_user_error_and_a_value_error():
    import mmtf.errors as errors

    types = [getattr(errors, name) for name in errors.__all__ if name.endswith("Error")]
    assert {t.__name__ for t in types} == {"UserError", "ConfigError", "MonitorError",
                                          "CheckpointError", "ResumeError", "DataError"}
    assert all(issubclass(t, UserError) and issubclass(t, ValueError) for t in types)
