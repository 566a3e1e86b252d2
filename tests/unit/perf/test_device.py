"""CPU flags, the bf16 warning and the SDPA kernel probe of the attention core."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from mmtf.decoders import TextDecoder
from mmtf.encoders import AudioEncoder
from mmtf.perf.device import bf16_warning, cpu_flags, sdpa_backends
from tests.unit.presets import flat

AVX2_ONLY = {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}
AVX512_BF16 = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": False}


def test_cpu_flags_from_a_cpuinfo_file(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu sse avx2 avx512f amx_bf16\n")
    assert cpu_flags(info) == {"avx2": True, "avx512f": True, "avx512_bf16": False,
                               "amx_bf16": True}
    assert cpu_flags(tmp_path / "missing") is None


def test_bf16_warning_only_for_bf16_on_a_cpu_without_native_bf16():
    message = bf16_warning("bf16-mixed", "cpu", AVX2_ONLY)
    assert message is not None
    assert "trainer.precision=bf16-mixed" in message and "avx512_bf16" in message
    assert "32-true" in message                                    # the fix
    assert bf16_warning("bf16-mixed", "cpu", AVX512_BF16) is None
    assert bf16_warning("32-true", "cpu", AVX2_ONLY) is None
    assert bf16_warning("bf16-mixed", "cuda", AVX2_ONLY) is None
    assert bf16_warning("bf16-mixed", "cpu", {**AVX2_ONLY, "amx_bf16": True}) is None


@pytest.fixture(scope="module")
def captioner() -> nn.Module:
    return nn.ModuleList([flat(AudioEncoder, dim=32, depth=1, num_heads=4, n_mels=16),
                          flat(TextDecoder, vocab_size=50, dim=32, depth=1, num_heads=4,
                                      context_dim=32)])


def test_sdpa_probe_reports_the_fused_cpu_kernel_and_the_math_fallback(captioner):
    roles = ("causal self-attention", "padded self-attention", "cross-attention")
    assert sdpa_backends(captioner, "cpu", torch.float32) == dict.fromkeys(roles, "flash (cpu)")
    with sdpa_kernel([SDPBackend.MATH]):                           # control: the probe can see it
        assert sdpa_backends(captioner, "cpu", torch.float32) == dict.fromkeys(roles, "math")


def test_sdpa_probe_lists_only_the_roles_a_model_has():
    encoder = flat(AudioEncoder, dim=32, depth=1, num_heads=4, n_mels=16)
    assert list(sdpa_backends(encoder, "cpu", torch.float32)) == ["padded self-attention"]


def test_quantity_table_pads_keys_to_the_longest():
    from mmtf.perf.device import quantity_table

    assert quantity_table([("a", "1"), ("longer key", "x y")]) == (
        "| quantity   | value |\n"
        "|------------|-------|\n"
        "| a          | 1 |\n"
        "| longer key | x y |")


def test_median_call_ms_drops_the_warm_up_call(monkeypatch):
    from mmtf.perf import device

    # A clock that advances by each call's duration: warm-up 100 ms, then 1, 3, 2 ms.
    durations = iter([0.100, 0.001, 0.003, 0.002])
    now = [0.0]

    def call() -> None:
        now[0] += next(durations)

    monkeypatch.setattr(device.time, "perf_counter", lambda: now[0])
    assert device.median_call_ms(call, calls=3) == pytest.approx(2.0)
