"""The Whisper-architecture row of the KV-cache decoding benchmark: mmtf with imported weights vs
``WhisperForConditionalGeneration`` on the same weights.

Setup: a random-weight Whisper of whisper-tiny's size (d_model 384, 4 + 4 layers, 6 heads, FFN
1536, vocab 51865, 80 mels) built with transformers and saved with ``save_pretrained`` into a
temporary folder (no download), imported by ``mmtf.pretrained.whisper``; a batch of 10 s noise
clips (Whisper pads them to 30 s: a memory of 1500 frames); greedy decoding after Whisper's
4-token prompt, forced to exactly ``--tokens`` tokens (``min_new_tokens = max_new_tokens``) on
both sides, with the prompt's ids suppressed on both sides (mmtf never generates them). Only the
decode is timed: mmtf's ``generate`` on the memory of its own encoder, Whisper's
``GenerationMixin.generate`` (the parent of Whisper's own ``generate``, which adds language and
timestamp logic this benchmark does not want) on ``encoder_outputs`` of the HF encoder. The tokens
must be equal (asserted). Runs are interleaved and the medians of the paired ratios taken.

    python experiments/kv_cache_decoding/whisper_row.py            # short: 32 tokens, 3 repeats
    python experiments/kv_cache_decoding/whisper_row.py --tokens 128 --repeats 9

Prints a table and, last, one JSON line: {"whisper_tokens_per_s_ratio": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mmtf.decoders import GenerationConfig, generate
from mmtf.perf.results import append_result
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder

PROMPT = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
VOCAB, SOT, EOT = 51865, 50258, 50257
LANG_EN, TRANSCRIBE, NO_TIMESTAMPS = 50259, 50359, 50363


def build(folder: Path):
    """A random whisper-tiny-sized model saved into ``folder``; returns it (eval)."""
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.WhisperConfig(vocab_size=VOCAB, d_model=384, encoder_layers=4, decoder_layers=4,
                              encoder_attention_heads=6, decoder_attention_heads=6,
                              encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
                              pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT,
                              decoder_start_token_id=SOT, begin_suppress_tokens=None,
                              suppress_tokens=None)
    model = tf.WhisperForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers as tf
    from transformers.modeling_outputs import BaseModelOutput

    prompt = [SOT, LANG_EN, TRANSCRIBE, NO_TIMESTAMPS]
    with tempfile.TemporaryDirectory() as tmp:
        hf = build(Path(tmp))
        encoder = whisper_encoder(pretrained=tmp).eval()
        decoder = whisper_decoder(pretrained=tmp).eval()
    wave = 0.1 * torch.randn(args.batch, 16000 * 10, generator=torch.Generator().manual_seed(0))
    features = tf.WhisperFeatureExtractor()(list(wave.numpy()), sampling_rate=16000,
                                            return_tensors="pt").input_features
    cfg = GenerationConfig(strategy="greedy", max_new_tokens=args.tokens,
                           min_new_tokens=args.tokens)
    with torch.inference_mode():
        memory, mask = encoder(wave)
        hf_memory = hf.model.encoder(features).last_hidden_state
    print(f"memory max abs difference mmtf vs HF: {(memory - hf_memory).abs().max():.2e}")

    def run_mmtf() -> tuple[float, torch.Tensor]:
        with torch.inference_mode():
            start = time.perf_counter()
            out = generate(decoder, memory, mask, cfg, prompt_ids=prompt, eos_id=EOT,
                           pad_id=EOT)
            return time.perf_counter() - start, out.tokens

    def run_hf() -> tuple[float, torch.Tensor]:
        with torch.inference_mode():
            start = time.perf_counter()
            out = tf.GenerationMixin.generate(
                hf, encoder_outputs=BaseModelOutput(last_hidden_state=hf_memory),
                decoder_input_ids=torch.tensor([prompt] * args.batch),
                max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                num_beams=1, use_cache=True, suppress_tokens=prompt, eos_token_id=EOT,
                pad_token_id=EOT)
            return time.perf_counter() - start, out[:, len(prompt):]

    run_mmtf(), run_hf()                                       # warm-up, not timed
    ours, theirs, ratios = [], [], []
    for _ in range(args.repeats):
        t_ours, tokens_ours = run_mmtf()
        t_hf, tokens_hf = run_hf()
        assert torch.equal(tokens_ours, tokens_hf), (tokens_ours, tokens_hf)
        ours.append(t_ours)
        theirs.append(t_hf)
        ratios.append(t_hf / t_ours)
    n = args.batch * args.tokens
    row = {"whisper_tokens_per_s_mmtf": n / statistics.median(ours),
           "whisper_tokens_per_s_hf": n / statistics.median(theirs),
           "whisper_tokens_per_s_ratio": statistics.median(ratios), "equal_tokens": True,
           "tokens": args.tokens, "batch": args.batch, "repeats": args.repeats,
           "threads": args.threads, "torch": torch.__version__, "transformers": tf.__version__,
           "cpu": platform.processor() or platform.machine(),
           "cpu_flags": torch.backends.cpu.get_cpu_capability()}
    print("| system | s (median) | tokens/s |\n|---|---|---|")
    print(f"| mmtf (imported Whisper, eager cached step) | {statistics.median(ours):.3f} | "
          f"{row['whisper_tokens_per_s_mmtf']:.0f} |")
    print(f"| WhisperForConditionalGeneration (GenerationMixin.generate) | "
          f"{statistics.median(theirs):.3f} | {row['whisper_tokens_per_s_hf']:.0f} |")
    print(f"tokens/s ratio mmtf / HF (median of paired ratios): "
          f"{row['whisper_tokens_per_s_ratio']:.2f}; equal tokens: True")
    print(json.dumps(row))
    append_result(__file__, row)


if __name__ == "__main__":
    main()
