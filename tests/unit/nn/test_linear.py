"""mmtf.nn.linear: the oneDNN-packed weight computes F.linear's output (against a float64
reference), runs only inside packed_linear_weights and only where it cannot be stale or change
what is computed (a weight changed in place, autograd recording, autocast, another dtype); which
dtypes pack follows the CPU (both branches faked on every machine); generate() packs the
decoder's layers (never the encoder's) for its steps and releases them afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmtf.nn.linear import Linear, pack_linear_weights, packed_linear_weights
from mmtf.utils.compat import dispatched_ops, onednn_bf16_supported, onednn_linear_available

pytestmark = pytest.mark.skipif(not onednn_linear_available(),
                                reason="torch built without oneDNN: Linear is nn.Linear")

PACKED_OP = "_linear_pointwise"


def ran_packed(fn) -> bool:
    """Whether ``fn()`` reached oneDNN's packed inner product (and no MKL GEMM)."""
    ops = dispatched_ops(fn)
    packed = PACKED_OP in ops
    assert not (packed and {"addmm", "mm", "linear"} & set(ops)), ops
    return packed


def reference(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    bias = None if layer.bias is None else layer.bias.double()
    return F.linear(x.double(), layer.weight.double(), bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (8, 24), (3, 5, 24), (37, 24)])
def test_packed_output_is_the_linear_map(shape, bias):
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode(), packed_linear_weights(layer, rows=8) as count:
        assert count == 1
        assert ran_packed(lambda: layer(x))
        out = layer(x)
    assert out.shape == (*shape[:-1], 40)
    torch.testing.assert_close(out.double(), reference(layer, x), atol=1e-5, rtol=1e-5)


def _fake_onednn(monkeypatch) -> list[str]:
    """Stand oneDNN's two ops in with F.linear (a pack is the weight itself); the ops called."""
    import mmtf.nn.linear as linear

    calls: list[str] = []

    def pack(weight, rows):
        calls.append("pack")
        return weight.detach().clone()

    def run(x, packed, bias):
        calls.append("linear")
        return F.linear(x, packed, bias)

    monkeypatch.setattr(linear, "onednn_pack_linear_weight", pack)
    monkeypatch.setattr(linear, "onednn_linear", run)
    return calls


@pytest.mark.parametrize("capable", [True, False], ids=["bf16-cpu", "no-bf16-cpu"])
def test_bfloat16_weights_pack_where_the_cpu_can(monkeypatch, capable):
    """Both branches of can_pack on every machine: the capability is faked, and where the real
    CPU lacks it (AVX2-only) oneDNN's ops are faked too, since it would refuse the weight."""
    import mmtf.nn.linear as linear

    torch.manual_seed(0)
    layer = Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(8, 64).to(torch.bfloat16)
    monkeypatch.setattr(linear, "can_pack", lambda dtype: capable)
    real = capable and onednn_bf16_supported()
    calls = [] if real or not capable else _fake_onednn(monkeypatch)
    with torch.no_grad(), packed_linear_weights(layer, rows=8) as count:
        assert count == int(capable)
        if real:
            assert ran_packed(lambda: layer(x))
        out = layer(x)
    if capable and not real:
        assert calls == ["pack", "linear"]
    if not capable:
        assert layer.packed_weight is None and not ran_packed(lambda: layer(x))
        assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    # bf16 inputs and weights, fp32 accumulation, one bf16 rounding of the output.
    torch.testing.assert_close(out.double(), reference(layer, x), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_can_pack_agrees_with_onednn(dtype):
    """The capability check against oneDNN itself: it packs exactly the dtypes it accepts here
    (on an AVX2-only CPU, or under ONEDNN_MAX_CPU_ISA=AVX2, bf16 is refused)."""
    from mmtf.nn.linear import can_pack
    from mmtf.utils.compat import onednn_pack_linear_weight

    try:
        onednn_pack_linear_weight(torch.randn(8, 16).to(dtype), 4)
        accepted = True
    except RuntimeError:
        accepted = False
    if dtype in (torch.float32, torch.bfloat16):
        assert can_pack(dtype) == accepted
    else:
        assert not can_pack(dtype)                  # never packed, whatever oneDNN would do


def test_outside_the_block_nothing_is_attached_and_mkl_runs():
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        with packed_linear_weights(layer, rows=4):
            assert layer.packed_weight is not None
        assert layer.packed_weight is None
        assert not ran_packed(lambda: layer(x))


def test_a_weight_changed_in_place_is_never_read_stale():
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad(), packed_linear_weights(layer, rows=4):
        layer.weight.mul_(-2.0)                       # what an optimizer step does
        assert not ran_packed(lambda: layer(x))       # the copy no longer matches
        torch.testing.assert_close(layer(x).double(), reference(layer, x), atol=1e-5, rtol=1e-5)
        layer.weight = nn.Parameter(torch.randn(8, 16))     # a new tensor: a new address
        assert not ran_packed(lambda: layer(x))
        torch.testing.assert_close(layer(x).double(), reference(layer, x), atol=1e-5, rtol=1e-5)


def test_recording_autograd_uses_the_weight_and_gets_gradients():
    layer = Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with packed_linear_weights(layer, rows=4):
        assert not ran_packed(lambda: layer(x))
        layer(x).sum().backward()
    assert layer.weight.grad is not None and x.grad is not None


def test_autocast_and_other_dtypes_keep_their_own_path():
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad(), packed_linear_weights(layer, rows=4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not ran_packed(lambda: layer(x))
            assert layer(x).dtype == torch.bfloat16   # autocast's cast, as without packing
        with pytest.raises(RuntimeError, match="dtype"):
            layer(x.double())                         # nn.Linear's own error, not a cast
        assert ran_packed(lambda: layer(x))           # the control: fp32 runs packed
    half, wide = Linear(16, 8).half(), Linear(16, 8).double()
    with packed_linear_weights(nn.Sequential(half, wide), rows=4) as count:
        assert count == 0                             # float16 and float64 stay on F.linear
    with packed_linear_weights(nn.Linear(16, 8), rows=4) as count:
        assert count == 0                             # a plain nn.Linear is left alone


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_given_copies_are_attached_as_they_are_and_never_read_stale():
    """The compiled step's way: the same copy objects every block (its graph guards on them)."""
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    packs = pack_linear_weights(layer, rows=4)
    copy = packs[layer][0]
    with torch.no_grad():
        for _ in range(2):
            with packed_linear_weights(layer, rows=4, packs=packs) as count:
                assert count == 1 and layer.packed_weight is copy
                assert ran_packed(lambda: layer(x))
                with torch.backends.mkldnn.flags(enabled=False):
                    assert not ran_packed(lambda: layer(x))   # the user switched oneDNN off
            assert layer.packed_weight is None
        layer.weight.add_(1.0)                        # changed weight: the copy is stale
        with packed_linear_weights(layer, rows=4, packs=packs):
            assert not ran_packed(lambda: layer(x))
            torch.testing.assert_close(layer(x).double(), reference(layer, x), atol=1e-5,
                                       rtol=1e-5)
        with torch.backends.mkldnn.flags(enabled=False):
            assert pack_linear_weights(layer, rows=4) == {}


# mkldnn.flags() also sets oneDNN's TF32 switch, which warns on a build without Intel GPUs.
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_generate_packs_the_decoder_only_and_matches_the_unpacked_decode():
    from tests.unit.decoders.conftest import IN_DIM, make_model

    model = make_model(3)
    old = model.encoder.proj                          # the stub's per-frame nn.Linear
    model.encoder.proj = Linear(old.in_features, old.out_features)
    model.encoder.proj.load_state_dict(old.state_dict())
    encoder_packed: list[bool] = []
    model.encoder.proj.register_forward_hook(
        lambda layer, args, out: encoder_packed.append(layer.packed_weight is not None))
    x, lengths = torch.randn(3, 7, IN_DIM), torch.tensor([7, 4, 2])
    seen: list[bool] = []

    def record(step, tokens, logits) -> None:
        seen.append(all(m.packed_weight is not None for m in model.decoder.modules()
                        if isinstance(m, Linear)))

    options = dict(max_new_tokens=10, min_new_tokens=10)
    packed = model.generate(x, lengths, callback=record, **options)
    assert seen and all(seen)                         # every step ran with the copies
    assert encoder_packed == [False]                  # the encoder's one pass: F.linear
    assert all(m.packed_weight is None for m in model.modules() if isinstance(m, Linear))
    seen.clear()
    plain = model.generate(x, lengths, callback=record, pack_weights=False, **options)
    assert seen and not any(seen)                     # the switch
    with torch.backends.mkldnn.flags(enabled=False):  # torch's own switch too
        assert torch.equal(model.generate(x, lengths, **options).tokens, plain.tokens)
    assert torch.equal(packed.tokens, plain.tokens)
    torch.testing.assert_close(packed.scores, plain.scores, atol=1e-5, rtol=1e-5)


class _Subclass(torch.Tensor):
    """Stands in for FSDP's DTensor: a tensor subclass whose storage is not the whole weight."""


def test_tensor_subclass_weights_are_not_packed():
    layer = Linear(16, 8)
    layer.weight = nn.Parameter(torch.randn(8, 16).as_subclass(_Subclass))
    with torch.no_grad(), packed_linear_weights(layer, rows=4) as count:
        assert count == 0 and layer.packed_weight is None


def test_a_layer_holding_a_copy_deepcopies_and_pickles_without_it():
    import copy
    import io

    layer = Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.no_grad(), packed_linear_weights(layer, rows=2):
        attached = layer.packed_weight
        twin = copy.deepcopy(nn.Sequential(layer))[0]       # what the EMA callback does
        buffer = io.BytesIO()
        torch.save(layer, buffer)
        assert layer.packed_weight is attached              # the original keeps its copy
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)         # the test's own file
    for other in (twin, loaded):
        assert other.packed_weight is None
        torch.testing.assert_close(other(x), layer(x))
        with torch.no_grad(), packed_linear_weights(other, rows=2) as count:
            assert count == 1 and ran_packed(lambda o=other: o(x))


def test_a_copy_made_before_the_layer_moved_to_another_dtype_is_not_read():
    layer = Linear(8, 4)
    packs = pack_linear_weights(layer, rows=2)
    layer.double()                                      # the copy stays fp32 and stale
    x = torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad():
        with packed_linear_weights(layer, rows=2) as count:
            assert count == 0 and layer.packed_weight is None
        with packed_linear_weights(layer, rows=2, packs=packs):
            torch.testing.assert_close(layer(x), reference(layer, x))
