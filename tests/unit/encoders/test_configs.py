"""Every YAML in conf/model/encoder instantiates with Hydra and runs a forward pass (base sizes:
on the meta device only) and exposes every constructor key, so overrides work in struct mode."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from mmtf.encoders import AudioEncoder, Encoder, VisionEncoder
from mmtf.encoders.audio import LogMelFrontEnd, SpecAugment
from mmtf.encoders.vision import PatchOptions
from mmtf.nn import BlockOptions
from tests.unit.presets import load_preset

CONF = Path(__file__).resolve().parents[3] / "conf" / "model" / "encoder"
# Builders of imported architectures (mmtf.pretrained.*) are tested with their families.
CONFIGS = sorted(p for p in CONF.rglob("*.yaml")
                 if not load_preset("encoder", p.stem)._target_.startswith("mmtf.pretrained."))


def test_the_named_sizes_exist():
    names = {p.stem for p in CONFIGS}
    assert {f"{kind}_{size}" for kind in ("audio", "vision")
            for size in ("tiny", "small", "base")} <= names


def _frames(samples: int, cfg) -> int:
    """Encoder frames of a clip: centred STFT frames, then each stem conv (kernel 3, padding 1)."""
    frames = samples // cfg.frontend.hop_length + 1          # audio_small: 8000 -> 51, 4000 -> 26
    for stride in cfg.stem_strides:
        frames = (frames - 1) // stride + 1                   # 51 -> 26 -> 13; 26 -> 13 -> 7
    return frames


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_instantiates_and_runs(path):
    cfg = load_preset("encoder", path.stem)
    cls = {"mmtf.encoders.AudioEncoder": AudioEncoder,
           "mmtf.encoders.VisionEncoder": VisionEncoder}[cfg._target_]
    # Every constructor key but `causal` (set by role, never silently in YAML) is in the file.
    expected = set(inspect.signature(cls.__init__).parameters) - {"self", "causal"}
    assert set(cfg.keys()) - {"_target_"} == expected
    # and every key of each part (block options, front end, SpecAugment)
    parts = {"block": BlockOptions, "frontend": LogMelFrontEnd, "spec_augment": SpecAugment,
             "patch": PatchOptions}
    for key in set(cfg) & set(parts):
        assert set(cfg[key]) - {"_target_"} == set(inspect.signature(parts[key]).parameters)
    if cls is AudioEncoder:
        assert cfg.frontend.sample_rate == 16000
    if cfg.dim >= 512:                                      # GPU-sized (base, vit, clip)
        with torch.device("meta"):                           # shapes and signatures, no memory
            enc = instantiate(cfg)
        assert next(enc.parameters()).is_meta
        assert isinstance(enc, cls) and enc.dim == cfg.dim
        return
    enc = instantiate(cfg).eval()
    assert isinstance(enc, Encoder) and enc.dim == cfg.dim
    with torch.no_grad():
        if cls is AudioEncoder:
            out = enc(0.1 * torch.randn(2, 8000), torch.tensor([8000, 4000]))
            assert out.mask.sum(dim=1).tolist() == [_frames(n, cfg) for n in (8000, 4000)]
        else:
            size = cfg.image_size
            out = enc(torch.randn(2, 3, size, size))
            assert out.memory.shape[1] == (size // cfg.patch.patch_size) ** 2 + int(cfg.cls_token)
    assert out.memory.shape[-1] == cfg.dim and torch.isfinite(out.memory).all()
