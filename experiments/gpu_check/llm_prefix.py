"""The multimodal prefix model at LLM size on a GPU: bf16 training under plain and FSDP2
strategies, and batched cached generation.

Question: does ``model=prefix_lm`` (an audio encoder -> concat projector -> a Llama-architecture
LLM of TinyLlama's size, 1.1 B parameters, frozen, LoRA r=8 on it) train in ``bf16-mixed``
through Lightning, does ``trainer=fsdp``'s :class:`~mmtf.tasks.fsdp.FSDP2Strategy` give the same
losses from the same start, and how fast does it generate (greedy, batch 8, mmtf's cache)?

    python experiments/gpu_check/llm_prefix.py            # on the GPU machine
    python experiments/gpu_check/llm_prefix.py --tiny     # smoke on a CPU (dim 64, 2 layers)

Random weights: nothing is downloaded. FSDP2 runs on one rank here (the machine has one GPU):
it checks that the sharding plan wraps the LLM's blocks and trains to the same losses, not a
speed-up. Last line: JSON with step ms, peak memory and losses per strategy, and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.utils.data import DataLoader

from mmtf.perf.device import describe_cpu
from mmtf.perf.results import append_result

CONF = Path(__file__).resolve().parents[2] / "conf"
# TinyLlama-1.1B's shape (config.json of TinyLlama/TinyLlama-1.1B-Chat-v1.0).
LLM = dict(vocab_size=32000, dim=2048, depth=22, num_heads=32, num_kv_heads=4, mlp_hidden=5632,
           max_len=2048)
TINY = dict(vocab_size=512, dim=64, depth=2, num_heads=4, num_kv_heads=2, mlp_hidden=128,
            max_len=256)


def build_task(sizes: dict[str, int], encoder: str) -> L.LightningModule:
    """``model=prefix_lm`` composed from conf/ with random LLM weights of ``sizes``."""
    overrides = [f"encoder={encoder}", "projector=concat", "decoder.pretrained=null",
                 *(f"decoder.{k}={v}" for k, v in sizes.items()), "decoder.eos_id=2",
                 "decoder.pad_id=0", f"media_token_id={sizes['vocab_size'] - 1}",
                 "lora=default", "lora.parts=[decoder]", "lora.dropout=0.0", "warmup_steps=2",
                 "encoder.spec_augment.freq_masks=0", "encoder.spec_augment.time_masks=0"]          # deterministic steps: the strategies compare
    with initialize_config_dir(str(CONF / "model"), version_base="1.3"):
        cfg = compose(config_name="prefix_lm", overrides=overrides)
    torch.manual_seed(0)
    return instantiate(cfg)


def make_batches(n: int, b: int, seconds: float, text: int, answer: int, vocab: int,
                 ) -> list[dict[str, torch.Tensor]]:
    """Right-padded chat-like items: [prompt .., <media>, prompt .., answer .., eos], labels on
    the answer only; audio lengths differ per item."""
    g = torch.Generator().manual_seed(0)
    samples = int(16000 * seconds)
    out = []
    for _ in range(n):
        lengths = torch.randint(samples // 2, samples + 1, (b,), generator=g)
        media_mask = torch.arange(samples)[None] < lengths[:, None]               # (b, samples)
        media = torch.randn(b, samples, generator=g) * media_mask
        ids = torch.randint(10, vocab - 1, (b, text), generator=g)
        ids[:, 4] = vocab - 1                                                     # the placeholder
        labels = torch.full((b, text), -100)
        labels[:, -answer:] = ids[:, -answer:]
        out.append({"media": media, "media_mask": media_mask, "input_ids": ids,
                    "attention_mask": torch.ones(b, text, dtype=torch.bool), "labels": labels})
    return out


class StepTimer(L.Callback):
    """Wall time of each training step (synchronised) and its loss."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)
        self.losses.append(float(outputs["loss"]))


def train(strategy: str, sizes: dict[str, int], encoder: str, batches: list, tiny: bool,
          ) -> dict[str, object]:
    from mmtf.tasks.fsdp import FSDP2Strategy

    task = build_task(sizes, encoder)
    timer = StepTimer()
    gpu = torch.cuda.is_available() and not tiny
    kwargs = dict(accelerator="gpu" if gpu else "cpu", devices=1, max_steps=len(batches),
                  precision="bf16-mixed", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
                  num_sanity_val_steps=0, use_distributed_sampler=False)   # as trainer=fsdp
    if strategy == "fsdp":
        kwargs["strategy"] = FSDP2Strategy(process_group_backend=None if gpu else "gloo")
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    trainable = sum(p.numel() for p in task.parameters() if p.requires_grad)
    total = sum(p.numel() for p in task.parameters())
    trainer = L.Trainer(**kwargs)
    torch.manual_seed(1)             # the same SpecAugment masks under both strategies
    trainer.fit(task, DataLoader(batches, batch_size=None))
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else None
    steady = timer.times[2:] or timer.times
    return {"step_ms": round(1e3 * statistics.median(steady), 1), "losses":
            [round(x, 4) for x in timer.losses], "peak_gib": peak and round(peak, 2),
            "params_m": round(total / 1e6, 1), "trainable_m": round(trainable / 1e6, 2),
            "task": task}


@torch.no_grad()
def generation(task, batches: list, new_tokens: int, device: torch.device) -> dict[str, float]:
    task = task.to(device).eval()
    batch = {k: v.to(device) for k, v in batches[0].items()}
    prompt = {**batch, "input_ids": batch["input_ids"][:, :8],
              "attention_mask": batch["attention_mask"][:, :8]}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
        task.generate(prompt, max_new_tokens=4)                                    # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = task.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        if device.type == "cuda":
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    made = int(out.tokens.shape[0]) * new_tokens
    return {"batch": int(out.tokens.shape[0]), "new_tokens": new_tokens,
            "tokens_per_s": round(made / seconds, 1), "seconds": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke: dim 64, 2 layers")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    sizes = TINY if args.tiny else LLM
    encoder = "audio_tiny" if args.tiny else "audio_base"
    os.environ.setdefault("MASTER_PORT", "29517")
    batches = make_batches(args.steps, 2 if args.tiny else args.batch, 2.0 if args.tiny else 10.0,
                           32 if args.tiny else 96, 8 if args.tiny else 32, sizes["vocab_size"])
    if not args.tiny:
        torch.set_float32_matmul_precision("high")
    runs = {}
    for strategy in ("plain", "fsdp"):
        runs[strategy] = train(strategy, sizes, encoder, batches, args.tiny)
        print(f"{strategy}: {runs[strategy]['params_m']} M params "
              f"({runs[strategy]['trainable_m']} M trainable), step {runs[strategy]['step_ms']} "
              f"ms, peak {runs[strategy]['peak_gib']} GiB, losses {runs[strategy]['losses']}",
              flush=True)
    task = runs["plain"].pop("task")
    runs["fsdp"].pop("task")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    gen = generation(task, batches, 8 if args.tiny else 64, device)
    diff = max(abs(a - b) for a, b in zip(runs["plain"]["losses"], runs["fsdp"]["losses"]))
    print("| | plain bf16-mixed | FSDP2 (1 rank) bf16-mixed |\n|---|---|---|")
    for key in ("step_ms", "peak_gib", "losses"):
        print(f"| {key} | {runs['plain'][key]} | {runs['fsdp'][key]} |")
    print(f"max |loss difference| {diff:.4f}; generation {gen}")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else describe_cpu()}")
    print(json.dumps(append_result(__file__, {
        "plain": runs["plain"], "fsdp": runs["fsdp"], "max_loss_diff": round(diff, 5),
        "generation": gen, "tiny": args.tiny, "device": str(device)})))


if __name__ == "__main__":
    main()
