"""Whisper (Radford et al. 2022, arXiv:2212.04356) in mmtf's own modules.

A Hugging Face Whisper folder or hub id becomes an :class:`mmtf.encoders.AudioEncoder` and a
:class:`mmtf.decoders.TextDecoder` in Whisper's configuration: ``config.json`` -> constructor
arguments (a size also given in the YAML must agree), and a name table read both ways
(:func:`encoder_links`, :func:`decoder_links`; keys and values fused into ``to_kv``, the value
bias kept as ``v_bias``); :func:`export_hf` writes the Hugging Face layout. Why:
docs/design/whisper-import.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from mmtf.decoders.text import TextDecoder
from mmtf.encoders.audio import AudioEncoder
from mmtf.errors import UserError
from mmtf.hub import CONFIG_FILE, WEIGHTS_FILE, HFModel, is_export, open_export, open_hf_model
from mmtf.pretrained.names import (
    TIED,
    Link,
    block_links,
    copy_weights,
    export_tensors,
    link,
    write_tokenizer_files,
)
from mmtf.utils.parts import flatten_parts, nest

log = logging.getLogger(__name__)
MODEL_TYPES = frozenset({"whisper"})
# Whisper's fixed front end (whisper/audio.py): 16 kHz, 25 ms window, 10 ms hop, 30 s windows.
SAMPLE_RATE, N_FFT, HOP_LENGTH = 16000, 400, 160
STEM_STRIDES = (1, 2)
# Architecture settings every Whisper size shares.
BLOCK = {"bias": "qvo", "mlp": "gelu", "norm": "layernorm", "norm_eps": 1e-5}
# The original module of each role of a block (names.block_links); cross_* in decoders only.
NAMES = {"norm_self": "self_attn_layer_norm", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
         "v": "self_attn.v_proj", "out": "self_attn.out_proj", "norm_mlp": "final_layer_norm",
         "fc_in": "fc1", "fc_out": "fc2", "norm_cross": "encoder_attn_layer_norm",
         "cross_q": "encoder_attn.q_proj", "cross_k": "encoder_attn.k_proj",
         "cross_v": "encoder_attn.v_proj", "cross_out": "encoder_attn.out_proj"}


def encoder_sizes(model: HFModel, owner: str) -> dict[str, Any]:
    """AudioEncoder sizes from a Whisper ``config.json``."""
    d = model.field("d_model", owner=owner)
    positions = model.field("max_source_positions", owner=owner)
    return {"dim": d, "depth": model.field("encoder_layers", owner=owner),
            "num_heads": model.field("encoder_attention_heads", owner=owner),
            "mlp_ratio": model.field("encoder_ffn_dim", owner=owner) / d,
            "n_mels": model.field("num_mel_bins", owner=owner),
            # positions * 2 (conv2's stride) frames of HOP_LENGTH samples: 30 s for 1500.
            "max_seconds": positions * STEM_STRIDES[1] * HOP_LENGTH / SAMPLE_RATE}


def decoder_sizes(model: HFModel, owner: str) -> dict[str, Any]:
    """TextDecoder sizes from a Whisper ``config.json``."""
    d = model.field("d_model", owner=owner)
    return {"vocab_size": model.field("vocab_size", owner=owner), "dim": d,
            "depth": model.field("decoder_layers", owner=owner),
            "num_heads": model.field("decoder_attention_heads", owner=owner),
            "mlp_ratio": model.field("decoder_ffn_dim", owner=owner) / d, "context_dim": d,
            "max_len": model.field("max_target_positions", owner=owner),
            "pad_id": model.field("pad_token_id", owner=owner)}


def whisper_encoder(*, pretrained: str | Path | None = None, dim: int | None = None,
                    depth: int | None = None, num_heads: int | None = None,
                    mlp_ratio: float | None = None, n_mels: int | None = None,
                    max_seconds: float | None = None, pad_to_seconds: float | None = 30.0,
                    freeze: bool = False, **options: Any) -> AudioEncoder:
    """An :class:`AudioEncoder` in Whisper's configuration, with Whisper's weights if given.

    Args:
        pretrained: a Whisper folder / hub id, an mmtf export of such an encoder, or None
            (random weights; sizes from the YAML).
        dim, depth, num_heads, mlp_ratio, n_mels, max_seconds: sizes; None = from the model.
        pad_to_seconds: 30 = Whisper's padding; None = mmtf's padding mask.
        freeze: freeze after loading.
        **options: other :class:`AudioEncoder` arguments.

    Raises:
        UserError: the folder is missing, not Whisper, incomplete, or a size disagrees.
    """
    owner = "model.encoder (whisper_encoder)"
    given = {"dim": dim, "depth": depth, "num_heads": num_heads, "mlp_ratio": mlp_ratio,
             "n_mels": n_mels, "max_seconds": max_seconds}
    hf, sizes = _sizes(pretrained, given, encoder_sizes, owner)
    if pad_to_seconds is not None and sizes["max_seconds"] is None:
        sizes["max_seconds"] = pad_to_seconds
    export = pretrained if pretrained is not None and hf is None else None
    encoder = AudioEncoder(**nest(
        "mmtf.encoders.AudioEncoder", **sizes, **BLOCK, **options, positions="sinusoidal",
        features="whisper", stem_strides=STEM_STRIDES, pad_to_seconds=pad_to_seconds,
        sample_rate=SAMPLE_RATE, n_fft=N_FFT, hop_length=HOP_LENGTH, pretrained=export))
    if hf is not None:
        tensors = hf.tensors()
        prefix = hf.prefix("encoder.conv1.weight", owner=owner)
        table = _checked_positions(encoder, tensors, f"{prefix}encoder.embed_positions.weight",
                                   hf, owner)
        computed = [k for k, _ in encoder.named_buffers()]      # mel filters, window, table
        copy_weights(encoder, tensors, encoder_links(prefix, encoder.stack.depth), owner=owner,
                     source=str(hf.folder), keep_initialised=computed)
        with torch.no_grad():   # the checkpoint's float32 sinusoids, as the weights were trained
            encoder.positions.weight[:table.shape[0]].copy_(table)
    if freeze:
        encoder.freeze()
    return encoder


def whisper_decoder(*, pretrained: str | Path | None = None, vocab_size: int | None = None,
                    dim: int | None = None, depth: int | None = None,
                    num_heads: int | None = None, mlp_ratio: float | None = None,
                    context_dim: int | None = None, max_len: int | None = None,
                    pad_id: int | None = None, freeze: bool = False,
                    **options: Any) -> TextDecoder:
    """A :class:`TextDecoder` in Whisper's configuration, with Whisper's weights if given.

    Args:
        pretrained: a Whisper folder / hub id, an mmtf export of such a decoder, or None.
        vocab_size, dim, depth, num_heads, mlp_ratio, context_dim, max_len, pad_id: None =
            from the model.
        freeze: no trainable parameters, eval mode (for :func:`mmtf.export.load_exported`).
        **options: other :class:`TextDecoder` arguments.

    Raises:
        UserError: as :func:`whisper_encoder`.
    """
    owner = "model.decoder (whisper_decoder)"
    given = {"vocab_size": vocab_size, "dim": dim, "depth": depth, "num_heads": num_heads,
             "mlp_ratio": mlp_ratio, "context_dim": context_dim, "max_len": max_len,
             "pad_id": pad_id}
    hf, sizes = _sizes(pretrained, given, decoder_sizes, owner)
    decoder = TextDecoder(**nest("mmtf.decoders.TextDecoder", **sizes, **BLOCK, **options,
                                 positions="learned", tie_embeddings=True))
    if pretrained is not None and hf is None:             # an mmtf export (weights.safetensors)
        export = open_export(pretrained, owner=owner, key="model.decoder.pretrained")
        decoder.load_state_dict(export.tensors(), strict=True)
    elif hf is not None:
        prefix = hf.prefix("decoder.embed_tokens.weight", owner=owner)
        copy_weights(decoder, hf.tensors(), decoder_links(prefix, decoder.depth), owner=owner,
                     source=str(hf.folder))
    if freeze:
        decoder.requires_grad_(False).eval()
    return decoder


def resolved_sizes(part: str, module: AudioEncoder | TextDecoder) -> dict[str, Any]:
    """The sizes a built part was given (from ``config.json``), by builder argument."""
    if part == "encoder":
        return {k: module.config[k] for k in ("dim", "depth", "num_heads", "mlp_ratio", "n_mels",
                                              "max_seconds")}
    block = module.stack.blocks[0]
    return {"vocab_size": module.vocab_size, "dim": module.dim, "depth": module.depth,
            "num_heads": block.self_attn.num_heads,
            "mlp_ratio": block.mlp.fc_in.out_features / module.dim,
            "context_dim": module.context_dim, "max_len": module.max_len,
            "pad_id": module.pad_id}


def export_hf(task: Any, out: Path) -> None:
    """Write a task's Whisper-architecture model as ``WhisperForConditionalGeneration`` saves
    it, with its tokenizer files; then import it back and check every tensor.

    Raises:
        UserError: the pair is not in Whisper's configuration, or its tokenizer not Whisper's.
    """
    from mmtf.text import PretrainedTokenizer

    encoder, decoder, tokenizer = task.model.encoder, task.model.decoder, task.tokenizer
    if not isinstance(tokenizer, PretrainedTokenizer):
        raise UserError(f"export format=hf: the checkpoint's tokenizer is "
                        f"{type(tokenizer).__name__}, not Whisper's (tokenizer="
                        f"pretrained); transformers could not read its captions.")
    config, tensors = whisper_state(encoder, decoder)
    ids = {"pad_token_id": tokenizer.pad_id, "bos_token_id": tokenizer.bos_id,
           "eos_token_id": tokenizer.eos_id, "decoder_start_token_id": tokenizer.prompt_ids[0]}
    config.update(ids)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    # The source folder's own rules (suppressed tokens, languages, tasks) as the tokenizer
    # kept them; a tokenizer stored before it kept them has only its ids to give.
    generation = tokenizer.generation_config
    if generation is None:
        log.warning("export format=hf: the checkpoint's tokenizer holds no generation_config."
                    "json of its Whisper folder (stored by an older mmtf, or the folder had "
                    "none): the export's has no token suppression, languages or tasks; copy "
                    "the source folder's generation_config.json into %s", out)
        generation = {**ids, "max_length": decoder.max_len}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    write_tokenizer_files(tokenizer, out, tokenizer_class="WhisperTokenizer",
                          model_max_length=decoder.max_len)
    enc_back, dec_back = whisper_encoder(pretrained=out), whisper_decoder(pretrained=out)
    for ours, back in ((encoder, enc_back), (decoder, dec_back)):
        theirs = back.state_dict()
        for key, value in ours.state_dict().items():
            if key.startswith("frontend.") or (key == "positions.weight" and ours is encoder):
                continue                                 # computed from the config
            if not torch.equal(value.detach().cpu().float(), theirs[key].float()):
                raise RuntimeError(f"export format=hf: {out} does not import back into the "
                                   f"exported weights ({key}).")
    print(f"Exported Whisper ({sum(t.numel() for t in tensors.values()):,} values) to {out}/")


def whisper_state(encoder: AudioEncoder, decoder: TextDecoder,
                  ) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The inverse map: a Whisper ``config.json`` (without token ids) and the tensors by their
    Hugging Face names (``WhisperForConditionalGeneration``'s layout).

    Raises:
        UserError: the pair is not in Whisper's configuration (the setting is named).
    """
    _check_exportable(encoder, decoder)
    tensors = {**export_tensors(encoder.state_dict(), encoder_links("model.", encoder.stack.depth)),
               **export_tensors(decoder.state_dict(), decoder_links("model.", decoder.depth))}
    # Whisper's window: max_samples // hop frames (the last STFT frame dropped), halved by conv2.
    positions = (encoder.max_samples // HOP_LENGTH - 1) // STEM_STRIDES[1] + 1
    tensors["model.encoder.embed_positions.weight"] = encoder.positions.weight[:positions]
    enc, dec = resolved_sizes("encoder", encoder), resolved_sizes("decoder", decoder)
    config = {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": dec["vocab_size"], "num_mel_bins": enc["n_mels"], "d_model": enc["dim"],
        "encoder_layers": enc["depth"], "decoder_layers": dec["depth"],
        "encoder_attention_heads": enc["num_heads"], "decoder_attention_heads": dec["num_heads"],
        "encoder_ffn_dim": round(enc["mlp_ratio"] * enc["dim"]),
        "decoder_ffn_dim": round(dec["mlp_ratio"] * dec["dim"]),
        "max_source_positions": positions, "max_target_positions": dec["max_len"],
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "is_encoder_decoder": True,
    }
    return config, {k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}


# ---------------------------------------------------------------------------- name tables
def part_links(part: str, module: AudioEncoder | TextDecoder, prefix: str = "") -> list[Link]:
    """The name table of a built part in Whisper's configuration (the LoRA adapters' names,
    :mod:`mmtf.pretrained.peft`); ``prefix`` ``model.`` is ``WhisperForConditionalGeneration``'s.

    Raises:
        UserError: the part is not in Whisper's configuration (its key projection has a bias).
    """
    if module.stack.blocks[0].self_attn.to_kv.bias is not None:
        raise UserError(f"model.{part} is not in Whisper's configuration (a key bias).")
    if part == "encoder":
        return encoder_links(prefix, module.stack.depth)
    return decoder_links(prefix, module.depth)


def encoder_links(prefix: str, depth: int) -> list[Link]:
    """The encoder's name table (its fixed position table is checked and copied apart:
    :func:`_checked_positions`), for tensors under ``prefix`` (``model.`` or ``""``)."""
    root = f"{prefix}encoder"
    stem = [link(f"stem.conv{i}.{kind}", f"{root}.conv{i}.{kind}")
            for i in (1, 2) for kind in ("weight", "bias")]
    return stem + stack_links(root, depth, cross=False)


def decoder_links(prefix: str, depth: int) -> list[Link]:
    """The decoder's name table; the output projection (``proj_out``) is tied to the token
    embedding."""
    root = f"{prefix}decoder"
    embed = f"{root}.embed_tokens.weight"
    return [link("embed.weight", embed), link("lm_head.weight", embed, TIED),
            link("positions.weight", f"{root}.embed_positions.weight"),
            *stack_links(root, depth, cross=True)]


def stack_links(root: str, depth: int, *, cross: bool) -> list[Link]:
    """mmtf TransformerStack names (under ``stack.``) as Whisper's, for ``depth`` layers: q/k/v
    become ``to_q`` and the fused ``to_kv`` (no key bias: the value bias is ``v_bias``)."""
    table: list[Link] = []
    for i in range(depth):
        table += block_links(f"stack.blocks.{i}.", f"{root}.layers.{i}.", NAMES,
                             key_bias=False, cross=cross)
    return [*table, link("stack.norm.weight", f"{root}.layer_norm.weight"),
            link("stack.norm.bias", f"{root}.layer_norm.bias")]


# ---------------------------------------------------------------------------- checks
def _sizes(pretrained: str | Path | None, given: dict[str, Any],
           read: Callable[[HFModel, str], dict[str, Any]], owner: str,
           ) -> tuple[HFModel | None, dict[str, Any]]:
    """The Whisper folder (None: no weights, or an mmtf export, whose ``config.yaml`` fills the
    null sizes) and the sizes, ``read`` from its ``config.json``."""
    hf = None
    if pretrained is not None and is_export(pretrained):
        stored = flatten_parts(open_export(pretrained, owner="whisper",
                                           key="model.encoder.pretrained").config())
        given = {k: stored.get(k) if v is None else v for k, v in given.items()}
    elif pretrained is not None:
        hf = open_hf_model(pretrained, model_types=MODEL_TYPES, owner=owner)
    return hf, _merge_sizes(given, read(hf, owner) if hf else None, owner, hf)


def _merge_sizes(given: dict[str, Any], found: dict[str, Any] | None, owner: str,
                 hf: HFModel | None) -> dict[str, Any]:
    """YAML sizes filled from ``config.json``; a YAML size that disagrees is an error."""
    if found is None:
        missing = sorted(k for k, v in given.items() if v is None and k not in (
            "max_seconds", "pad_id", "mlp_ratio"))
        if missing:
            raise UserError(f"{owner}: no pretrained folder and no {', '.join(missing)}; set "
                            f"pretrained=<a Whisper folder or hub id> (the pair; "
                            f"{owner.split()[0]}.pretrained for this part alone), or give the "
                            f"sizes.")
        return {k: v for k, v in given.items() if v is not None}
    for key, value in given.items():
        if value is not None and float(value) != float(found[key]):
            raise UserError(f"{owner}: {owner.split()[0]}.{key} ({value}) disagrees with "
                            f"{hf.folder / CONFIG_FILE} ({found[key]}); remove it from the "
                            f"config (sizes are read from the pretrained model).")
    return found


def _checked_positions(encoder: AudioEncoder, tensors: Mapping[str, Tensor], name: str,
                       hf: HFModel, owner: str) -> Tensor:
    """The stored encoder position table (n, c), used as stored (Whisper's float32 sinusoids,
    which the weights were trained with) once checked to be those sinusoids."""
    if name not in tensors:
        raise UserError(f"{owner}: tensor {name!r} not found in {hf.folder}.")
    stored = tensors[name].float()
    ours = encoder.positions.weight[:stored.shape[0]].float()
    if stored.shape[0] > encoder.positions.num_positions or stored.shape[1] != ours.shape[1]:
        raise UserError(f"{owner}: {name} in {hf.folder} has shape {tuple(stored.shape)} but "
                        f"the encoder's table is {tuple(encoder.positions.weight.shape)}; "
                        f"raise model.encoder.max_seconds.")
    error = float((stored - ours).abs().max())
    if error > 1e-3:
        raise UserError(f"{owner}: {name} in {hf.folder} differs from Whisper's sinusoids by "
                        f"{error:.2e} (max abs); mmtf keeps the encoder positions fixed, so "
                        f"this checkpoint is not a standard Whisper encoder.")
    return stored


def _check_exportable(encoder: AudioEncoder, decoder: TextDecoder) -> None:
    cfg = encoder.config
    rules = {"features": "whisper", "positions": "sinusoidal", "bias": "qvo", "mlp": "gelu",
             "sample_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH}
    for key, value in rules.items():
        if cfg.get(key) != value:
            raise UserError(f"export format=hf: model.encoder.{key} is {cfg.get(key)!r}, not "
                            f"Whisper's {value!r}; only a Whisper-architecture pair exports to "
                            f"the Hugging Face layout.")
    if list(cfg.get("stem_strides", ())) != list(STEM_STRIDES):
        raise UserError(f"export format=hf: model.encoder.stem_strides is "
                        f"{cfg.get('stem_strides')}, not Whisper's {list(STEM_STRIDES)}.")
    if decoder.positions is None or not decoder.tie_embeddings:
        raise UserError("export format=hf: the decoder must have learned positions and tied "
                        "embeddings (model/decoder=whisper_decoder) to export as Whisper.")
