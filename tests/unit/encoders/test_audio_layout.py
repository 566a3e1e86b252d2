"""The audio encoder's residual stream is contiguous (b, s, c): the conv stem's (b, c, s) output
is not handed on as a transposed view, which would make every block's elementwise ops and
GEMM inputs channel-strided (experiments/training_throughput: 4 % of the large encoder's step)."""

from __future__ import annotations

import torch

from mmtf.encoders import AudioEncoder
from tests.unit.presets import flat


def test_blocks_receive_a_contiguous_residual_stream():
    encoder = flat(AudioEncoder, dim=32, depth=2, num_heads=4, n_mels=16).train()
    seen = []
    for block in encoder.stack.blocks:
        block.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    encoder(torch.randn(2, 8000), torch.tensor([8000, 6000]))
    assert seen == [True, True]
