"""On CUDA the attention core runs a fused SDPA kernel for every role, never only the math one.

Runs only where CUDA is present (``-m gpu``; ``experiments/gpu_check/run.sh`` runs it). Inside
``sdpa_kernel([FLASH, EFFICIENT, CUDNN])`` torch raises when none of the fused kernels accepts
the call, so a shape, mask or dtype that silently falls back to the math kernel fails here.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mmtf.nn import Attention
from mmtf.perf.device import sdpa_backends
from tests.unit.presets import flat

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
B, N, M, DIM, HEADS = 4, 96, 250, 256, 4          # head_dim 64; odd key length 250


def _role(role: str) -> tuple[Attention, dict]:
    x = torch.randn(B, N, DIM, device="cuda", requires_grad=True)
    key_mask = torch.ones(B, M if role == "cross" else N, dtype=torch.bool, device="cuda")
    key_mask[1::2, key_mask.shape[1] // 2:] = False          # padded rows
    if role == "causal":
        return Attention(dim=DIM, num_heads=HEADS, causal=True), {"x": x}
    if role == "padded":
        return Attention(dim=DIM, num_heads=HEADS), {"x": x, "key_mask": key_mask}
    context = torch.randn(B, M, 128, device="cuda", requires_grad=True)
    return (Attention(dim=DIM, num_heads=HEADS, kv_dim=128),
            {"x": x, "context": context, "key_mask": key_mask})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("role", ["causal", "padded", "cross"])
def test_fused_kernel_runs_forward_and_backward(role, dtype):
    layer, inputs = _role(role)
    layer = layer.cuda().train()
    x = inputs.pop("x")
    with sdpa_kernel(FUSED), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        out = layer(x, **inputs)
    out.float().square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_probe_reports_no_math_kernel_on_cuda():
    model = torch.nn.ModuleList(_role(r)[0] for r in ("causal", "padded", "cross"))
    kernels = sdpa_backends(model, "cuda", torch.bfloat16, batch=B, length=N)
    assert len(kernels) == 3
    assert "math" not in kernels.values(), kernels


def test_log_mel_front_end_runs_on_the_gpu_inside_the_model():
    from mmtf.encoders import AudioEncoder
    encoder = flat(AudioEncoder, dim=64, depth=1, num_heads=4, n_mels=16).cuda().train()
    assert encoder.frontend.mel.mel_scale.fb.is_cuda                 # filterbank moved with it
    wave = torch.randn(2, 16000, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        feats, frames = encoder.frontend(wave, torch.tensor([16000, 8000], device="cuda"))
        out = encoder(wave, torch.tensor([16000, 8000], device="cuda"))
    assert feats.is_cuda and feats.dtype == torch.float32             # STFT kept in fp32
    assert out.memory.is_cuda and out.mask.is_cuda
