"""When the attention-figure callback draws: epochs counted from 1, as Lightning's
``check_val_every_n_epoch`` counts them (validation after epoch e when e % n == 0)."""

from __future__ import annotations

import pytest

from mmtf.errors import UserError
from mmtf.inspect.callback import AttentionFigureCallback


def _validated(max_epochs: int, every: int) -> list[int]:
    """0-based epochs whose end Lightning validates (its rule, written out by hand)."""
    return [e for e in range(max_epochs) if (e + 1) % every == 0]


def test_every_6_with_validation_every_2nd_epoch_draws_after_epochs_6_12_18_24():
    callback = AttentionFigureCallback(every_n_epochs=6)
    drawn = [e + 1 for e in _validated(26, 2) if callback.draws_after(e)]
    assert drawn == [6, 12, 18, 24]


def test_every_epoch_draws_at_every_validation():
    callback = AttentionFigureCallback(every_n_epochs=1)
    assert all(callback.draws_after(e) for e in _validated(26, 2))


def test_zero_is_refused_with_the_key():
    with pytest.raises(UserError, match="callbacks.attention_figure.every_n_epochs"):
        AttentionFigureCallback(every_n_epochs=0)
