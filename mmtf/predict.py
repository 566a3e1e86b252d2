"""`python -m mmtf.predict ckpt_path=... inputs=[a.wav,b.flac]` (files and/or folders).

Prints one caption (or class) per input: ``path<TAB>caption``, or one JSON object per line with
``json=true``. Audio is decoded with soundfile and resampled to the encoder's rate; images go
through the checkpoint's evaluation transforms.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from mmtf.data.audio import AUDIO_EXTENSIONS, load_audio
from mmtf.data.collate import pad_1d
from mmtf.data.image import IMAGE_EXTENSIONS, build_eval_image_transform, load_image
from mmtf.errors import UserError, require_file
from mmtf.utils.checkpoint import build_task, load_checkpoint
from mmtf.utils.config import generation_overrides, require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR


def expand_inputs(inputs: Iterable[str], extensions: Sequence[str]) -> list[Path]:
    """Files as given, folders expanded (sorted, recursive) to files with ``extensions``."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in extensions)
        else:
            files.append(require_file(path, what="input", fix=f"pass files or folders of "
                                      f"{'/'.join(sorted(extensions))}"))
    if not files:
        raise UserError(f"inputs: no {'/'.join(sorted(extensions))} files found in "
                        f"{list(inputs)}.")
    return files


@torch.no_grad()
def predict(ckpt_path: str, inputs: Sequence[str], generation: dict | None = None,
            batch_size: int = 8, device: str = "cpu") -> list[dict[str, Any]]:
    """Caption (or classify) ``inputs`` with a checkpoint; one dict per input file
    (``path`` plus the task's :meth:`~mmtf.tasks.Task.predict_batch` keys)."""
    task, stored = build_task(load_checkpoint(ckpt_path), ckpt_path)
    task = task.to(device).eval()
    task.update_generation(generation or {})
    audio = task.modality == "audio"
    files = expand_inputs(inputs, AUDIO_EXTENSIONS if audio else IMAGE_EXTENSIONS)
    transform = None if audio else build_eval_image_transform(stored["data"])
    results: list[dict[str, Any]] = []
    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        if audio:
            waves = [load_audio(p, sample_rate=task.encoder.sample_rate) for p in chunk]
            x, lengths = pad_1d(waves, dtype=torch.float32)                # (b, samples)
            x, lengths = x.to(device), lengths.to(device)
        else:
            x = torch.stack([transform(load_image(p)) for p in chunk]).to(device)  # (b, 3, h, w)
            lengths = None
        results += [{"path": str(p), **row} for p, row in zip(chunk, task.predict_batch(x, lengths))]
    return results


def _print_predictions(cfg: DictConfig) -> None:
    require_values(cfg)
    inputs = cfg.inputs if OmegaConf.is_list(cfg.inputs) else [cfg.inputs]
    device = "cuda" if cfg.accelerator in ("auto", "gpu") and torch.cuda.is_available() else "cpu"
    generation = generation_overrides(cfg.get("generation"))
    for row in predict(cfg.ckpt_path, [str(i) for i in inputs], generation, cfg.batch_size, device):
        if cfg.json:
            print(json.dumps(row))
        else:
            print(f"{row['path']}\t{row.get('caption', row.get('class'))}")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="predict")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(_print_predictions, cfg)


def main() -> None:
    """Console entry point (``mmtf-predict``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
