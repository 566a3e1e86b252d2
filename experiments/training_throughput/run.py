"""Training-step benchmark: mmtf's audio captioner against a transformers peer of the same size.

Question: is a full training step (forward, loss, backward, gradient clipping, AdamW step) of
mmtf's audio captioning model at most as slow as a Hugging Face Whisper-architecture model of
the same width, depth, heads, vocabulary and mel bins on the same batch? What do
``torch.compile`` and bf16 autocast add, what fraction of the machine's matmul rate (MFU) does
the step reach, and where does its time go?

Models: "default" is ``experiment=audio_captioning``'s model, composed from ``conf/`` and built
by Hydra exactly as ``mmtf.train`` builds it; "large" is the same config with 6 + 6 blocks of
width 384 (6 heads). The peer is ``WhisperForConditionalGeneration`` (SDPA attention) configured
to the same sizes, dropout and vocabulary, its two convolutions given the strides of mmtf's stem
(``stem_strides``) so that both encoders see the same number of positions; it gets the same waveforms (turned into log-mel
features by torchaudio inside its step) and the same tokens.

    python experiments/training_throughput/run.py            # full: 5 interleaved repeats (~12 min on 2 cores)
    python experiments/training_throughput/run.py --quick    # smoke, < 2 min
    python experiments/training_throughput/run.py --device cuda --batch 128   # a GPU

Prints tables and, last, one JSON line with step_time_vs_peer, mfu, bf16_speedup,
compile_speedup and the CPU flags.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mmtf.perf.device import cpu_flags, describe_cpu, has_native_bf16, quantity_table
from mmtf.perf.flops import FlopCounter, matmul_flops_per_s
from mmtf.perf.results import append_result
from mmtf.tasks.optim import build_optimizer

CONF = Path(__file__).resolve().parents[2] / "conf"
LARGE = ["model.encoder.dim=384", "model.encoder.depth=6", "model.encoder.num_heads=6",
         "model.decoder.dim=384", "model.decoder.depth=6", "model.decoder.num_heads=6"]
# Whisper small's shape (12 + 12 blocks of width 768, 12 heads): the "Whisper-size" model of the
# GPU check (experiments/gpu_check).
WHISPER = ["model.encoder.dim=768", "model.encoder.depth=12", "model.encoder.num_heads=12",
           "model.decoder.dim=768", "model.decoder.depth=12", "model.decoder.num_heads=12"]
SIZES = {"default": [], "large": LARGE, "whisper": WHISPER}
PAD, BOS, EOS = 0, 1, 2


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- systems
def build_mmtf(overrides: list[str], device: torch.device):
    """The task's EncoderDecoder and its AdamW, as ``mmtf.train`` builds them."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=audio_captioning", *overrides])
    torch.manual_seed(0)
    task = instantiate(cfg.model)
    model = task.model.to(device).train()
    opt = build_optimizer(task.optimizer, [model], task.hparams.weight_decay)
    return model, opt, cfg


def build_peer(cfg, memory_len: int, device: torch.device):
    """Whisper of the same sizes; its two convs strided like mmtf's stem (``stem_strides``)."""
    import transformers as tf
    tf.logging.set_verbosity_error()
    enc, dec = cfg.model.encoder, cfg.model.decoder
    mels = enc.frontend.n_mels
    torch.manual_seed(0)
    config = tf.WhisperConfig(
        vocab_size=dec.vocab_size, num_mel_bins=mels, d_model=enc.dim,
        encoder_layers=enc.depth, encoder_attention_heads=enc.num_heads,
        decoder_layers=dec.depth, decoder_attention_heads=dec.num_heads,
        encoder_ffn_dim=int(enc.dim * enc.block.mlp_ratio),
        decoder_ffn_dim=int(dec.dim * dec.block.mlp_ratio),
        max_source_positions=memory_len, max_target_positions=dec.max_len,
        dropout=dec.block.dropout, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS,
        apply_spec_augment=False, begin_suppress_tokens=None, suppress_tokens=None)
    model = tf.WhisperForConditionalGeneration(config)
    encoder = model.model.encoder
    first, second = enc.stem_strides
    encoder.conv1 = torch.nn.Conv1d(mels, enc.dim, kernel_size=3, stride=first, padding=1)
    encoder.conv2 = torch.nn.Conv1d(enc.dim, enc.dim, kernel_size=3, stride=second, padding=1)
    model = model.to(device).train()
    o = cfg.model.optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas),
                            weight_decay=cfg.model.weight_decay)
    return model, opt


class PeerFrontEnd(torch.nn.Module):
    """torchaudio log-mel with per-utterance normalisation: the peer's features, in its step."""

    def __init__(self, enc, frames: int) -> None:
        super().__init__()
        import torchaudio
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=enc.sample_rate, n_fft=enc.n_fft, hop_length=enc.hop_length,
            n_mels=enc.n_mels, center=True)
        self.frames = frames

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        feats = torch.log(self.mel(wave) + 1e-6)                       # (b, f, t)
        mean = feats.mean(dim=(1, 2), keepdim=True)
        std = feats.std(dim=(1, 2), keepdim=True).clamp_min(1e-5)
        feats = (feats - mean) / std
        return F.pad(feats, (0, self.frames - feats.shape[-1]))       # (b, f, stride * s)


def make_batches(cfg, count: int, batch: int, seconds: float, device: torch.device):
    """``count`` batches: noise waveforms of 85-100% of ``seconds`` (as bucketing leaves them)
    and captions of 10-20 tokens ``[bos, words, eos, pad ..]``."""
    rate, vocab = cfg.model.encoder.frontend.sample_rate, cfg.model.decoder.vocab_size
    n = int(seconds * rate)
    out = []
    for i in range(count):
        g = torch.Generator().manual_seed(i)
        lengths = (n * (0.85 + 0.15 * torch.rand(batch, generator=g))).long()
        lengths[0] = n
        wave = 0.1 * torch.randn(batch, n, generator=g)
        wave = wave * (torch.arange(n) < lengths[:, None])
        caption = torch.randint(8, 19, (batch,), generator=g)
        tokens = torch.full((batch, 21), PAD)
        for row, k in enumerate(caption.tolist()):
            tokens[row, 0] = BOS
            tokens[row, 1:k + 1] = torch.randint(3, vocab, (k,), generator=g)
            tokens[row, k + 1] = EOS
        tokens = tokens[:, :int(caption.max()) + 2]
        out.append({k: v.to(device) for k, v in
                    (("wave", wave), ("lengths", lengths), ("tokens", tokens))})
    return out


def mmtf_step(model, opt, b, *, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast(b["wave"].device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(b["wave"], b["lengths"], b["tokens"]).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def peer_step(model, opt, frontend, b, *, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        feats = frontend(b["wave"])
    tokens = b["tokens"]
    targets = tokens[:, 1:]
    is_eos = (targets == EOS).long()
    labels = targets.masked_fill((targets == PAD) | ((is_eos.cumsum(1) - is_eos) > 0), -100)
    with torch.autocast(feats.device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(input_features=feats, decoder_input_ids=tokens[:, :-1], labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# ---------------------------------------------------------------------------- measuring
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, batches, steps: int, device: torch.device) -> float:
    """Median seconds of ``steps`` steps, cycling through ``batches``."""
    times = []
    for i in range(steps):
        sync(device)
        start = time.perf_counter()
        step(batches[i % len(batches)])
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_sections(model, opt, batches, steps: int, device: torch.device) -> dict[str, float]:
    """Median milliseconds per part of an mmtf step, from module hooks and a gradient hook.

    Forward: front end (log-mel + SpecAugment), encoder (conv stem + blocks), decoder, loss
    (cross-entropy after the decoder). Backward is split where the gradient reaches the encoder
    memory: loss + decoder backward, then encoder backward. Optimizer: clipping, AdamW,
    zero_grad.
    """
    stamps: dict[str, float] = {}

    def stamp(name):
        def hook(*_):
            sync(device)
            stamps[name] = time.perf_counter()
        return hook

    def watch_memory(_module, _args, out) -> None:
        out.memory.register_hook(stamp("memory_grad"))   # fires when decoder backward is done

    enc = model.encoder
    handles = [enc.register_forward_pre_hook(stamp("enc_start")),
               enc.frontend.register_forward_pre_hook(stamp("front_start")),
               enc.spec_augment.register_forward_hook(stamp("front_end")),
               enc.register_forward_hook(watch_memory),
               enc.register_forward_hook(stamp("enc_end")),
               model.decoder.register_forward_hook(stamp("dec_end"))]
    rows: dict[str, list[float]] = {k: [] for k in (
        "front end (log-mel, SpecAugment)", "encoder forward (stem, blocks)", "decoder forward",
        "loss", "loss + decoder backward", "encoder backward", "optimizer (clip, AdamW, zero)",
        "step total")}
    for i in range(steps):
        b = batches[i % len(batches)]
        sync(device)
        t0 = time.perf_counter()
        loss = model(b["wave"], b["lengths"], b["tokens"]).loss
        sync(device)
        t_loss = time.perf_counter()
        loss.backward()
        sync(device)
        t_bwd = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        t_end = time.perf_counter()
        s = stamps
        front = s["front_end"] - s["front_start"]
        parts = [front, s["enc_end"] - s["enc_start"] - front, s["dec_end"] - s["enc_end"],
                 t_loss - s["dec_end"], s["memory_grad"] - t_loss, t_bwd - s["memory_grad"],
                 t_end - t_bwd, t_end - t0]
        for key, value in zip(rows, parts):
            rows[key].append(1e3 * value)
    for h in handles:
        h.remove()
    return {k: statistics.median(v) for k, v in rows.items()}


def short_run_loss(cfg_overrides, batches, steps: int, dtype: torch.dtype,
                   device: torch.device) -> float:
    """Mean loss of the last 5 of ``steps`` steps of a fresh default model (same seed)."""
    model, opt, _ = build_mmtf(cfg_overrides, device)
    torch.manual_seed(1)
    losses = [float(mmtf_step(model, opt, batches[i % len(batches)], dtype=dtype))
              for i in range(steps)]
    return statistics.mean(losses[-5:])


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: batch 8 of 2 s, 2 repeats of 2 steps, < 2 min")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per system per repeat")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=4.0, help="padded clip length")
    parser.add_argument("--sizes", default="default,large", help="of default, large, whisper")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also time the default model under torch.compile (default: on, "
                             "off with --quick: compiling the step takes minutes on 2 cores)")
    parser.add_argument("--fused", action="store_true",
                        help="mmtf's AdamW with fused=True (+model.optimizer.fused=true); the "
                             "peer keeps torch's default")
    parser.add_argument("--foreach", action="store_true",
                        help="mmtf's AdamW with foreach=True (+model.optimizer.foreach=true; "
                             "torch's default on a CPU is the per-tensor loop)")
    parser.add_argument("--loss-steps", type=int, default=60,
                        help="steps of the fp32 vs bf16 short run")
    args = parser.parse_args()
    if args.quick:     # a smoke test of the script: small batches, few steps
        args.repeats, args.steps, args.loss_steps, args.batch, args.seconds = 2, 2, 10, 8, 2.0
    if args.compile is None:
        args.compile = not args.quick
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.set_float32_matmul_precision("high")
    flags = cpu_flags()
    load0 = os.getloadavg()[0]
    log(describe_cpu())

    systems = {}
    for size in args.sizes.split(","):
        if size not in SIZES:
            parser.error(f"--sizes: {size!r} is not one of {sorted(SIZES)}")
        overrides = list(SIZES[size]) + (
            ["+model.optimizer.fused=true"] if args.fused else []) + (
            ["+model.optimizer.foreach=true"] if args.foreach else [])
        model, opt, cfg = build_mmtf(overrides, device)
        batches = make_batches(cfg, 4, args.batch, args.seconds, device)
        memory_len = int(model.encoder.output_lengths(batches[0]["lengths"][:1]).item())
        peer, peer_opt = build_peer(cfg, memory_len, device)
        stride = math.prod(cfg.model.encoder.stem_strides)            # feature frames per position
        frontend = PeerFrontEnd(cfg.model.encoder.frontend, stride * memory_len).to(device)
        with FlopCounter(model) as counter:
            mmtf_step(model, opt, batches[0], dtype=torch.float32)
        systems[size] = dict(model=model, opt=opt, cfg=cfg, batches=batches, peer=peer,
                             peer_opt=peer_opt, frontend=frontend, overrides=overrides,
                             flops=counter.training_flops, memory_len=memory_len,
                             times={k: [] for k in ("mmtf", "peer", "bf16", "compiled")})
        log(f"{size}: mmtf {n_params(model) / 1e6:.2f} M params, peer "
            f"{n_params(peer) / 1e6:.2f} M, memory {memory_len} positions, "
            f"{counter.training_flops / 1e9:.2f} GFLOP per step")

    compile_s = None
    if args.compile:
        s = systems["default"]
        s["compiled_model"] = torch.compile(s["model"])
        start = time.perf_counter()
        for b in s["batches"][:2]:
            mmtf_step(s["compiled_model"], s["opt"], b, dtype=torch.float32)
        compile_s = time.perf_counter() - start
        log(f"torch.compile: first two steps {compile_s:.1f} s")

    for s in systems.values():                           # warm-up, one step each
        mmtf_step(s["model"], s["opt"], s["batches"][0], dtype=torch.float32)
        mmtf_step(s["model"], s["opt"], s["batches"][0], dtype=torch.bfloat16)
        peer_step(s["peer"], s["peer_opt"], s["frontend"], s["batches"][0], dtype=torch.float32)

    for s in systems.values():                           # what each timed system runs
        s["steps"] = {
            "mmtf": functools.partial(mmtf_step, s["model"], s["opt"], dtype=torch.float32),
            "peer": functools.partial(peer_step, s["peer"], s["peer_opt"], s["frontend"],
                                      dtype=torch.float32),
            "bf16": functools.partial(mmtf_step, s["model"], s["opt"], dtype=torch.bfloat16)}
        if "compiled_model" in s:
            s["steps"]["compiled"] = functools.partial(mmtf_step, s["compiled_model"], s["opt"],
                                                       dtype=torch.float32)
    peak = []
    for r in range(args.repeats):
        for size, s in systems.items():
            for name, step in s["steps"].items():
                s["times"][name].append(time_steps(step, s["batches"], args.steps, device))
            log(f"repeat {r + 1}/{args.repeats} {size}: " + ", ".join(
                f"{k} {1e3 * v[-1]:.1f} ms" for k, v in s["times"].items() if v))
        peak.append(matmul_flops_per_s(device, torch.float32))

    med = statistics.median
    peak_fp32 = med(peak)
    peak_bf16 = matmul_flops_per_s(device, torch.bfloat16)
    rows, result = [], {}
    for size, s in systems.items():
        t = s["times"]
        ratio = med(m / p for m, p in zip(t["mmtf"], t["peer"]))
        bf16 = med(m / b for m, b in zip(t["mmtf"], t["bf16"]))
        step = med(t["mmtf"])
        tokens = int((s["batches"][0]["tokens"][:, 1:] != PAD).sum())
        mfu = s["flops"] / step / peak_fp32
        mfu_bf16 = s["flops"] / med(t["bf16"]) / peak_bf16     # the bf16 step against bf16 matmuls
        rows += [
            (f"{size}: params mmtf / peer", f"{n_params(s['model']) / 1e6:.2f} M / "
                                            f"{n_params(s['peer']) / 1e6:.2f} M"),
            (f"{size}: step ms mmtf / peer (fp32, eager)",
             f"{1e3 * step:.1f} / {1e3 * med(t['peer']):.1f}"),
            (f"{size}: samples/s, tokens/s (mmtf fp32)",
             f"{args.batch / step:.0f}, {tokens / step:.0f}"),
            (f"{size}: **step time vs peer** (paired, target <= 1.0)", f"{ratio:.3f}x"),
            (f"{size}: model GFLOP/step, GFLOP/s, **MFU**",
             f"{s['flops'] / 1e9:.2f}, {s['flops'] / step / 1e9:.1f}, {mfu:.1%}"),
            (f"{size}: bf16 autocast step ms, speedup", f"{1e3 * med(t['bf16']):.1f}, {bf16:.2f}x"),
            (f"{size}: bf16 MFU (of the bf16 matmul rate)", f"{mfu_bf16:.1%}"),
        ]
        result[size] = {"step_time_vs_peer": round(ratio, 3), "mfu": round(mfu, 4),
                        "bf16_speedup": round(bf16, 3), "step_ms": round(1e3 * step, 1),
                        "bf16_mfu": round(mfu_bf16, 4),
                        "samples_per_s": round(args.batch / step, 1)}
        if t["compiled"]:
            speedup = med(m / c for m, c in zip(t["mmtf"], t["compiled"]))
            rows.append((f"{size}: torch.compile step ms, speedup",
                         f"{1e3 * med(t['compiled']):.1f}, {speedup:.2f}x "
                         f"(compile {compile_s:.0f} s)"))
            result[size]["compile_speedup"] = round(speedup, 3)

    default = systems[next(iter(systems))]
    fp32_loss = short_run_loss(default["overrides"], default["batches"], args.loss_steps,
                               torch.float32, device)
    bf16_loss = short_run_loss(default["overrides"], default["batches"], args.loss_steps,
                               torch.bfloat16, device)
    sections = profile_sections(default["model"], default["opt"], default["batches"],
                                max(3, args.steps), device)
    rows += [
        ("dense matmul GFLOP/s: fp32 (median) / bf16", f"{peak_fp32 / 1e9:.1f} / "
                                                       f"{peak_bf16 / 1e9:.1f}"),
        (f"short run ({args.loss_steps} steps) final loss fp32 / bf16",
         f"{fp32_loss:.5f} / {bf16_loss:.5f} (diff {bf16_loss - fp32_loss:+.5f})"),
        ("bf16 pays on this CPU", "n/a (not a CPU)" if device.type != "cpu" else
         f"{'yes' if result[next(iter(result))]['bf16_speedup'] > 1.05 else 'no'} "
         f"(native bf16: {has_native_bf16()})"),
        ("cpu", describe_cpu()),
        ("setting", f"batch {args.batch}, {args.seconds} s clips, {args.threads} threads, "
                    f"{'fused ' if args.fused else ''}{'foreach ' if args.foreach else ''}AdamW, "
                    f"{args.device}, {args.repeats} repeats x {args.steps} steps (medians)"),
        ("load average (1 min) at start / end", f"{load0:.2f} / {os.getloadavg()[0]:.2f} "
                                                f"on {os.cpu_count()} CPUs"),
    ]
    print(quantity_table(rows))
    total = sections["step total"]
    print("\n| part of the default model's step | ms | share |\n|---|---|---|")
    for key, value in sections.items():
        print(f"| {key} | {value:.1f} | {value / total:.0%} |")
    print("| data wait | 0.0 | 0% (batches in memory; the loader: experiments/data_throughput) |")

    first = result[next(iter(result))]
    summary = {"step_time_vs_peer": first["step_time_vs_peer"], "mfu": first["mfu"],
               "bf16_speedup": first["bf16_speedup"],
               "compile_speedup": first.get("compile_speedup"),
               "bf16_final_loss_diff": round(bf16_loss - fp32_loss, 5),
               "sizes": result, "cpu_flags": flags,
               "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "device": str(device), "fused_adamw": args.fused,
               "foreach_adamw": args.foreach, "threads": torch.get_num_threads(),
               "load_avg_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    if not math.isfinite(fp32_loss) or not math.isfinite(bf16_loss):
        summary["error"] = "non-finite loss in the short run"
    print(json.dumps(summary))
    append_result(__file__, summary)


if __name__ == "__main__":
    main()
