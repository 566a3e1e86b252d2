"""Model inputs back to pictures for the overlays."""

from __future__ import annotations

import numpy as np
import torch

from mmtf.inspect.core import display_image

NORMALIZE = {"_target_": "torchvision.transforms.v2.Normalize", "mean": [0.5, 0.4, 0.3],
             "std": [0.5, 0.2, 0.25]}


def test_the_data_configs_normalisation_is_undone():
    picture = torch.rand(3, 8, 8)
    mean, std = (torch.tensor(NORMALIZE[k])[:, None, None] for k in ("mean", "std"))
    shown = display_image((picture - mean) / std, {"transforms": {"eval": [NORMALIZE]}})
    np.testing.assert_allclose(shown, picture.permute(1, 2, 0).numpy(), atol=1e-6)


def test_without_a_normalize_each_channel_is_stretched_to_0_1():
    image = torch.stack([torch.full((2, 2), 3.0), torch.tensor([[0.0, 1.0], [2.0, 4.0]]),
                         torch.tensor([[-1.0, 1.0], [1.0, 1.0]])])
    shown = display_image(image, {"transforms": {"eval": []}})
    assert shown.shape == (2, 2, 3)
    np.testing.assert_allclose(shown[..., 1], [[0.0, 0.25], [0.5, 1.0]])
    np.testing.assert_allclose(shown[..., 2], [[0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(shown[..., 0], 0.0)          # a flat channel stays finite
