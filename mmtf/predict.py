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

from mmtf.utils.checkpoint import build_task, load_checkpoint
from mmtf.utils.config import run_cli

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".mp3"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def expand_inputs(inputs: Iterable[str], suffixes: set[str]) -> list[Path]:
    """Files as given, folders expanded (sorted, recursive) to files with ``suffixes``."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in suffixes)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"input {path} does not exist; pass files or folders of "
                                    f"{'/'.join(sorted(suffixes))}.")
    if not files:
        raise ValueError(f"no input files found in {list(inputs)}.")
    return files


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _audio_batch(paths: Sequence[Path], sample_rate: int) -> tuple[torch.Tensor, torch.Tensor]:
    from mmtf.data import load_audio

    waves = [load_audio(p, sample_rate=sample_rate) for p in paths]
    lengths = torch.tensor([w.shape[-1] for w in waves])
    batch = torch.zeros(len(waves), int(lengths.max()))                   # (b, samples)
    for i, w in enumerate(waves):
        batch[i, : w.shape[-1]] = w
    return batch, lengths


def _image_batch(paths: Sequence[Path], transform) -> torch.Tensor:
    from mmtf.data import load_image

    return torch.stack([transform(load_image(p)) for p in paths])       # (b, 3, h, w)


@torch.no_grad()
def predict(ckpt_path: str, inputs: Sequence[str], generation: dict | None = None,
            batch_size: int = 8, device: str = "cpu") -> list[dict[str, Any]]:
    """Caption (or classify) ``inputs`` with a checkpoint; one dict per input file."""
    checkpoint = load_checkpoint(ckpt_path)
    task, stored = build_task(checkpoint, ckpt_path)
    task = task.to(device).eval()
    if generation and hasattr(task, "generation"):
        task.generation.update({k: v for k, v in generation.items() if v is not None})
    encoder = task.model.encoder if hasattr(task, "model") else task.encoder
    is_audio = hasattr(encoder, "sample_rate")
    files = expand_inputs(inputs, AUDIO_SUFFIXES if is_audio else IMAGE_SUFFIXES)
    transform = None
    if not is_audio:
        from mmtf.data import build_eval_image_transform

        transform = build_eval_image_transform(stored["data"])
    results: list[dict[str, Any]] = []
    for chunk in _batches(files, batch_size):
        if is_audio:
            x, lengths = _audio_batch(chunk, encoder.sample_rate)
            x, lengths = x.to(device), lengths.to(device)
        else:
            x, lengths = _image_batch(chunk, transform).to(device), None
        if hasattr(task, "generate_captions"):
            outputs = task.generate_captions(x, lengths)
            results += [{"path": str(p), "caption": c} for p, c in zip(chunk, outputs)]
        else:
            names = (stored.get("class_names") or [])
            preds = task(x, lengths).argmax(-1).tolist()
            results += [{"path": str(p), "label": int(k),
                         "class": names[k] if k < len(names) else str(k)}
                        for p, k in zip(chunk, preds)]
    return results


def _print_predictions(cfg: DictConfig) -> None:
    inputs = cfg.inputs if OmegaConf.is_list(cfg.inputs) else [cfg.inputs]
    device = "cuda" if cfg.accelerator in ("auto", "gpu") and torch.cuda.is_available() else "cpu"
    generation = OmegaConf.to_container(cfg.generation, resolve=True) if cfg.generation else None
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
