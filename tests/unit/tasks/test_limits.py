"""Data settings the model cannot hold are rejected at setup with the keys to change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmtf.tasks.common import check_limits


def _dm(**kw):
    return SimpleNamespace(**{"modality": "audio", "max_seconds": 10.0,
                              "max_caption_tokens": 32, **kw})


ENCODER = SimpleNamespace(max_seconds=30.0)
DECODER = SimpleNamespace(max_len=64)


def test_settings_within_the_model_limits_pass():
    check_limits(_dm(), ENCODER, DECODER, max_new_tokens=32)
    check_limits(_dm(modality="image", max_seconds=None), SimpleNamespace(), DECODER)


@pytest.mark.parametrize(("dm", "tokens", "pattern"), [
    (_dm(max_seconds=40.0), None, r"data.max_seconds \(40.0\) exceeds model.encoder.max_seconds "
                                  r"\(30.0\)"),
    (_dm(max_seconds=None), None, r"data.max_seconds \(None\) exceeds"),
    (_dm(max_caption_tokens=100), None, r"data.max_caption_tokens \(100\) exceeds "
                                        r"model.decoder.max_len \(64\)"),
    (_dm(), 64, r"max_new_tokens \(64\) \+ bos exceeds model.decoder.max_len \(64\)"),
])
def test_settings_past_the_model_limits_are_rejected(dm, tokens, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_limits(dm, ENCODER, DECODER, max_new_tokens=tokens)
