"""plot.render_and_save: the one draw the training callback makes per validation gives the
pixels matplotlib's own ``savefig`` writes at that dpi, in the returned image and the PNG."""

from __future__ import annotations

import matplotlib.image
import numpy as np

from mmtf.inspect import plot


def _figure():
    rng = np.random.default_rng(0)
    return plot.audio_attention_figure(
        rng.normal(size=(16, 40)), frame_seconds=0.025, duration=1.0,
        maps={"layer 1": rng.random((3, 10))}, position_seconds=0.1,
        labels=["a", "dog", "barks"], caption="a dog barks")


def test_one_draw_gives_savefigs_pixels(tmp_path):
    reference = tmp_path / "savefig.png"
    _figure().savefig(reference, dpi=110)
    expected = (matplotlib.image.imread(reference)[..., :3] * 255).round().astype(np.uint8)

    image = plot.render_and_save(_figure(), tmp_path / "sub" / "one_draw.png", dpi=110)
    written = (matplotlib.image.imread(tmp_path / "sub" / "one_draw.png")[..., :3] * 255)
    assert image.dtype == np.uint8 and image.shape == expected.shape
    np.testing.assert_array_equal(image, expected)
    np.testing.assert_array_equal(written.round().astype(np.uint8), expected)
