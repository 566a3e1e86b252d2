"""What LoRA saves when fine-tuning Whisper: parameter and AdamW-state memory, and a measured peak.

``python lora_memory.py counts``: for whisper-small and whisper-large-v3, the parameters of
mmtf's Whisper pair built from the architectures' sizes (config.json's dims, written below; no
download: the modules are built on the meta device, so nothing is allocated) and the LoRA
adapters that ``model/lora=default`` adds (r 8, targets q, k, v, o, mlp, both parts); then the
training memory of the weights, gradients and AdamW's two moments in float32:

* full fine-tuning: 4 bytes x P (weights) + 4 x P (gradients) + 8 x P (exp_avg, exp_avg_sq);
* LoRA: 4 x P (the frozen base: no gradient, no optimizer state) + 16 x L (the adapters).

Activations are not in these numbers (they depend on batch and clip length, and are about the
same for both: LoRA keeps the adapters' small inputs as well).

``python lora_memory.py measure``: the peak resident memory (``ru_maxrss``) of a few AdamW
training steps of a random whisper-tiny-architecture pair on the CPU, once fully fine-tuned and
once with LoRA, each in its own interpreter; the peak minus the memory before the model was
built. Run it with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmtf.nn.lora import LoRAConfig, add_lora  # noqa: E402
from mmtf.perf.results import append_result  # noqa: E402
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder  # noqa: E402

# config.json of openai/whisper-* (d_model, layers, heads, ffn, mel bins, vocabulary).
ARCHITECTURES = {
    "whisper-tiny": dict(dim=384, depth=4, heads=6, ffn=1536, n_mels=80, vocab=51865),
    "whisper-small": dict(dim=768, depth=12, heads=12, ffn=3072, n_mels=80, vocab=51865),
    "whisper-large-v3": dict(dim=1280, depth=32, heads=20, ffn=5120, n_mels=128, vocab=51866),
}
LORA = LoRAConfig(r=8, alpha=16, dropout=0.05, targets=("q", "k", "v", "o", "mlp"))
GIB = 1024 ** 3


def build(name: str, lora: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    a = ARCHITECTURES[name]
    encoder = whisper_encoder(dim=a["dim"], depth=a["depth"], num_heads=a["heads"],
                              mlp_ratio=a["ffn"] / a["dim"], n_mels=a["n_mels"],
                              max_seconds=30.0, pad_to_seconds=None)
    decoder = whisper_decoder(vocab_size=a["vocab"], dim=a["dim"], depth=a["depth"],
                              num_heads=a["heads"], mlp_ratio=a["ffn"] / a["dim"],
                              context_dim=a["dim"], max_len=448, pad_id=a["vocab"] - 1)
    if lora:
        for part, module in (("encoder", encoder), ("decoder", decoder)):
            add_lora(module, LORA, owner=f"model.{part}")
    return encoder, decoder


def counts() -> None:
    print("| model | parameters P | LoRA adapters L (r 8, q k v o mlp) | full FT: weights + "
          "grads + AdamW (16 P bytes) | LoRA (4 P + 16 L bytes) | saved |")
    print("|---|---|---|---|---|---|")
    for name in ("whisper-small", "whisper-large-v3"):
        with torch.device("meta"):
            parts = build(name, lora=True)
        params = [(n, p) for m in parts for n, p in m.named_parameters()]
        adapters = sum(p.numel() for n, p in params if ".lora_" in n)
        base = sum(p.numel() for n, p in params if ".lora_" not in n)
        full, lora = 16 * base, 4 * base + 16 * adapters
        print(f"| {name} | {base / 1e6:.1f} M | {adapters / 1e6:.2f} M ({100 * adapters / base:.2f} %)"
              f" | {full / GIB:.2f} GiB | {lora / GIB:.2f} GiB | {(full - lora) / GIB:.2f} GiB "
              f"({100 * (full - lora) / full:.0f} %) |")


def rss_gib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB


def steps(mode: str, n: int = 3) -> dict[str, float]:
    """A few AdamW steps of the random whisper-tiny pair, full (mode "full") or LoRA."""
    torch.manual_seed(0)
    before = rss_gib()
    encoder, decoder = build("whisper-tiny", lora=mode == "lora")
    modules = [encoder, decoder]
    if mode == "lora":
        for m in modules:
            m.requires_grad_(False)
            for name, p in m.named_parameters():
                p.requires_grad_(".lora_" in name)
    trainable = [p for m in modules for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        wave = torch.randn(4, 2 * 16000, generator=g)              # four 2 s clips
        tokens = torch.randint(0, 51865, (4, 24), generator=g)
        out = encoder(wave, torch.full((4,), 2 * 16000))
        logits = decoder(tokens[:, :-1], out.memory, out.mask)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2     # KiB -> GiB
    return {"mode": mode, "trainable": sum(p.numel() for p in trainable),
            "peak_gib": peak, "before_gib": before, "peak_minus_before_gib": peak - before}


def measure() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for mode in ("full", "lora"):
        done = subprocess.run([sys.executable, __file__, "_steps", mode], env=env,
                              capture_output=True, text=True, check=True)
        print(json.dumps(append_result(__file__, json.loads(done.stdout.strip().splitlines()[-1]))))


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "counts"
    if command == "counts":
        counts()
    elif command == "measure":
        measure()
    elif command == "_steps":
        print(json.dumps(steps(sys.argv[2])))
    else:
        sys.exit(f"usage: python {Path(__file__).name} counts | measure")
