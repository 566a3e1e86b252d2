"""Zero-shot scoring (mmtf.zero_shot) on hand-made predictions: accuracy, chance level and
per-class accuracy worked out in the comments."""

from __future__ import annotations

import pytest
import torch

from mmtf.errors import ConfigError
from mmtf.zero_shot import label_prompts, score_predictions


def test_accuracy_chance_and_per_class_of_a_hand_made_case():
    # 6 items of 3 classes (class 2 never occurs, class 0 three times):
    #   targets      0 0 0 1 1 3
    #   predictions  0 1 0 1 0 3   -> right: 0 ok, 1 no, 0 ok, 1 ok, 0 no, 3 ok = 4 of 6
    # per class: 0: 2 of 3, 1: 1 of 2, 2: no item, 3: 1 of 1
    # chance: always the most frequent class (0): 3 of 6
    got = score_predictions(torch.tensor([0, 1, 0, 1, 0, 3]), torch.tensor([0, 0, 0, 1, 1, 3]),
                            num_classes=4)
    assert got.accuracy == pytest.approx(4 / 6)
    assert got.chance == pytest.approx(3 / 6)
    assert got.per_class == [pytest.approx(2 / 3), pytest.approx(1 / 2), None, 1.0]
    assert got.count == 6


def test_bad_predictions_are_refused():
    with pytest.raises(ValueError, match="same \\(n,\\)"):
        score_predictions(torch.tensor([0, 1]), torch.tensor([0]), num_classes=2)
    with pytest.raises(ValueError, match="targets hold an index outside \\[0, 2\\)"):
        score_predictions(torch.tensor([0]), torch.tensor([2]), num_classes=2)


def test_label_prompts_from_class_names_or_given_labels():
    # the built-in class names are <attribute>_<kind>: the captions say "a low tone"
    assert label_prompts(["low_tone", "fast_clicks"]) == ["low tone", "fast clicks"]
    assert label_prompts(["low_tone"], ["deep hum"]) == ["deep hum"]
    with pytest.raises(ConfigError, match=r"labels has 1 entries but the data has 2 classes"):
        label_prompts(["a_b", "c"], ["x"])
