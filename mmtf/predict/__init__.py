"""`python -m mmtf.predict ckpt_path=... inputs=[a.wav,b.flac]` (files and/or folders).

Prints one caption (or class name) per input: ``path<TAB>caption`` (``format=tsv``), JSON lines
(``format=json``; timed segments carry openai's ``avg_logprob``, ``no_speech_prob``,
``compression_ratio`` and ``temperature``), or subtitles of the timed segments (``format=srt|vtt``, printed or written to
``output_dir``). Long audio follows ``long_audio`` (:mod:`mmtf.predict.inputs`). ``ckpt_path``
may be a Hugging Face Whisper folder or hub id (zero-shot).

`python -m mmtf.predict ckpt_path=<LLM folder> prompts=[...] format=json` continues text
prompts (or conversations) with a pretrained LLM (Llama, Qwen2, Qwen3) instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from mmtf.data.audio import AUDIO_EXTENSIONS
from mmtf.data.image import IMAGE_EXTENSIONS
from mmtf.errors import UserError, require_file
from mmtf.predict.inputs import WHOLE, LongAudio, check_long_audio, predict_inputs
from mmtf.predict.model import load
from mmtf.predict.subtitles import FORMATS as SUBTITLE_FORMATS
from mmtf.predict.subtitles import subtitles
from mmtf.utils.config import generation_overrides, require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import share_cpu

OUTPUT_FORMATS = ("tsv", "json", *SUBTITLE_FORMATS)


def expand_inputs(inputs: Iterable[str], extensions: Sequence[str], *,
                  key: str = "inputs") -> list[Path]:
    """Files as given, folders expanded (sorted, recursive) to files with ``extensions``;
    ``key`` is the config key named when none is found."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in extensions)
        else:
            files.append(require_file(path, what="input", fix=f"pass files or folders of "
                                      f"{'/'.join(sorted(extensions))}"))
    if not files:
        raise UserError(f"{key}: no {'/'.join(sorted(extensions))} files found in "
                        f"{list(inputs)}.")
    return files


def predict(ckpt_path: str, inputs: Sequence[str], generation: dict | None = None,
            batch_size: int = 8, device: str = "cpu", long_audio: LongAudio = "crop", *,
            use_ema: bool = False) -> list[dict[str, Any]]:
    """Caption (or classify) ``inputs`` with a checkpoint (its EMA weights with ``use_ema``);
    rows as :func:`mmtf.predict.inputs.predict_inputs` returns them."""
    check_long_audio(long_audio)
    generation = dict(generation or {})
    if long_audio in WHOLE:
        generation["long_form"] = long_audio
    model, _ = load(ckpt_path, device=device, use_ema=use_ema, **generation)
    if model.task.modality == "text":
        raise UserError(f"inputs: ckpt_path={ckpt_path} is a language model; it continues "
                        f"prompts='[\"text\", ...]', not inputs=[files].")
    extensions = AUDIO_EXTENSIONS if model.task.modality == "audio" else IMAGE_EXTENSIONS
    files = expand_inputs(inputs, extensions)
    return predict_inputs(model.task, files, batch_size=batch_size, long_audio=long_audio)


def format_row(row: dict[str, Any]) -> str:
    """``path<TAB>caption`` (or class name); windows add ``<TAB>start-end`` after the path."""
    text = row["caption"] if "caption" in row else row["class"]
    span = f"\t{row['start']:.2f}-{row['end']:.2f}" if "start" in row else ""
    return f"{row['path']}{span}\t{text}"


def write_subtitles(rows: list[dict[str, Any]], fmt: str, output_dir: str | None) -> None:
    """Each input's segments as an ``fmt`` document: printed, or written to
    ``output_dir/<input name>.<fmt>`` (the path is printed)."""
    missing = [row["path"] for row in rows if "segments" not in row]
    if missing:
        raise UserError(f"format={fmt} needs timed segments, and {missing[0]} has none; add "
                        f"generation.timestamps=true (or long_audio=sequential) with a Whisper "
                        f"model.")
    for row in rows:
        text = subtitles(row["segments"], fmt)
        if output_dir is None:
            print(text)
            continue
        out = Path(output_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{Path(row['path']).stem}.{fmt}"
        path.write_text(text, encoding="utf-8")
        print(path)


def print_continuations(cfg: DictConfig) -> None:
    """The CLI with ``prompts=[...]`` and an LLM folder: one continuation per prompt, as JSON
    lines (``{"prompt", "text"}``) or ``prompt<TAB>text``."""
    fmt = cfg.get("format", "tsv")
    if fmt not in ("tsv", "json"):
        raise UserError(f"format={fmt!r}: prompts print as tsv or json.")
    if not OmegaConf.is_missing(cfg, "inputs"):
        raise UserError("prompts and inputs are both set; an LLM folder continues prompts=[...], "
                        "a captioner reads inputs=[...]: set one.")
    prompts = OmegaConf.to_container(cfg.prompts, resolve=True)
    prompts = prompts if isinstance(prompts, list) else [prompts]
    device = "cuda" if cfg.accelerator in ("auto", "gpu") and torch.cuda.is_available() else "cpu"
    model, _ = load(cfg.ckpt_path, device=device)
    if not hasattr(model.task, "generate_text"):
        raise UserError(f"prompts=[...]: ckpt_path={cfg.ckpt_path} is no LLM folder (llama, "
                        f"qwen2, qwen3); pass inputs=[files] to caption them.")
    generation = generation_overrides(cfg.get("generation"))
    texts = model.generate_text(prompts, batch_size=cfg.batch_size, **generation)
    for prompt, text in zip(prompts, texts, strict=True):
        shown = prompt if isinstance(prompt, str) else json.dumps(prompt)
        print(json.dumps({"prompt": prompt, "text": text}) if fmt == "json"
              else f"{shown}\t{text}")


def print_predictions(cfg: DictConfig) -> None:
    """The CLI: predict ``cfg.inputs`` and print one line per prediction."""
    if cfg.get("prompts") is not None:
        require_values(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "inputs"]))
        share_cpu(cfg.get("cpu_sharing"))
        print_continuations(cfg)
        return
    require_values(cfg)
    share_cpu(cfg.get("cpu_sharing"))
    fmt = cfg.get("format", "tsv")
    if fmt not in OUTPUT_FORMATS:
        raise UserError(f"format={fmt!r} must be one of {', '.join(OUTPUT_FORMATS)}.")
    inputs = cfg.inputs if OmegaConf.is_list(cfg.inputs) else [cfg.inputs]
    device = "cuda" if cfg.accelerator in ("auto", "gpu") and torch.cuda.is_available() else "cpu"
    generation = generation_overrides(cfg.get("generation"))
    rows = predict(cfg.ckpt_path, [str(i) for i in inputs], generation, cfg.batch_size, device,
                   long_audio=cfg.get("long_audio", "crop"), use_ema=bool(cfg.get("use_ema")))
    if fmt in SUBTITLE_FORMATS:
        write_subtitles(rows, fmt, cfg.get("output_dir"))
        return
    for row in rows:
        print(json.dumps(row) if fmt == "json" else format_row(row))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="predict")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(print_predictions, cfg)


def main() -> None:
    """Console entry point (``mmtf-predict``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
