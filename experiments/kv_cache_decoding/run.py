"""KV-cache decoding benchmark: how fast does mmtf's TextDecoder generate on CPU?

Question: with the static KV cache, is greedy decoding (a) much faster than recomputing the
prefix, (b) faster than a Hugging Face peer doing the same work, (c) close to the memory
bandwidth limit, and (d) flat in per-token cost as the sequence grows?

Setup: a 6-layer decoder (dim 512, 8 heads, MLP 2048, vocab 8000) cross-attending to a random
encoder memory of 256 frames, batch 8, 128 greedy tokens, CPU, eval + inference_mode. Every run
is forced to exactly 128 tokens (``min_new_tokens = max_new_tokens``: eos is masked) so no run
stops early. Only the decode is timed (the memory is given; no encoder runs). Runs of the
different systems are interleaved and the medians taken, because the machine is shared.

mmtf runs three times per repeat: ``generate(..., compile=True)`` (the compiled decode step, the
headline against the peer; its one-off compilation is timed separately, before the repeats),
the eager step (``compile=False``), which is also what the uncached reference is compared with,
so that the cache speedup measures the cache alone, and the eager step with packing switched off
(``pack_weights=False``: ``F.linear`` on MKL, as the peers run, instead of the oneDNN-packed
weights of :mod:`mmtf.nn.linear`). The compiled step keeps its packed copies across these calls
and compiles once.

    python experiments/kv_cache_decoding/run.py            # full, ~4 min (9 repeats)
    python experiments/kv_cache_decoding/run.py --quick    # smoke run: 16 tokens, one repeat
    python experiments/kv_cache_decoding/run.py --dtype bfloat16   # both systems in bf16

Prints a table and, last, one JSON line:
{"cache_speedup": ..., "vs_peer_tokens_per_s": ..., "late_over_early_step": ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

from mmtf.decoders import GenerationConfig, TextDecoder, generate
from mmtf.perf.device import cpu_flags, describe_cpu, quantity_table
from mmtf.perf.results import append_result

BOS, EOS, PAD = 1, 2, 0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_mmtf(args: argparse.Namespace) -> TextDecoder:
    torch.manual_seed(0)
    return TextDecoder(vocab_size=args.vocab, dim=args.dim, depth=args.depth,
                       num_heads=args.heads, context_dim=args.dim, max_len=args.tokens,
                       block={"mlp_ratio": args.ffn / args.dim}).eval()


def run_mmtf(dec: TextDecoder, memory: torch.Tensor, tokens: int, use_cache: bool,
             compile: bool = False, pack: bool = True,
             ) -> tuple[float, list[float], torch.Tensor]:
    """Seconds for one generate call, the per-step times, and the tokens."""
    cfg = GenerationConfig(strategy="greedy", max_new_tokens=tokens, min_new_tokens=tokens,
                           use_cache=use_cache, compile=compile, pack_weights=pack)
    stamps: list[float] = []
    record: Callable = lambda t, tok, logits: stamps.append(time.perf_counter())  # noqa: E731
    with torch.inference_mode():
        start = time.perf_counter()
        out = generate(dec, memory, None, cfg, prompt_ids=[BOS], eos_id=EOS, pad_id=PAD,
                       callback=record)
        sync(memory.device)
        total = time.perf_counter() - start
    steps = [b - a for a, b in zip([start, *stamps[:-1]], stamps)]
    assert out.tokens.shape == (memory.shape[0], tokens)
    return total, steps, out.tokens


def build_peer(kind: str, args: argparse.Namespace):
    """A randomly initialised HF encoder-decoder with the same decoder dims (no download)."""
    import transformers as tf
    tf.logging.set_verbosity_error()             # length-setting notices on every generate call
    torch.manual_seed(0)
    common = dict(vocab_size=args.vocab, d_model=args.dim, decoder_layers=args.depth,
                  decoder_attention_heads=args.heads, decoder_ffn_dim=args.ffn,
                  encoder_layers=1, encoder_attention_heads=args.heads,
                  encoder_ffn_dim=args.ffn, pad_token_id=PAD, bos_token_id=BOS,
                  eos_token_id=EOS, decoder_start_token_id=BOS, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0)
    if kind == "whisper":
        cfg = tf.WhisperConfig(max_target_positions=max(448, args.tokens + 1),
                               max_source_positions=args.frames, begin_suppress_tokens=None,
                               suppress_tokens=None, **common)
        model = tf.WhisperForConditionalGeneration(cfg)
    else:
        cfg = tf.BartConfig(max_position_embeddings=max(512, args.tokens + 2),
                            forced_bos_token_id=None, forced_eos_token_id=None, **common)
        model = tf.BartForConditionalGeneration(cfg)
    model.generation_config = tf.GenerationConfig(
        decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        do_sample=False, num_beams=1, use_cache=True, max_new_tokens=args.tokens,
        min_new_tokens=args.tokens)
    return model.eval()


def run_peer(model, memory: torch.Tensor, tokens: int) -> float:
    from transformers.modeling_outputs import BaseModelOutput
    start_ids = torch.full((memory.shape[0], 1), BOS, dtype=torch.long, device=memory.device)
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=memory),
                             decoder_input_ids=start_ids, max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, num_beams=1,
                             use_cache=True)
        sync(memory.device)
        total = time.perf_counter() - start
    # Whisper's generate strips the start token, BART's keeps it.
    start_kept = model.config.model_type != "whisper"
    assert out.shape == (memory.shape[0], tokens + start_kept), out.shape
    return total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_bandwidth(device: torch.device, mib: int = 256, repeats: int = 5,
                     ) -> tuple[float, float]:
    """(copy, read) bandwidth in bytes/s, medians of repeats on a large tensor.

    Copy: ``dst.copy_(src)`` into a preallocated tensor (a fresh ``clone`` would also time
    page faults), counting bytes read plus bytes written. Read: ``src.sum()``.
    """
    src = torch.randn(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    copy, read = [], []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        copy.append(time.perf_counter() - start)
        start = time.perf_counter()
        src.sum()
        sync(device)
        read.append(time.perf_counter() - start)
    size = src.numel() * src.element_size()
    return 2 * size / statistics.median(copy), size / statistics.median(read)


def bytes_per_step(dec: TextDecoder, batch: int, frames: int, position: int) -> tuple[int, int]:
    """(weight bytes, K/V bytes) a decode step at ``position`` must read at least once.

    Weights: every parameter except the cross-attention K/V projections (applied once per
    generate call) and the embedding table (one row per token; with tied embeddings the LM
    head reads it whole and it is counted once). K/V: the self-attention cache up to and
    including the new position, and the cross-attention cache.
    """
    skip = {id(b.cross_attn.to_kv.weight) for b in dec.stack.blocks}
    params = {id(p): p for p in dec.parameters() if id(p) not in skip}
    if not dec.tie_embeddings:
        params.pop(id(dec.embed.weight))
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    stack = dec.stack
    itemsize = next(dec.parameters()).element_size()          # the cache has the model's dtype
    per_pos = 2 * batch * stack.num_kv_heads * stack.head_dim * itemsize * stack.depth  # K, V
    return weight_bytes, per_pos * (position + 1 + frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 tokens, 1 repeat, one peer")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers", default="bart,whisper")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="headline with generate(compile=True) (default, except with "
                             "--quick: compiling takes ~50 s, longer than the quick run)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="weights, memory and caches of both systems (bf16 uses AMX/AVX512 "
                             "where the CPU has it)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for experiments/gpu_check")
    args = parser.parse_args()
    args.batch, args.frames, args.dim, args.depth, args.heads = 8, 256, 512, 6, 8
    args.ffn, args.vocab, args.tokens = 2048, 8000, 128
    if args.quick:
        args.tokens, args.repeats, args.peers = 16, 1, "bart"
    if args.compile is None:
        args.compile = not args.quick
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    log(describe_cpu())
    load_before = os.getloadavg()[0]       # other jobs on the cores: the ratios get noisier
    memory = torch.randn(args.batch, args.frames, args.dim).to(device, dtype)
    dec = build_mmtf(args).to(device, dtype)
    peers = {kind: build_peer(kind, args).to(device, dtype)
             for kind in args.peers.split(",") if kind}
    window = args.tokens // 4              # 32 of 128: tokens 1-32 vs 97-128

    compile_s = None
    if args.compile:
        start = time.perf_counter()
        run_mmtf(dec, memory, args.tokens, True, compile=True)      # compiles, once
        compile_s = time.perf_counter() - start
        log(f"first compiled call (compilation included): {compile_s:.1f} s")
    run_mmtf(dec, memory, 4, True)                                   # warm-up
    for model in peers.values():
        run_peer(model, memory, 4)

    w_bytes, _ = bytes_per_step(dec, args.batch, args.frames, 0)
    headline, eager, unpacked, peer_times = [], [], [], {k: [] for k in peers}
    early, late, ratios, achieved, copy_frac, read_frac, copy_bw, read_bw = ([] for _ in range(8))
    uncached, same_tokens = None, None
    for r in range(args.repeats):
        total, steps, toks = run_mmtf(dec, memory, args.tokens, True, compile=args.compile)
        headline.append(total)
        # Token 1 also projects the cross-attention K/V (once per call): leave it out of the
        # early window so that the ratio is not flattered by it.
        e, lt = statistics.mean(steps[1:window]), statistics.mean(steps[-window:])
        early.append(e), late.append(lt), ratios.append(lt / e)
        # Bytes each step must read at least once / its measured time, steps 2..T.
        moved = sum(sum(bytes_per_step(dec, args.batch, args.frames, t)) / dt
                    for t, dt in enumerate(steps) if t > 0) / (len(steps) - 1)
        bw_copy, bw_read = memory_bandwidth(device)      # measured between the decodes
        achieved.append(moved), copy_bw.append(bw_copy), read_bw.append(bw_read)
        copy_frac.append(moved / bw_copy), read_frac.append(moved / bw_read)
        eager_total, _, eager_toks = run_mmtf(dec, memory, args.tokens, True)
        eager.append(eager_total)
        unpacked.append(run_mmtf(dec, memory, args.tokens, True, pack=False)[0])   # F.linear
        for kind, model in peers.items():
            peer_times[kind].append(run_peer(model, memory, args.tokens))
        log(f"repeat {r + 1}/{args.repeats}: mmtf {total:.2f} s, eager step {eager_total:.2f} s, "
            + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in peer_times.items()))
        if r == args.repeats // 2:
            uncached, _, ref = run_mmtf(dec, memory, args.tokens, False)  # slow: once
            same_tokens = (bool(torch.equal(toks, ref)), bool(torch.equal(eager_toks, ref)))
            log(f"uncached: {uncached:.2f} s")

    med = statistics.median
    n_tok = args.batch * args.tokens
    t_mmtf, t_eager = med(headline), med(eager)
    tps = n_tok / t_mmtf
    peer_tps = {k: n_tok / med(v) for k, v in peer_times.items()}
    best_peer = max(peer_tps, key=peer_tps.get)
    # Each repeat runs mmtf and the peers back to back under the same machine load: the median
    # of the per-repeat ratios is the headline; the ratio of medians is shown beside it.
    per_repeat = [p / c for p, c in zip(peer_times[best_peer], headline)]
    paired = med(per_repeat)
    eager_paired = med(p / c for p, c in zip(peer_times[best_peer], eager))
    unpacked_paired = med(p / c for p, c in zip(peer_times[best_peer], unpacked))
    load_after = os.getloadavg()[0]
    kv_last = bytes_per_step(dec, args.batch, args.frames, args.tokens - 1)[1]
    kv_first = bytes_per_step(dec, args.batch, args.frames, 0)[1]
    result = {
        # The cache alone: both eager, the same code with and without it.
        "cache_speedup": round(uncached / t_eager, 2),
        "vs_peer_tokens_per_s": round(paired, 2),
        "late_over_early_step": round(med(ratios), 3),
    }

    step_kind = "compiled" if args.compile else "eager"
    rows = [
        ("setting", f"B={args.batch}, memory {args.frames}, {args.tokens} tokens, depth "
                    f"{args.depth}, dim {args.dim}, vocab {args.vocab}, threads {args.threads}, "
                    f"{args.dtype}, {args.device}, repeats {args.repeats} (medians)"),
        ("cpu", describe_cpu()),
        (f"mmtf cached, {step_kind} step: s / tokens/s", f"{t_mmtf:.2f} s / {tps:.0f}"),
        ("mmtf cached, eager step: s / tokens/s", f"{t_eager:.2f} s / {n_tok / t_eager:.0f}"),
        ("mmtf cached, eager step, oneDNN off (F.linear: MKL in fp32): s / tokens/s",
         f"{med(unpacked):.2f} s / {n_tok / med(unpacked):.0f}"),
        ("mmtf uncached (eager): s / tokens/s", f"{uncached:.2f} s / {n_tok / uncached:.0f}"),
        (f"{step_kind} / eager cached == uncached tokens", " / ".join(map(str, same_tokens))),
        ("first compiled call, compilation included", f"{compile_s:.1f} s"
         if args.compile else "-"),
    ]
    for kind in peers:
        rows.append((f"HF {kind} (use_cache): s / tokens/s",
                     f"{med(peer_times[kind]):.2f} s / {peer_tps[kind]:.0f}"))
    rows += [
        ("cache speedup (eager cached vs uncached)",
         f"{result['cache_speedup']:.2f}x  (target >= 5)"),
        (f"{step_kind} step vs fastest peer ({best_peer}), tokens/s",
         f"{paired:.2f}x paired, {tps / peer_tps[best_peer]:.2f}x of medians (target >= 1.5)"),
        ("  per-repeat paired ratios, min-max", f"{min(per_repeat):.2f}-{max(per_repeat):.2f}"),
        ("eager step vs fastest peer, tokens/s", f"{eager_paired:.2f}x paired (target >= 1.2)"),
        ("eager step, oneDNN off, vs fastest peer", f"{unpacked_paired:.2f}x paired"),
        ("load average (1 min) before / after", f"{load_before:.1f} / {load_after:.1f} "
                                                f"(on {os.cpu_count()} CPUs)"),
        (f"step ms: tokens 2-{window} / last {window}",
         f"{med(early) * 1e3:.1f} / {med(late) * 1e3:.1f}"),
        ("late / early step", f"{result['late_over_early_step']:.3f}  (target <= 1.5)"),
        ("bytes / step: weights + K/V", f"{w_bytes / 2**20:.0f} MiB + {kv_first / 2**20:.0f}"
                                        f"..{kv_last / 2**20:.0f} MiB"),
        ("achieved read rate", f"{med(achieved) / 1e9:.2f} GB/s"),
        ("copy (r+w) / read bandwidth", f"{med(copy_bw) / 1e9:.2f} / {med(read_bw) / 1e9:.2f}"
                                        f" GB/s"),
        ("fraction of the limit", f"{med(copy_frac):.0%} of copy, {med(read_frac):.0%} of "
                                  f"read bandwidth"),
    ]
    print(quantity_table(rows))
    print(json.dumps(append_result(__file__, {**result, "eager_vs_peer_tokens_per_s": round(eager_paired, 2),
                      "eager_onednn_off_vs_peer": round(unpacked_paired, 2),
                      "paired_min": round(min(per_repeat), 2),
                      "paired_max": round(max(per_repeat), 2),
                      "read_bandwidth_fraction": round(med(read_frac), 3),
                      "copy_bandwidth_fraction": round(med(copy_frac), 3),
                      "threads": args.threads, "load_avg_before": round(load_before, 2),
                      "load_avg_after": round(load_after, 2), "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "device": args.device})))


if __name__ == "__main__":
    main()
