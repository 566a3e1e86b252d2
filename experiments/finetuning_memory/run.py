"""Fine-tuning memory benchmark: full fine-tuning vs LoRA vs LoRA + activation checkpointing.

Question: how much peak memory (and step time) does a training step of a Whisper-architecture
captioner cost under full fine-tuning, full fine-tuning with activation checkpointing
(``model.encoder.activation_checkpointing`` / ``model.decoder.activation_checkpointing``), LoRA
(``model.lora``) and LoRA with activation checkpointing?

Model: a random-weight Whisper (``transformers.WhisperConfig`` at whisper-tiny's sizes by
default, ``--size base`` for whisper-base's; 39 M / 73 M parameters) saved with
``save_pretrained`` and imported through mmtf's Whisper builders, exactly as
``python -m mmtf.train experiment=audio_captioning_clotho_whisper pretrained=<folder>`` builds
it (Hydra composes the same config; ``model.lora`` and the checkpointing keys are ordinary
overrides). Inputs: 30 s clips (Whisper pads to 30 s: 1500 encoder positions), captions of 32
tokens. Step: forward, loss, backward, AdamW step over the trainable parameters, gradients freed.

Memory: the peak resident set size (``VmHWM`` of ``/proc/self/status``) of a fresh interpreter
per configuration, reset (``/proc/self/clear_refs`` = 5) after the model and its inputs are
built, so the peak is the training steps' own: weights + gradients + optimizer state +
activations, whatever allocates them. ``tracemalloc`` would not see torch's allocations (they
are C++ ``malloc``s), and torch's CPU allocator keeps no statistics of its own. RSS counts what
the allocator holds, so it is an upper bound of what the tensors need; every configuration is
measured the same way. ``train_peak`` = peak - RSS before the first step. By default the
children run with ``MALLOC_MMAP_THRESHOLD_=65536`` (``--malloc mmap``), so the peak is that of
the live tensors rather than of glibc's fragmented heap (``--malloc glibc``).

    OMP_NUM_THREADS=1 python experiments/finetuning_memory/run.py            # 4 configurations
    OMP_NUM_THREADS=1 python experiments/finetuning_memory/run.py --quick    # smoke, tiny sizes
    python experiments/finetuning_memory/run.py --size base --batch 8 --device cuda

Prints a table and, last, one JSON line with every configuration's numbers and the CPU flags.
On a CUDA device the peak is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONF = Path(__file__).resolve().parents[2] / "conf"
SIZES = {   # WhisperConfig fields: whisper-tiny and whisper-base, and a smoke size
    "tiny": dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                 decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536),
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
    "quick": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256),
}
# glibc serves allocations below its (dynamic, up to 32 MiB) mmap threshold from a heap whose
# freed holes stay resident, so how far its RSS peak exceeds the live tensors depends on the
# order of allocations (LoRA's many rank-sized tensors between the activations fragment it).
# A fixed threshold of 64 KiB maps every tensor of that size on its own and unmaps it when
# freed: the high-water mark is then the tensors' own peak, as max_memory_allocated on CUDA.
MMAP_THRESHOLD = 64 * 1024
LORA = "++model.lora={r:8,alpha:16,dropout:0.05,parts:[encoder,decoder],targets:[q,k,v,o,mlp]}"
AC = ["model.encoder.activation_checkpointing=true", "model.decoder.activation_checkpointing=true"]
CONFIGS = {
    "full": [],
    "full + AC": AC,
    "LoRA r=8": [LORA],
    "LoRA r=8 + AC": [LORA, *AC],
    # without adapter dropout: no per-adapter copy of each adapted projection's input is kept
    "LoRA r=8, dropout 0": [LORA, "model.lora.dropout=0.0"],
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_whisper(folder: Path, size: str) -> None:
    """A random-weight Whisper (51865 tokens, 80 mels) in Hugging Face's layout."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = tf.WhisperConfig(vocab_size=51865, num_mel_bins=80, max_source_positions=1500,
                              max_target_positions=448, **SIZES[size])
    tf.WhisperForConditionalGeneration(config).save_pretrained(folder)


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(folder: str, name: str, batch: int, steps: int, device_name: str) -> dict[str, Any]:
    """One configuration, in this (fresh) interpreter: build, reset the peak, train ``steps``."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from mmtf.tasks.optim import build_optimizer

    device = torch.device(device_name)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=audio_captioning_clotho_whisper",
                                          f"pretrained={folder}", *CONFIGS[name]])
    torch.manual_seed(0)
    task = instantiate(cfg.model)
    model = task.model.to(device).train()
    opt = build_optimizer(task.optimizer, [model], cfg.model.weight_decay)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    g = torch.Generator().manual_seed(1)
    audio = (0.1 * torch.randn(batch, 30 * 16000, generator=g)).to(device)
    lengths = torch.full((batch,), 30 * 16000, device=device)
    tokens = torch.randint(3, 50000, (batch, 32), generator=g).to(device)

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")      # VmHWM := VmRSS
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(audio, lengths, tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else status_kib("VmHWM") * 1024
    return {"config": name, "params": total, "trainable": trainable,
            "before_mib": before / 2**20, "peak_mib": peak / 2**20,
            "train_peak_mib": (peak - before) / 2**20,
            # the first step allocates the optimizer state; the rest are the steady cost
            "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
            "loss": float(loss)}


def run_child(folder: Path, name: str, args: argparse.Namespace) -> dict[str, Any] | str:
    """``measure`` in a fresh interpreter (its own peak); its JSON, or why it failed."""
    cmd = [sys.executable, __file__, "--child", name, "--folder", str(folder),
           "--batch", str(args.batch), "--steps", str(args.steps), "--device", args.device]
    env = {**os.environ, "PYTHONPATH": str(CONF.parent)}
    if args.malloc == "mmap":
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        errors = [line for line in lines if "Error" in line]
        return (errors or lines)[-1].strip()
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke run: --size quick, 2 steps")
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS),
                        help="configurations to measure (default: all)")
    parser.add_argument("--malloc", choices=["mmap", "glibc"], default="mmap",
                        help="mmap (default): every allocation of 64 KiB or more is its own "
                             "mapping, so the RSS peak is the tensors' peak; glibc: the "
                             "allocator's defaults, whose heap also holds freed holes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.folder, args.child, args.batch, args.steps, args.device)))
        return
    if args.quick:
        args.size, args.steps, args.batch = "quick", 2, 2

    from mmtf.perf.device import cpu_flags, describe_cpu
    from mmtf.perf.results import append_result

    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "whisper"
        write_whisper(folder, args.size)
        for name in args.only:
            log(f"measuring {name} ...")
            got = run_child(folder, name, args)
            if isinstance(got, str):
                failed[name] = got
                log(f"  {name}: not measured: {got}")
            else:
                rows.append(got)
    full = next((r for r in rows if r["config"] == "full"), None)
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"Whisper-{args.size} architecture, random weights; batch {args.batch} x 30 s, 32 "
          f"tokens; {args.steps} steps (median of steps 2..); {args.device}, OMP_NUM_THREADS="
          f"{threads}, malloc={args.malloc}\n{describe_cpu()}\n")
    print("| configuration | parameters | trainable | RSS before (MiB) | peak (MiB) | "
          "peak - before (MiB) | vs full | step (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['train_peak_mib'] / full['train_peak_mib']:.2f}" if full else "-"
        print(f"| {r['config']} | {r['params'] / 1e6:.1f} M | {r['trainable'] / 1e6:.2f} M | "
              f"{r['before_mib']:.0f} | {r['peak_mib']:.0f} | {r['train_peak_mib']:.0f} | "
              f"{ratio} | {r['step_s']:.2f} |")
    for name, why in failed.items():
        print(f"| {name} | not measured: {why} | | | | | | |")
    print(json.dumps(append_result(__file__, {"size": args.size, "batch": args.batch, "steps": args.steps,
                      "device": args.device, "omp_num_threads": threads,
                      "malloc": args.malloc, "rows": rows,
                      "not_measured": failed, "cpu_flags": cpu_flags()})))


if __name__ == "__main__":
    main()
