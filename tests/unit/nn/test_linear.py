"""mmtf.nn.linear: the oneDNN-packed weight computes F.linear's output (against a float64
reference), runs only inside packed_linear_weights and only where it cannot be stale or change
what is computed (a weight changed in place, autograd recording, autocast, another dtype), and
generate() packs the decoder's layers for its steps and releases them afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmtf.nn.linear import Linear, packed_linear_weights
from mmtf.utils.compat import dispatched_ops, onednn_linear_available

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


def test_bfloat16_weights_pack_too():
    torch.manual_seed(0)
    layer = Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(8, 64).to(torch.bfloat16)
    with torch.no_grad(), packed_linear_weights(layer, rows=8) as count:
        assert count == 1 and ran_packed(lambda: layer(x))
        out = layer(x)
    # bf16 inputs and weights, fp32 accumulation, one bf16 rounding of the output.
    torch.testing.assert_close(out.double(), reference(layer, x), atol=0.05, rtol=0.02)


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
def test_keep_leaves_the_copies_and_a_later_block_does_not_drop_them():
    layer = Linear(16, 8)
    with torch.no_grad():
        with packed_linear_weights(layer, rows=4, keep=True):
            kept = layer.packed_weight
        assert layer.packed_weight is kept            # the compiled step's constant
        with packed_linear_weights(layer, rows=4):
            assert layer.packed_weight is kept        # same weight: not packed again
        assert layer.packed_weight is kept            # attached before the block: stays
        x = torch.randn(4, 16)
        assert ran_packed(lambda: layer(x))           # kept copies serve later calls
        with torch.backends.mkldnn.flags(enabled=False):
            assert not ran_packed(lambda: layer(x))   # unless the user switched oneDNN off
        layer.weight.add_(1.0)
        with packed_linear_weights(layer, rows=4):
            assert layer.packed_weight is not kept    # changed weight: packed again
        layer.release()
        assert layer.packed_weight is None
        # A compiled step inside an enclosing block (Whisper's long-form loop) keeps its copies.
        with (packed_linear_weights(layer, rows=4),
              packed_linear_weights(layer, rows=4, keep=True)):
            kept = layer.packed_weight
        assert layer.packed_weight is kept
        layer.release()
        with packed_linear_weights(layer, rows=4):
            with packed_linear_weights(layer, rows=4):
                pass
            assert layer.packed_weight is not None    # the inner block did not attach it
        assert layer.packed_weight is None


# mkldnn.flags() also sets oneDNN's TF32 switch, which warns on a build without Intel GPUs.
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_generate_packs_the_decoder_and_matches_the_unpacked_decode():
    from tests.unit.decoders.conftest import IN_DIM, make_model

    model = make_model(3)
    x, lengths = torch.randn(3, 7, IN_DIM), torch.tensor([7, 4, 2])
    seen: list[bool] = []

    def record(step, tokens, logits) -> None:
        seen.append(all(m.packed_weight is not None for m in model.decoder.modules()
                        if isinstance(m, Linear)))

    packed = model.generate(x, lengths, max_new_tokens=10, min_new_tokens=10, callback=record)
    assert seen and all(seen)                         # every step ran with the copies
    assert all(m.packed_weight is None for m in model.modules() if isinstance(m, Linear))
    with torch.backends.mkldnn.flags(enabled=False):  # the user's switch turns packing off
        plain = model.generate(x, lengths, max_new_tokens=10, min_new_tokens=10)
    assert torch.equal(packed.tokens, plain.tokens)
    torch.testing.assert_close(packed.scores, plain.scores, atol=1e-5, rtol=1e-5)


class _Subclass(torch.Tensor):
    """Stands in for FSDP's DTensor: a tensor subclass whose storage is not the whole weight."""


def test_tensor_subclass_weights_are_not_packed():
    layer = Linear(16, 8)
    layer.weight = nn.Parameter(torch.randn(8, 16).as_subclass(_Subclass))
    with torch.no_grad(), packed_linear_weights(layer, rows=4) as count:
        assert count == 0 and layer.packed_weight is None


def test_a_refused_weight_runs_f_linear_and_says_so_once(monkeypatch, caplog):
    import mmtf.nn.linear as linear

    def refuse(weight, rows):
        raise RuntimeError("Sharding propagation failed for mkldnn._reorder_linear_weight")

    monkeypatch.setattr(linear, "onednn_pack_linear_weight", refuse)
    monkeypatch.setattr(linear, "_logged_unpackable", False)
    layers = nn.Sequential(Linear(16, 8), Linear(8, 4))
    x = torch.randn(3, 16)
    with (caplog.at_level("INFO", logger="mmtf.nn.linear"), torch.no_grad(),
          packed_linear_weights(layers, rows=3) as count):
        assert count == 0
        assert not ran_packed(lambda: layers(x))
        hidden = F.linear(x, layers[0].weight, layers[0].bias)
        torch.testing.assert_close(layers(x), F.linear(hidden, layers[1].weight, layers[1].bias))
    messages = [r.getMessage() for r in caplog.records if "could not be packed" in r.getMessage()]
    assert len(messages) == 1 and "Sharding propagation failed" in messages[0]


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_encoder_decoder_generate_packs_the_encoder_for_its_one_pass():
    from tests.unit.decoders.conftest import IN_DIM, make_model

    model = make_model(4)
    old = model.encoder.proj                          # the stub's per-frame nn.Linear
    model.encoder.proj = Linear(old.in_features, old.out_features)
    model.encoder.proj.load_state_dict(old.state_dict())
    seen: list[bool] = []
    model.encoder.proj.register_forward_hook(
        lambda layer, args, out: seen.append(layer.packed_weight is not None))
    x, lengths = torch.randn(2, 5, IN_DIM), torch.tensor([5, 3])
    packed = model.generate(x, lengths, max_new_tokens=6, min_new_tokens=6)
    assert seen == [True] and model.encoder.proj.packed_weight is None
    with torch.backends.mkldnn.flags(enabled=False):
        plain = model.generate(x, lengths, max_new_tokens=6, min_new_tokens=6)
    assert seen == [True, False]
    assert torch.equal(packed.tokens, plain.tokens)


def test_a_layer_holding_a_kept_copy_deepcopies_and_pickles_without_it():
    import copy
    import io

    layer = Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.no_grad(), packed_linear_weights(layer, rows=2, keep=True):
        pass
    kept = layer.packed_weight
    twin = copy.deepcopy(nn.Sequential(layer))[0]       # what the EMA callback does
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)     # the test's own file
    assert layer.packed_weight is kept                  # the original keeps its copy
    for other in (twin, loaded):
        assert other.packed_weight is None and not other._keep_packed
        torch.testing.assert_close(other(x), layer(x))
        with torch.no_grad(), packed_linear_weights(other, rows=2) as count:
            assert count == 1 and ran_packed(lambda o=other: o(x))


def test_a_kept_copy_is_dropped_when_the_layer_moves_to_an_unpackable_dtype():
    layer = Linear(8, 4)
    with torch.no_grad(), packed_linear_weights(layer, rows=2, keep=True):
        pass
    layer.double()                                      # the copy stays fp32 and stale
    x = torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad(), packed_linear_weights(layer, rows=2) as count:
        assert count == 0 and layer.packed_weight is None
        torch.testing.assert_close(layer(x), reference(layer, x))
