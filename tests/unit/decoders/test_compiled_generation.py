"""generate(compile=True): the compiled decode step gives the eager step's tokens and scores
(greedy over a padded memory, beam search, grouped-query heads), compiles once for every
position, batch size and memory length, compiles again after a weight change, and explains a
missing toolchain. The single-query attention it uses is checked against SDPA."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import traceback
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from mmtf.decoders import GenerationConfig
from mmtf.decoders.compiled import compiled_decode_step
from mmtf.errors import UserError
from mmtf.nn.attention import single_query_attention
from mmtf.nn.linear import Linear
from mmtf.utils.compat import onednn_linear_available
from tests.unit.decoders.conftest import IN_DIM, make_model

needs_cxx = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="torch.compile on CPU needs a C++ compiler")


def graphs_compiled() -> int:
    return counters["stats"]["unique_graphs"]


def run_spawned(cases: dict[str, Callable[[], None]]) -> dict[str, str]:
    """Run the module-level functions ``cases`` one after the other in ONE spawned interpreter;
    {name: its traceback, "" when it passed}.

    Not in the pytest worker: once inductor has compiled anything in a process, its next
    backward pass starts autograd's device threads, after which forked children cannot run
    autograd ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"), and the reliability tests train in the worker and then in forked
    children. Not in a forked child either: compiled OpenMP kernels hang in a child forked from
    a process whose OpenMP pool is running. One interpreter for all cases (an interpreter start
    and torch's import cost seconds each): ``torch._dynamo.reset()`` between cases gives each
    the compile caches of a fresh process.
    """
    context = mp.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    proc = context.Process(target=_run_cases, args=(cases, writer))
    proc.start()
    writer.close()                            # the child's end alone: a crash reads as EOF
    timeout = 600 * len(cases)
    try:
        results = (reader.recv() if reader.poll(timeout)
                   else dict.fromkeys(cases, f"the child sent nothing in {timeout} s"))
    except EOFError:
        results = None
    proc.join(60)
    return results or dict.fromkeys(cases, f"the child died (exit code {proc.exitcode})")


def _run_cases(cases: dict[str, Callable[[], None]], writer) -> None:
    torch.set_num_threads(1)                  # it shares the 2 cores with the other worker
    results = {}
    for name, case in cases.items():
        torch._dynamo.reset()
        try:
            case()
            results[name] = ""
        except BaseException:
            results[name] = traceback.format_exc()
    writer.send(results)


def _check(results: dict[str, str], name: str) -> None:
    if results[name]:
        pytest.fail(f"{name}, in the spawned process:\n{results[name]}", pytrace=False)


@pytest.fixture(scope="module")
def compiled_results() -> dict[str, str]:
    """Every compiled case of this module, run once. The missing-compiler case first: it must
    not find a kernel that an earlier case compiled."""
    from tests.unit.decoders.test_prompt import compiled_prompt_case

    return run_spawned({"missing_compiler": _missing_compiler_case,
                        "greedy_and_beam": _greedy_and_beam_case,
                        "weight_change": _weight_change_case,
                        "lora": _lora_case,
                        "alternating": _alternating_case,
                        "prompt": compiled_prompt_case})


# The greedy case's model, compiled once: the weight-change case changes its weights (a model of
# its own would cost one more compilation, ~15 s on one CPU core).
_GREEDY_MODEL: list = []


def _greedy_and_beam_case() -> None:
    gqa_model = make_model(3, depth=1, num_kv_heads=2)     # depth 2: the prompt case's model
    _GREEDY_MODEL.append(gqa_model)
    # Sizes chosen apart from the model's (head_dim 8, dim 32): the compiler gives equal sizes
    # one symbol ("duck sizing"), so a memory of 7 (+1 spare = 8 = head_dim) would be
    # specialised and a later memory length would compile again.
    batch = torch.randn(3, 10, IN_DIM), torch.tensor([10, 6, 2])
    eager = gqa_model.generate(*batch, max_new_tokens=12, min_new_tokens=12)
    before = graphs_compiled()
    compiled = gqa_model.generate(*batch, max_new_tokens=12, min_new_tokens=12, compile=True)
    assert graphs_compiled() - before == 1                  # 10 compiled positions, one graph
    # Its linear layers ran oneDNN-packed copies, which the step owns as constants of its graph
    # (inductor lowers the packed op only for a constant weight, so this compiles only with
    # freezing on); generate attached them for the call only.
    layers = [m for m in gqa_model.decoder.modules() if isinstance(m, Linear)]
    assert (set(compiled_decode_step(gqa_model.decoder).packs) == set(layers)
            or not onednn_linear_available())
    assert all(m.packed_weight is None for m in layers)
    assert torch.equal(compiled.tokens, eager.tokens)
    assert torch.equal(compiled.lengths, eager.lengths)
    torch.testing.assert_close(compiled.scores, eager.scores, atol=1e-5, rtol=1e-5)

    # Beam search: other rows (batch 2 x 3 beams), another memory length, reordered caches;
    # the dynamic-shape graph serves it without compiling again.
    x, lengths = torch.randn(2, 5, IN_DIM), torch.tensor([5, 3])
    options = dict(strategy="beam", num_beams=3, num_return_sequences=2, max_new_tokens=9)
    eager_beam = gqa_model.generate(x, lengths, **options)
    before = graphs_compiled()
    compiled_beam = gqa_model.generate(x, lengths, compile=True, **options)
    assert graphs_compiled() == before
    assert torch.equal(compiled_beam.tokens, eager_beam.tokens)
    torch.testing.assert_close(compiled_beam.scores, eager_beam.scores, atol=1e-5, rtol=1e-5)

    # The repeat penalties act on the logits in the shared loop: the compiled step obeys them.
    penalties = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, max_new_tokens=12)
    eager_p = gqa_model.generate(*batch, **penalties)
    compiled_p = gqa_model.generate(*batch, compile=True, **penalties)
    assert torch.equal(compiled_p.tokens, eager_p.tokens)


@pytest.mark.slow
@pytest.mark.timeout(1200)      # the first of these runs every case (the fixture)
@needs_cxx
def test_compiled_greedy_equals_eager_and_compiles_once(compiled_results):
    _check(compiled_results, "greedy_and_beam")


def _weight_change_case() -> None:
    """The greedy case's model, compiled there once: an in-place change of its weights compiles
    the step again, and the new step decodes with the new weights."""
    if not _GREEDY_MODEL:
        raise RuntimeError("the greedy case did not run first: it builds this case's model")
    model = _GREEDY_MODEL[0]
    x, lengths = torch.randn(2, 6, IN_DIM), torch.tensor([6, 4])
    options = dict(max_new_tokens=8, min_new_tokens=8)
    first = model.generate(x, lengths, **options)     # eager, before the change
    assert compiled_decode_step(model.decoder).compilations == 1
    with torch.no_grad():                       # what an optimizer step does: in place
        torch.manual_seed(0)
        model.decoder.embed.weight.add_(torch.randn_like(model.decoder.embed.weight))
    eager_after = model.generate(x, lengths, **options)
    assert not torch.equal(eager_after.tokens, first.tokens)  # stale weights would show
    after = model.generate(x, lengths, compile=True, **options)
    assert torch.equal(after.tokens, eager_after.tokens)
    torch.testing.assert_close(after.scores, eager_after.scores, atol=1e-5, rtol=1e-5)
    assert compiled_decode_step(model.decoder).compilations == 2


@pytest.mark.slow
@pytest.mark.timeout(1200)
@needs_cxx
def test_weight_change_compiles_again(compiled_results):
    _check(compiled_results, "weight_change")


def _alternating_case() -> None:
    """Compiled, eager, and unpacked eager calls (packing switched off, which once dropped the
    copies the step's graph guards on by identity) alternate 12 times: one compilation. Before
    the step owned its copies, every compiled call after such an eager one compiled again and
    the 9th hit dynamo's recompile limit (FailOnRecompileLimitHit under fullgraph)."""
    model = make_model(7, depth=1)
    x, lengths = torch.randn(2, 5, IN_DIM), torch.tensor([5, 3])
    options = dict(max_new_tokens=6, min_new_tokens=6)
    before = graphs_compiled()
    for _ in range(12):
        compiled = model.generate(x, lengths, compile=True, **options)
        eager = model.generate(x, lengths, **options)
        unpacked = model.generate(x, lengths, pack_weights=False, **options)
        with torch.backends.mkldnn.flags(enabled=False):
            model.generate(x, lengths, **options)
        assert torch.equal(compiled.tokens, eager.tokens)
        assert torch.equal(unpacked.tokens, eager.tokens)
    assert graphs_compiled() - before == 1
    assert compiled_decode_step(model.decoder).compilations == 1


@pytest.mark.slow
@pytest.mark.timeout(1200)
@needs_cxx
def test_alternating_compiled_and_eager_calls_compile_once(compiled_results):
    _check(compiled_results, "alternating")


def _lora_case() -> None:
    """LoRA adapters (unmerged: the k slice of the fused to_kv alone, q and the MLP) compile
    into the decode step and give the eager tokens; merged, the eager tokens again."""
    from mmtf.nn.lora import LoRAConfig, add_lora, lora_layers, merge_lora

    model = make_model(6, depth=1)
    add_lora(model.decoder, LoRAConfig(r=2, alpha=4, targets=("q", "k", "mlp")))
    with torch.no_grad():
        for layer in lora_layers(model.decoder).values():
            for b in layer.lora_B.values():
                b.normal_(0.0, 0.5)
    x, lengths = torch.randn(2, 6, IN_DIM), torch.tensor([6, 4])
    options = dict(max_new_tokens=8, min_new_tokens=8)
    eager = model.generate(x, lengths, **options)
    compiled = model.generate(x, lengths, compile=True, **options)
    assert torch.equal(compiled.tokens, eager.tokens)
    torch.testing.assert_close(compiled.scores, eager.scores, atol=1e-5, rtol=1e-5)
    merge_lora(model.decoder)
    assert torch.equal(model.generate(x, lengths, **options).tokens, eager.tokens)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@needs_cxx
def test_compiled_generation_with_lora_equals_eager(compiled_results):
    _check(compiled_results, "lora")


def _missing_compiler_case() -> None:
    import torch._inductor.config as inductor_config

    model = make_model(5, depth=1)
    x, lengths = torch.randn(1, 4, IN_DIM), torch.tensor([4])
    no_compiler = inductor_config.patch({"fx_graph_cache": False,
                                         "cpp.cxx": (None, "no-such-cxx")})
    before = graphs_compiled()
    with no_compiler, pytest.raises(RuntimeError, match=r"C\+\+ compiler .* compile=False"):
        model.generate(x, lengths, max_new_tokens=4, compile=True)
    assert graphs_compiled() == before      # told before tracing, not after ~20 s of it


@pytest.mark.slow
@pytest.mark.timeout(1200)
@needs_cxx
def test_missing_compiler_is_explained(compiled_results):
    _check(compiled_results, "missing_compiler")


@pytest.mark.slow
@pytest.mark.timeout(1200)
@needs_cxx
def test_compiled_generation_with_a_prompt_equals_eager(compiled_results):
    """The case lives beside the prompt tests (tests/unit/decoders/test_prompt.py)."""
    _check(compiled_results, "prompt")


def test_a_failing_kernel_build_is_explained_too():
    """A compiler that is found but fails while building (inductor's error from inside the
    compiled call, past the up-front check) gets the same explanation. In the worker: the
    compiled function is replaced by one that raises, so nothing is compiled."""
    from torch._inductor.exc import CppCompileError

    model = make_model(5, depth=1)
    step = compiled_decode_step(model.decoder)

    def failing_build(*args, **kwargs):
        raise CppCompileError(["g++", "kernel.cpp"], "kernel.cpp:1: error: boom")

    step._fn, step._toolchain_checked = failing_build, True
    x, lengths = torch.randn(1, 4, IN_DIM), torch.tensor([4])
    with pytest.raises(RuntimeError, match=r"could not build the decode step \(CppCompileError"
                                           r".*C\+\+ compiler .* compile=False") as raised:
        model.generate(x, lengths, max_new_tokens=4, compile=True)
    assert isinstance(raised.value.__cause__, CppCompileError)


def test_compile_needs_the_cache():
    with pytest.raises(UserError, match=r"compile=True needs use_cache=True"):
        GenerationConfig(compile=True, use_cache=False)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_single_query_attention_matches_sdpa(num_kv_heads):
    torch.manual_seed(0)
    q = torch.randn(3, 4, 1, 8, dtype=torch.float64)
    k, v = torch.randn(2, 3, num_kv_heads, 9, 8, dtype=torch.float64)
    key_mask = torch.ones(3, 9, dtype=torch.bool)
    key_mask[1, 5:] = False
    key_mask[2] = False                                     # no key at all: zeros
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=key_mask[:, None, None] | ~key_mask.any(-1)[:, None, None, None],
        enable_gqa=num_kv_heads != 4)
    ref[2] = 0.0
    got = single_query_attention(q, k, v, key_mask)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(single_query_attention(q, k, v),
                               F.scaled_dot_product_attention(q, k, v,
                                                              enable_gqa=num_kv_heads != 4))
