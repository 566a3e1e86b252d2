"""Tiny encoder settings shared by the encoder tests (dim 32, 2 layers, 16 mels, 32x32 images)."""

from __future__ import annotations

TINY_AUDIO = dict(dim=32, depth=2, num_heads=4, n_mels=16, n_fft=400, hop_length=160,
                  sample_rate=16000, freq_masks=1, freq_mask_width=4, time_masks=1,
                  time_mask_width=10)
TINY_VISION = dict(dim=32, depth=2, num_heads=4, patch_size=8, image_size=32)
