"""Fingerprints of seeded modules, built from flat (pre-#39) constructor keywords.

Run from a checkout of the pre-#39 code (696d7af) at REPO, so that its ``mmtf`` is imported
(not by path: ``tests/unit/inspect`` would shadow the standard library's ``inspect``)::

    cd REPO && PYTHONPATH=. python -c "import runpy, sys; sys.argv[1:] = ['OUT.json', '.'];
        runpy.run_path('THIS_FILE', run_name='__main__')"

That wrote ``ctor_reference.json``; :mod:`tests.unit.test_ctor_parts` builds the same cases
through today's constructors (the flat keys mapped by :func:`mmtf.utils.parts.upgrade_config`) and
compares.

A fingerprint is the state_dict keys and, per tensor and for an eval forward, the shape and a few
float64 projections on fixed integer weights. Not a byte digest: the last bits of a forward (and
of buffers computed by ``sin``/``exp``, Whisper's position table) differ between AVX2 and AVX-512
kernels, while a wrong weight, key or layer moves a projection by far more than rounding does.
"""

from __future__ import annotations

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


PROJECTIONS = 4


def summary(tensor: torch.Tensor) -> dict[str, Any]:
    """Shape, L2 norm and ``PROJECTIONS`` dot products with fixed weights in [-8, 8], in float64.

    The weights come from ``torch.randint`` (integers: the same on every CPU) seeded by position.
    """
    flat = tensor.detach().reshape(-1).to(torch.float64)
    projections = []
    for k in range(PROJECTIONS):
        g = torch.Generator().manual_seed(k)
        weights = torch.randint(-8, 9, (flat.numel(),), generator=g).to(torch.float64)
        projections.append(float(flat @ weights))
    return {"shape": list(tensor.shape), "l2": float(flat.norm()), "proj": projections}


def fingerprint(spec: Any, build: Any) -> dict[str, Any]:
    """Seeded build, then the state_dict keys, a summary of each tensor and of an eval forward."""
    torch.manual_seed(0)
    module = build(spec).eval()
    state = module.state_dict()
    with torch.no_grad():
        out = module(*_inputs(spec["_target_"], module))
    out = out[0] if isinstance(out, tuple) else out
    return {"keys": list(state), "state": {k: summary(v) for k, v in state.items()},
            "out": summary(out)}


def mismatches(got: dict[str, Any], want: dict[str, Any], rel: float = 1e-5) -> list[str]:
    """What differs beyond float rounding: keys, shapes, or a projection off by more than
    ``rel`` x (its L2 norm x the weights' L2 norm), the bound of a relative ``rel`` per element."""
    if got["keys"] != want["keys"]:
        return [f"keys {got['keys']} != {want['keys']}"]
    pairs = [(f"state {k}", got["state"][k], want["state"][k]) for k in want["keys"]]
    pairs.append(("forward", got["out"], want["out"]))
    wrong = []
    for name, a, b in pairs:
        if a["shape"] != b["shape"]:
            wrong.append(f"{name}: shape {a['shape']} != {b['shape']}")
            continue
        weights_l2 = 8 * torch.Size(a["shape"]).numel() ** 0.5
        tolerance = rel * max(a["l2"], b["l2"]) * weights_l2 + 1e-12
        for k, (x, y) in enumerate(zip(a["proj"], b["proj"])):
            if abs(x - y) > tolerance:
                wrong.append(f"{name}: projection {k} {x!r} != {y!r} (tolerance {tolerance:.3g})")
    return wrong


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
