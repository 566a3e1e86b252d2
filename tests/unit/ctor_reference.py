"""Fingerprints of seeded modules, built from flat (pre-#39) constructor keywords.

``python tests/unit/ctor_reference.py OUT.json REPO`` with ``PYTHONPATH`` at the pre-#39 code wrote
``ctor_reference.json``; :mod:`tests.unit.test_ctor_parts` builds the same cases through today's
constructors (the flat keys mapped by :func:`mmtf.legacy.upgrade_config`) and compares.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch

CASES: dict[str, dict[str, Any]] = {
    "audio_default": {"_target_": "mmtf.encoders.AudioEncoder"},
    "audio_wide": {"_target_": "mmtf.encoders.AudioEncoder", "dim": 64, "depth": 2,
                   "num_heads": 8, "num_kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm",
                   "n_mels": 32, "n_fft": 256, "hop_length": 128, "feature_norm": "global",
                   "feature_mean": 0.5, "feature_std": 2.0, "bias": "qvo", "mlp_ratio": 2.0,
                   "freq_masks": 3, "time_mask_mode": "fixed", "stem_strides": [1, 2]},
    "audio_whisper": {"_target_": "mmtf.encoders.AudioEncoder", "dim": 64, "depth": 2,
                      "n_mels": 80, "features": "whisper", "positions": "sinusoidal",
                      "pad_to_seconds": 2.0, "max_seconds": 2.0, "stem_strides": [1, 2],
                      "bias": "qvo"},
    "vision_default": {"_target_": "mmtf.encoders.VisionEncoder"},
    "vision_conv": {"_target_": "mmtf.encoders.VisionEncoder", "dim": 64, "depth": 2,
                    "stem": "conv", "stem_convs": 2, "stem_norm": "layer",
                    "pos_embed": "sincos", "image_size": 32, "cls_token": False,
                    "embed_norm": True, "final_norm": False, "mlp": "quick_gelu",
                    "norm_eps": 1e-6, "bias": True, "mlp_bias": False},
    "decoder_default": {"_target_": "mmtf.decoders.TextDecoder", "vocab_size": 50, "dim": 32,
                        "depth": 2, "num_heads": 4, "context_dim": 48},
    "decoder_learned": {"_target_": "mmtf.decoders.TextDecoder", "vocab_size": 50, "dim": 32,
                        "depth": 2, "num_heads": 4, "num_kv_heads": 2, "context_dim": 32,
                        "positions": "learned", "max_len": 16, "tie_embeddings": False,
                        "mlp": "gelu_tanh", "dropout": 0.1, "attn_dropout": 0.1, "bias": "qvo",
                        "norm": "rmsnorm", "rope_base": 500.0},
}
# Model presets (conf/model/<group>/<name>.yaml), composed from the conf/ tree beside the code.
PRESETS = [("encoder", "audio_small"), ("encoder", "audio_base"), ("encoder", "vision_small"),
           ("decoder", "text_small")]


def _inputs(target: str, module: torch.nn.Module) -> tuple:
    g = torch.Generator().manual_seed(1)
    if target.endswith("AudioEncoder"):
        return torch.randn(2, 16000, generator=g), torch.tensor([16000, 9000])
    if target.endswith("VisionEncoder"):
        return (torch.randn(2, 3, 32, 32, generator=g),)
    tokens = torch.randint(0, 50, (2, 7), generator=g)
    return tokens, torch.randn(2, 5, module.context_dim, generator=g)


def fingerprint(spec: Any, build: Any) -> dict[str, Any]:
    """Seeded build, then the state_dict keys, a digest of its bytes and of an eval forward."""
    torch.manual_seed(0)
    module = build(spec).eval()
    state = module.state_dict()
    digest = hashlib.sha256()
    for key, value in state.items():
        digest.update(key.encode())
        digest.update(value.detach().contiguous().numpy().tobytes())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)              # the reduction order of the reference's forward
    try:
        with torch.no_grad():
            out = module(*_inputs(spec["_target_"], module))
    finally:
        torch.set_num_threads(threads)
    out = out[0] if isinstance(out, tuple) else out
    return {"keys": list(state), "state": digest.hexdigest(),
            "out": hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest()}


if __name__ == "__main__":
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    torch.set_num_threads(1)
    result = {name: fingerprint(spec, instantiate) for name, spec in CASES.items()}
    for group, name in PRESETS:
        with initialize_config_dir(f"{sys.argv[2]}/conf/model/{group}", version_base="1.3"):
            cfg = compose(config_name=name)
        result[f"{group}/{name}"] = fingerprint(cfg, instantiate)
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
