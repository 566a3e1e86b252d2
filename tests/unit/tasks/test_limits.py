"""Data settings the model cannot hold are rejected by the task with the keys to change.

The task checks them: it is the one object that sees both the data module's settings and the
model's limits (``connect_data``); a model-only rule (generation length) is checked when the
task is built.
"""

from __future__ import annotations

import pytest

from mmtf.errors import UserError
from mmtf.text import CharTokenizer

from .conftest import captioner, classifier, fake_datamodule


def test_settings_within_the_model_limits_pass():
    task, tokenizer = captioner(generation={"max_new_tokens": 32}), CharTokenizer.train(["beep"])
    task.use_tokenizer(tokenizer)
    task.connect_data(fake_datamodule(tokenizer=tokenizer))
    classifier().connect_data(fake_datamodule(modality="image", max_seconds=None))


@pytest.mark.parametrize(("dm", "pattern"), [
    (fake_datamodule(max_seconds=40.0),
     r"data.max_seconds \(40.0\) exceeds model.encoder.max_seconds \(30.0\)"),
    (fake_datamodule(max_seconds=None), r"data.max_seconds \(None\) exceeds"),
    (fake_datamodule(max_caption_tokens=100),
     r"data.max_caption_tokens \(100\) exceeds model.decoder.max_len \(64\)"),
])
def test_data_past_the_model_limits_is_rejected(dm, pattern):
    with pytest.raises(UserError, match=pattern):
        captioner().connect_data(dm)


def test_generation_longer_than_the_decoder_is_rejected_at_construction():
    with pytest.raises(UserError, match=r"max_new_tokens \(64\) \+ the prompt \(1 token\) exceeds "
                                        r"model.decoder.max_len \(64\)"):
        captioner(generation={"max_new_tokens": 64})
    task = captioner()
    with pytest.raises(UserError, match=r"max_new_tokens \(80\)"):
        task.update_generation({"max_new_tokens": 80})


def test_generation_overrides_on_a_classifier_name_the_key():
    with pytest.raises(UserError, match=r"generation.num_beams is set but a ClassificationTask"):
        classifier().update_generation({"num_beams": 2})
    classifier().update_generation({})          # nothing set: nothing to refuse
