"""LLM decoding benchmark: mmtf's cached greedy decoding of a Llama against transformers' generate.

Question: does ``CausalLM.generate`` (mmtf's static KV cache, loaded from a Hugging Face folder)
produce the same greedy tokens as ``LlamaForCausalLM.generate`` and at least 1.5x its tokens/s
on CPU, at batch 1 and at a left-padded batch of 8?

Setup: a random-weight Llama of ~100 M parameters (dim 768, 12 layers, 12 query / 4 key-value
heads, SwiGLU 2048, vocab 32000, tied embeddings) built with transformers, written with
``save_pretrained`` and read back by ``llm_decoder(pretrained=folder)``; fp32, CPU,
``torch.inference_mode``. Prompts of random ids: 32 tokens at batch 1, lengths 32, 30, .., 18
left-padded at batch 8. Greedy, ``min_new_tokens = max_new_tokens = 64`` (eos masked) in both.
Each implementation runs once per batch size as warm-up, then the two alternate over the
repeats (the first of each pair swaps every repeat); the ratio is the median over repeats of
transformers' time / mmtf's time of the same repeat, because the machine's speed drifts. The
whole ``generate`` call is timed (the prompt's pass included, in both).

    python experiments/llm_decoding/run.py                 # the measurement (3 repeats)
    python experiments/llm_decoding/run.py --tiny          # smoke: 2 layers, dim 64
    python experiments/llm_decoding/run.py --record        # also append to results.jsonl

Prints the CPU line, a table and, last, one JSON line:
{"ratio_batch1": ..., "ratio_batch8": ..., "tokens_equal": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmtf.decoders.lm import CausalLM
from mmtf.perf.device import cpu_flags, describe_cpu
from mmtf.perf.results import append_result
from mmtf.pretrained.llm import llm_decoder

BOS, EOS = 1, 2
# The Llama of the measurement (100,092,672 parameters, the head tied) and the smoke model.
FULL = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, intermediate_size=2048)
TINY = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128)
BATCHES = (1, 8)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_llama(folder: Path, sizes: dict[str, int], seed: int = 0):
    """A random-weight ``LlamaForCausalLM`` of ``sizes`` saved to ``folder``; returns it (eval).

    Weights are drawn wide (as tests/unit/pretrained/tiny_hf.write_llm draws them: embeddings
    N(0, 1), projections N(0, 1.5 / sqrt(fan_in)), norm gains 1 + N(0, 0.2)) so the greedy
    pick of each step is far from a tie: transformers' default init (std 0.02) gives
    near-uniform logits, where the two implementations' rounding (within ~1e-5) could pick
    different tokens and the equality check would measure luck.
    """
    import transformers as tf
    tf.logging.set_verbosity_error()             # generation-length notices on every call
    config = tf.LlamaConfig(**sizes, max_position_embeddings=2048, tie_word_embeddings=True,
                            bos_token_id=BOS, eos_token_id=EOS, pad_token_id=None,
                            rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 1.5 / p.shape[1] ** 0.5)
    model.save_pretrained(folder)
    return model


def left_padded_prompts(vocab: int, batch: int, length: int, seed: int = 0,
                        ) -> tuple[Tensor, Tensor]:
    """Random prompts (b, length) long, left-padded to lengths length, length - 2, ..., and
    their 0/1 attention mask (b, length). Ids avoid bos/eos; pads are eos (the pad id of
    both generate calls)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((batch, length), EOS, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for i in range(batch):
        n = max(1, length - 2 * i)
        ids[i, length - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, length - n:] = 1
    return ids, mask


def run_mmtf(lm: CausalLM, ids: Tensor, mask: Tensor, tokens: int) -> tuple[float, Tensor]:
    """Seconds for one ``CausalLM.generate`` call and its tokens (b, tokens)."""
    with torch.inference_mode():
        start = time.perf_counter()
        out = lm.generate(ids, mask, strategy="greedy", max_new_tokens=tokens,
                          min_new_tokens=tokens, eos_id=EOS)
        seconds = time.perf_counter() - start
    return seconds, out.tokens


def run_hf(model, ids: Tensor, mask: Tensor, tokens: int) -> tuple[float, Tensor]:
    """Seconds for one transformers ``generate`` call and the new tokens (b, tokens)."""
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                             max_new_tokens=tokens, min_new_tokens=tokens, use_cache=True,
                             pad_token_id=EOS, eos_token_id=EOS)
        seconds = time.perf_counter() - start
    return seconds, out[:, ids.shape[1]:]                  # (b, p + tokens) -> (b, tokens)


def measure(lm: CausalLM, hf_model, ids: Tensor, mask: Tensor, args: argparse.Namespace,
            ) -> dict[str, Any]:
    """One batch size: a warm-up each, then ``args.repeats`` alternating pairs."""
    times: dict[str, list[float]] = {"mmtf": [], "transformers": []}
    runners = {"mmtf": lambda: run_mmtf(lm, ids, mask, args.max_new_tokens),
               "transformers": lambda: run_hf(hf_model, ids, mask, args.max_new_tokens)}
    outputs = {name: run()[1] for name, run in runners.items()}          # warm-up
    equal = torch.equal(outputs["mmtf"], outputs["transformers"])
    for r in range(args.repeats):
        order = ("mmtf", "transformers") if r % 2 == 0 else ("transformers", "mmtf")
        for name in order:
            seconds, out = runners[name]()
            times[name].append(seconds)
            outputs[name] = out
        equal = equal and torch.equal(outputs["mmtf"], outputs["transformers"])
        log(f"batch {ids.shape[0]}, repeat {r + 1}/{args.repeats}: "
            + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()))
    med = statistics.median
    paired = [hf / ours for hf, ours in zip(times["transformers"], times["mmtf"])]
    new = ids.shape[0] * args.max_new_tokens
    return {"batch": ids.shape[0], "tokens_equal": bool(equal), "ratio": med(paired),
            "ratio_min": min(paired), "ratio_max": max(paired),
            **{f"{k}_s": med(v) for k, v in times.items()},
            **{f"{k}_tokens_per_s": new / med(v) for k, v in times.items()}}


def table(rows: list[dict[str, Any]], tokens: int) -> str:
    lines = ["| impl | batch | tokens/s | ms/token (per row) | mmtf / transformers (paired) |",
             "|---|---:|---:|---:|---|"]
    for row in rows:
        for impl in ("mmtf", "transformers"):
            ratio = (f"{row['ratio']:.2f}x ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
                     if impl == "mmtf" else "")
            lines.append(f"| {impl} | {row['batch']} | {row[f'{impl}_tokens_per_s']:.0f} "
                         f"| {row[f'{impl}_s'] / tokens * 1e3:.2f} | {ratio} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer dim-64 Llama (vocab 1000): a smoke check of the script")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--record", action="store_true",
                        help="append the result to experiments/llm_decoding/results.jsonl")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.prompt_length < 1 or args.max_new_tokens < 1:
        parser.error("--repeats, --prompt-length and --max-new-tokens must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    sizes = TINY if args.tiny else FULL
    torch.set_num_threads(args.threads)
    print(describe_cpu(), flush=True)
    load_before = os.getloadavg()[0]       # other jobs on the cores make the ratios noisier
    with tempfile.TemporaryDirectory(prefix="llm_decoding_") as folder:
        hf_model = write_llama(Path(folder), sizes)
        lm = llm_decoder(pretrained=folder).eval()
    params = sum(p.numel() for p in lm.parameters())           # the tied head counted once
    # Every step reads every weight but the embedding rows it looks up (the tied table is read
    # whole as the LM head): at batch 1 both implementations are bound by reading these bytes.
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    hf_params = sum(p.numel() for p in hf_model.parameters())
    attn = hf_model.config._attn_implementation
    print(f"Llama {sizes}, tied embeddings: {params:,} parameters in mmtf, {hf_params:,} in "
          f"transformers ({attn} attention), {weight_bytes / 2**20:.0f} MiB of weights read "
          f"per step; fp32, {args.threads} threads, prompt "
          f"{args.prompt_length}, {args.max_new_tokens} new tokens, {args.repeats} repeats "
          f"(medians)", flush=True)
    rows = []
    for batch in BATCHES:
        ids, mask = left_padded_prompts(sizes["vocab_size"], batch, args.prompt_length)
        rows.append(measure(lm, hf_model, ids, mask, args))
    load_after = os.getloadavg()[0]
    equal = all(row["tokens_equal"] for row in rows)
    print(table(rows, args.max_new_tokens))
    print(f"greedy tokens identical (mmtf == transformers, every run): {equal}; goal: mmtf >= "
          f"1.5x transformers' tokens/s; load average (1 min) before / after: "
          f"{load_before:.1f} / {load_after:.1f} (on {os.cpu_count()} CPUs)")
    result: dict[str, Any] = {f"ratio_batch{row['batch']}": round(row["ratio"], 3)
                              for row in rows}
    result["tokens_equal"] = equal
    for row in rows:
        for impl in ("mmtf", "transformers"):
            result[f"{impl}_tokens_per_s_batch{row['batch']}"] = round(
                row[f"{impl}_tokens_per_s"], 1)
    import transformers
    result.update(tiny=args.tiny, parameters=params, weight_bytes=weight_bytes,
                  threads=args.threads,
                  prompt_length=args.prompt_length, max_new_tokens=args.max_new_tokens,
                  repeats=args.repeats, attn_implementation=attn,
                  transformers=transformers.__version__, torch=torch.__version__,
                  load_avg_before=round(load_before, 2), load_avg_after=round(load_after, 2),
                  cpu_flags=cpu_flags(),
                  cpu_capability=torch.backends.cpu.get_cpu_capability())
    if args.record:
        append_result(__file__, result)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
