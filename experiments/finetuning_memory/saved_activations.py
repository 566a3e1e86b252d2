"""What the forward pass keeps for backward, per configuration of run.py (one clip of 30 s).

Counts the bytes of every tensor autograd saves during the captioner's forward
(``torch.autograd.graph.saved_tensors_hooks``), each storage once, parameters left out: the
activation memory without the allocator's temporaries and slack that run.py's RSS peak also
holds. Same model and configurations as run.py.

    OMP_NUM_THREADS=1 python experiments/finetuning_memory/saved_activations.py [--size tiny]

Prints one line per configuration and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import CONF, CONFIGS, SIZES, write_whisper  # noqa: E402

from mmtf.perf.results import append_result


def saved_bytes(folder: Path, name: str) -> int:
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=audio_captioning_clotho_whisper",
                                          f"pretrained={folder}", *CONFIGS[name]])
    torch.manual_seed(0)
    model = instantiate(cfg.model).model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    audio, tokens = 0.1 * torch.randn(1, 30 * 16000), torch.randint(3, 50000, (1, 32))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(audio, torch.full((1,), 30 * 16000), tokens)
    return sum(n for ptr, n in seen.items() if ptr not in params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "whisper"
        write_whisper(folder, args.size)
        for name in CONFIGS:
            rows[name] = saved_bytes(folder, name) / 2**20
            print(f"{name}: {rows[name]:.0f} MiB saved for backward (1 clip)", flush=True)
    print(json.dumps(append_result(__file__, {"size": args.size, "saved_mib_per_clip": rows})))


if __name__ == "__main__":
    main()
