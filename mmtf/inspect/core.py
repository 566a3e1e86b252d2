"""Inspect one input of a captioning checkpoint: caption, cross-attention figures, self-attention
on request, and word-to-time alignment for audio.

Shapes: f mel bins, t frames, h heads, n caption tokens, m memory positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmtf.decoders.align import (
    WordSpan,
    caption_words,
    dtw_path,
    token_time_matrix,
    word_spans,
)
from mmtf.errors import UserError
from mmtf.inspect import plot
from mmtf.inspect.attention import CaptionAttention, caption_attention, layer_indices


@dataclass
class Inspection:
    """What :func:`inspect_input` found and wrote.

    Attributes:
        attention: the caption and its attention maps.
        spans: aligned words (audio; empty for images).
        files: the PNGs written, in order.
    """

    attention: CaptionAttention
    spans: list[WordSpan] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def load_task(ckpt_path: str | Path, device: str = "cpu"):
    """The captioning task of a checkpoint in eval mode, and the config it carries."""
    from mmtf.checkpoint_io import load_checkpoint
    from mmtf.tasks import CaptioningTask
    from mmtf.tasks.rebuild import build_task

    task, stored = build_task(load_checkpoint(ckpt_path), ckpt_path)
    if not isinstance(task, CaptioningTask):
        raise UserError(f"ckpt_path={ckpt_path}: {type(task).__name__} has no encoder-decoder; "
                        f"inspection draws the cross-attention of a captioning checkpoint.")
    return task.to(device).eval(), stored


def is_audio(model) -> bool:
    """Whether the model's encoder takes waveforms (it has a log-mel front end)."""
    from mmtf.encoders import AudioEncoder

    return isinstance(model.encoder, AudioEncoder)


def load_input(path: str | Path, model, data_cfg: dict[str, Any] | None,
               ) -> tuple[Tensor, Tensor | None]:
    """One file as the model's input batch of 1: (1, samples) + (1,) lengths, or (1, 3, H, W)."""
    from mmtf.errors import require_file

    path = Path(path)
    require_file(path, what="input", fix="pass input=<an audio or image file>")
    if is_audio(model):
        from mmtf.data import load_audio

        wave = load_audio(path, sample_rate=model.encoder.sample_rate)
        return wave.reshape(1, -1), torch.tensor([wave.shape[-1]])
    from mmtf.data import build_eval_image_transform, load_image

    return build_eval_image_transform(data_cfg or {})(load_image(path))[None], None


def token_labels(tokenizer, ids: Sequence[int], eos_id: int) -> list[str]:
    """A readable label per token: its decoded text, "<eos>" for eos, the vocabulary entry when
    the token decodes to nothing (a space)."""
    labels = []
    for i in ids:
        if i == eos_id:
            labels.append("<eos>")
            continue
        text = tokenizer.decode([i]).strip()
        labels.append(text or repr(tokenizer.id_to_token(i)))
    return labels


def pick_heads(weights: Tensor, head: int | None, what: str = "head") -> Tensor:
    """(h, n, m) -> (n, m): head ``head``, or the mean over heads when None."""
    if head is None:
        return weights.mean(dim=0)
    if not -weights.shape[0] <= head < weights.shape[0]:
        raise UserError(f"{what}={head} is outside [0, {weights.shape[0]}) (the model has "
                        f"{weights.shape[0]} heads); pick one or null for the mean.")
    return weights[head]


def align_attention(attention: CaptionAttention, tokenizer, seconds_per_position: float, *,
                    layers: Sequence[int], heads: Sequence[int] | None = None,
                    duration: float | None = None, medfilt_width: int = 7,
                    ) -> tuple[list[WordSpan], Tensor, tuple[np.ndarray, np.ndarray]]:
    """Word spans of a caption from its cross-attention (see :mod:`mmtf.decoders.align`).

    Args:
        attention: from :func:`caption_attention`; ``layers`` must be among its cross layers.
        seconds_per_position, duration, medfilt_width: as :func:`mmtf.decoders.align.word_spans`.
        layers, heads: the cross-attention to use (heads None = all).

    Returns the word spans, the (n, m) alignment matrix and the DTW path through it.
    """
    missing = [layer for layer in layers if layer not in attention.cross]
    if missing:
        raise UserError(f"align_layers {missing} were not collected; add them to layers.")
    valid = attention.memory_mask
    stacked = torch.cat([w[:, :, valid] if heads is None else w[list(heads)][:, :, valid]
                         for layer, w in sorted(attention.cross.items()) if layer in layers])
    words = caption_words(tokenizer, attention.text_tokens)
    spans = word_spans(stacked, words, seconds_per_position, duration=duration,
                       medfilt_width=medfilt_width)
    matrix = token_time_matrix(stacked, medfilt_width=medfilt_width)
    return spans, matrix, dtw_path(-matrix.numpy())


def default_align_layers(depth: int) -> list[int]:
    """The upper half of the decoder layers, Whisper's default alignment heads."""
    return list(range(depth // 2, depth))


def align(task, audio: str | Path | Tensor, lengths: Tensor | None = None, *,
          layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
          medfilt_width: int = 7, generation: dict | None = None) -> list[WordSpan]:
    """Words of the caption a checkpoint generates for one clip, with the seconds each spans.

    Args:
        task: a captioning task (``task.model``, ``task.tokenizer``), e.g. from :func:`load_task`.
        audio: an audio file, or a waveform (samples,) / (1, samples) at the encoder's rate.
        lengths: (1,) valid samples of a padded waveform, or None.
        layers, heads: the cross-attention to align with (None: upper half, all heads).
        medfilt_width: median filter width along time (odd; 1 = off).
        generation: options of ``EncoderDecoder.generate`` (default greedy).

    Returns one :class:`WordSpan` per word: ``word``, ``start`` and ``end`` in seconds.
    """
    model = task.model
    if not is_audio(model):
        raise UserError("align: word-to-time alignment needs an audio checkpoint; this one "
                        "has a vision encoder.")
    if isinstance(audio, (str, Path)):
        wave, lengths = load_input(audio, model, None)
    else:
        wave = audio.reshape(1, -1).float()
        lengths = torch.tensor([wave.shape[-1]]) if lengths is None else lengths
    device = next(model.parameters()).device
    wave, lengths = wave.to(device), lengths.to(device)
    layers = (default_align_layers(model.decoder.depth) if layers is None
              else layer_indices(layers, model.decoder.depth, "align_layers"))
    attention = caption_attention(model, wave, lengths, task.tokenizer, cross_layers=layers,
                                  generation=task_generation(task, generation))
    duration = float(lengths[0]) / model.encoder.sample_rate
    spans, _, _ = align_attention(attention, task.tokenizer,
                                  model.encoder.seconds_per_position, layers=layers,
                                  heads=heads, duration=duration, medfilt_width=medfilt_width)
    return spans


def task_generation(task, overrides: dict | None = None) -> dict:
    """The checkpoint's generation settings (``task.generation``) with ``overrides`` on top."""
    return {**(getattr(task, "generation", None) or {}), **(overrides or {})}


def spans_table(spans: Sequence[WordSpan]) -> str:
    """The aligned words as a plain-text table: word, start s, end s."""
    width = max([4, *(len(s.word) for s in spans)])
    lines = [f"{'word':<{width}}  start s  end s", f"{'-' * width}  -------  -----"]
    lines += [f"{s.word:<{width}}  {s.start:7.2f}  {s.end:5.2f}" for s in spans]
    return "\n".join(lines)


def display_image(image: Tensor, data_cfg: dict[str, Any] | None = None) -> np.ndarray:
    """A model input (3, H, W) back to a picture (H, W, 3) in [0, 1].

    The last ``Normalize`` of the data config's ``transforms.eval`` is inverted; without one
    each channel is min-max scaled."""
    x = image.float()
    norm = [t for t in ((data_cfg or {}).get("transforms") or {}).get("eval") or []
            if isinstance(t, dict) and str(t.get("_target_", "")).endswith(".Normalize")]
    if norm:
        mean = torch.tensor(norm[-1]["mean"], dtype=torch.float32)[:, None, None]
        std = torch.tensor(norm[-1]["std"], dtype=torch.float32)[:, None, None]
        x = (x * std + mean).clamp(0.0, 1.0)
    else:
        lo = x.amin(dim=(1, 2), keepdim=True)
        x = (x - lo) / (x.amax(dim=(1, 2), keepdim=True) - lo).clamp_min(1e-8)
    return x.permute(1, 2, 0).numpy()


def _head_name(head: int | None) -> str:
    return "heads averaged" if head is None else f"head {head}"


@torch.no_grad()
def inspection_figures(model, tokenizer, inputs: Tensor, lengths: Tensor | None, *,
                       layers: Sequence[int] | None = None, head: int | None = None,
                       encoder_self: Sequence[int] | None = None,
                       decoder_self: Sequence[int] | None = None, with_alignment: bool = True,
                       align_layers: Sequence[int] | None = None,
                       align_heads: Sequence[int] | None = None, medfilt_width: int = 7,
                       generation: dict | None = None, data_cfg: dict[str, Any] | None = None,
                       ) -> tuple[CaptionAttention, list[WordSpan], dict[str, Any]]:
    """Collect the attention of one input and draw its figures (not yet saved).

    Args:
        model, tokenizer: an EncoderDecoder and its tokenizer; inputs, lengths: a batch of 1.
        layers: decoder layers whose cross-attention to draw (None = all), one panel each.
        head: the head to draw, or None for the mean over heads.
        encoder_self, decoder_self: ``[layer]`` or ``[layer, head]`` of a self-attention map
            to draw as well, or None.
        with_alignment: audio only: align words to time and draw them.
        align_layers, align_heads, medfilt_width: the alignment's, as :func:`align`.
        generation: options of ``EncoderDecoder.generate`` (default greedy).
        data_cfg: the checkpoint's data config, to undo the image normalisation for display.

    Returns the attention, the word spans (empty for images or without alignment) and
    ``{name: Figure}`` (names: "cross", "alignment", "encoder_self", "decoder_self").
    """
    depth = model.decoder.depth
    draw = layer_indices(layers, depth, "layers")
    audio = is_audio(model)
    aligning = audio and with_alignment
    align_at = (default_align_layers(depth) if align_layers is None
                else layer_indices(align_layers, depth, "align_layers"))
    enc_req, dec_req = _self_request(encoder_self, "encoder_self"), _self_request(
        decoder_self, "decoder_self")
    attention = caption_attention(
        model, inputs, lengths, tokenizer,
        cross_layers=sorted(set(draw) | (set(align_at) if aligning else set())),
        decoder_self_layers=dec_req[:1], encoder_self_layers=enc_req[:1], generation=generation)
    labels = token_labels(tokenizer, attention.tokens.tolist(), model.eos_id)
    valid = attention.memory_mask
    figures: dict[str, Any] = {}
    spans: list[WordSpan] = []
    if audio:
        encoder = model.encoder
        spec, frames = encoder.frontend(inputs.float(), lengths)             # (1, f, t)
        spec = spec[0, :, : int(frames[0])].cpu().numpy()
        frame_seconds = encoder.frontend.hop_length / encoder.sample_rate
        duration = float(lengths[0]) / encoder.sample_rate
        step = encoder.seconds_per_position
        maps = {f"cross-attention, decoder layer {layer}, {_head_name(head)}":
                pick_heads(attention.cross[layer], head)[:, valid].numpy() for layer in draw}
        if aligning:
            spans, matrix, path = align_attention(
                attention, tokenizer, step, layers=align_at, heads=align_heads,
                duration=duration, medfilt_width=medfilt_width)
            figures["alignment"] = plot.alignment_figure(
                spec, frame_seconds=frame_seconds, duration=duration, matrix=matrix.numpy(),
                path=path, position_seconds=step, labels=labels, spans=spans,
                caption=attention.caption)
        figures["cross"] = plot.audio_attention_figure(
            spec, frame_seconds=frame_seconds, duration=duration, maps=maps,
            position_seconds=step, labels=labels, caption=attention.caption, spans=spans)
    else:
        encoder = model.encoder
        gh, gw = inputs.shape[-2] // encoder.patch_size, inputs.shape[-1] // encoder.patch_size
        skip = encoder.num_prefix_tokens
        for layer in draw:
            weights = pick_heads(attention.cross[layer], head)                  # (n, m)
            figures[f"cross_layer{layer}"] = plot.image_attention_figure(
                display_image(inputs[0].cpu(), data_cfg), maps=weights[:, skip:].numpy(), grid=(gh, gw),
                labels=labels, caption=attention.caption,
                title=f"cross-attention, decoder layer {layer}, {_head_name(head)}",
                prefix_weight=weights[:, :skip].sum(-1).numpy() if skip else None)
    if dec_req:
        layer, dec_head = dec_req[0], dec_req[1] if len(dec_req) > 1 else None
        # Both axes are the decoder's input tokens, [bos] + caption without its last token:
        # query t reads input t and attends to inputs 0..t.
        figures["decoder_self"] = plot.self_attention_figure(
            pick_heads(attention.decoder_self[layer % depth], dec_head, "decoder_self head"
                       ).numpy(), labels=["<bos>", *labels[:-1]],
            title=f"decoder self-attention, layer {layer % depth}, {_head_name(dec_head)}")
    if enc_req:
        layer, enc_head = enc_req[0], enc_req[1] if len(enc_req) > 1 else None
        weights = pick_heads(next(iter(attention.encoder_self.values())), enc_head,
                             "encoder_self head")[valid][:, valid].numpy()
        figures["encoder_self"] = plot.self_attention_figure(
            weights, position_seconds=model.encoder.seconds_per_position if audio else None,
            axis_name="patch (row-major, CLS = 0)" if getattr(model.encoder, "has_cls", False)
            else "patch (row-major)",
            title=f"encoder self-attention, layer {layer}, {_head_name(enc_head)}")
    return attention, spans, figures


def _self_request(value: Sequence[int] | None, key: str) -> list[int]:
    """``[layer]`` or ``[layer, head]`` from the config, checked for its length."""
    if value is None:
        return []
    value = [int(v) for v in value]
    if len(value) not in (1, 2):
        raise UserError(f"{key}={value} must be [layer] (heads averaged) or [layer, head].")
    return value


def inspect_input(task, inputs: Tensor, lengths: Tensor | None, out_dir: str | Path, *,
                  name: str = "inspect", **options) -> Inspection:
    """Draw and save the figures of one input (see :func:`inspection_figures` for options).

    Writes ``{name}_{figure}.png`` into ``out_dir`` and, for audio, ``{name}_words.tsv``."""
    device = next(task.model.parameters()).device
    inputs = inputs.to(device)
    lengths = None if lengths is None else lengths.to(device)
    options["generation"] = task_generation(task, options.get("generation"))
    attention, spans, figures = inspection_figures(task.model, task.tokenizer, inputs, lengths,
                                                   **options)
    out_dir = Path(out_dir)
    files = [plot.save(fig, out_dir / f"{name}_{key}.png") for key, fig in figures.items()]
    if spans:
        rows = ["word\tstart_s\tend_s", *(f"{s.word}\t{s.start:.3f}\t{s.end:.3f}" for s in spans)]
        (out_dir / f"{name}_words.tsv").write_text("\n".join(rows) + "\n")
    return Inspection(attention=attention, spans=spans, files=files)
