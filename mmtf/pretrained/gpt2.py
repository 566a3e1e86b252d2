"""GPT-2 (Radford et al. 2019) as mmtf's ``TextDecoder``, with cross-attention to an encoder.

A ``TextDecoder`` with ``positions="learned"``, ``bias=True``, ``mlp="gelu_tanh"`` and a tied head.
Cross-attention is added newly initialised (as ``VisionEncoderDecoderModel`` does) or read when
the folder has it. The name table (:func:`links`) serves import (:func:`load_hf_gpt2`) and export
(:func:`hf_state_dict`, :func:`hf_config`, :func:`export_hf`); ``Conv1D`` weights are (in, out)
and ``c_attn`` fuses q, k, v. Why: docs/design/vision-gpt2-import.md.

Shapes: c = n_embd, c_ctx = the encoder width, v = vocab_size, n = n_positions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from mmtf.decoders.text import TextDecoder
from mmtf.errors import UserError
from mmtf.hub import CONFIG_FILE, WEIGHTS_FILE, HFModel, is_hf_source, open_export, open_hf_model
from mmtf.nn.lora import mark_new
from mmtf.nn.transformer import MlpKind
from mmtf.pretrained.names import (
    SAME,
    TIED,
    TRANSPOSED,
    Link,
    Rule,
    copy_weights,
    export_tensors,
    fill_sizes,
    link,
    original_names,
    write_tokenizer_files,
)
from mmtf.utils.parts import nest

MODEL_TYPES = frozenset({"gpt2"})
ENCODER_DECODER = "vision-encoder-decoder"
ANCHOR = "wte.weight"
OWNER = "gpt2_decoder"
# GPT2Config's defaults, for configs that leave a field out (the hub's gpt2 config has no
# add_cross_attention or tie_word_embeddings).
DEFAULTS: dict[str, Any] = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
                            "n_layer": 12, "n_head": 12, "n_inner": None,
                            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                            "initializer_range": 0.02, "scale_attn_weights": True,
                            "scale_attn_by_inverse_layer_idx": False,
                            "add_cross_attention": False, "tie_word_embeddings": True}
ACTIVATIONS: dict[str, str] = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                               "gelu": "gelu", "quick_gelu": "quick_gelu"}


def gpt2_decoder(*, pretrained: str | Path | None = None, vocab_size: int | None = 50257,
                 dim: int | None = 768, depth: int | None = 12, num_heads: int | None = 12,
                 context_dim: int = 768, max_len: int | None = 1024,
                 mlp_ratio: float | None = 4.0, mlp: MlpKind | None = "gelu_tanh",
                 norm_eps: float | None = 1e-5, dropout: float = 0.1, attn_dropout: float = 0.1,
                 pad_id: int | None = 50256, tie_embeddings: bool | None = True,
                 activation_checkpointing: bool = False, freeze: bool = False) -> TextDecoder:
    """A GPT-2-shaped ``TextDecoder`` with cross-attention, filled from ``pretrained``.

    Args:
        pretrained: a Hugging Face GPT-2 folder or hub id (or a ``VisionEncoderDecoderModel``'s
            decoder), an mmtf decoder export, or None (random weights).
        vocab_size, ..., tie_embeddings: the ``config.json`` fields of
            :func:`decoder_values`; None reads them, a value must equal them.
        context_dim, dropout, attn_dropout, activation_checkpointing: as :class:`TextDecoder`.
        pad_id: padding id; None: the folder's ``pad_token_id``, else its ``eos_token_id``.
        freeze: frozen and in eval mode after loading.

    Raises:
        UserError: as :func:`mmtf.pretrained.vision.build_vision_encoder`.
    """
    given = dict(vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                 max_len=max_len, mlp_ratio=mlp_ratio, mlp=mlp, norm_eps=norm_eps,
                 tie_embeddings=tie_embeddings, pad_id=pad_id)
    hf = pretrained is not None and is_hf_source(pretrained)
    source = config = needed = None
    if hf:
        model, config, where = open_gpt2(pretrained)
        source = model.source
        needed = decoder_values(config, where)
    given = fill_sizes(OWNER, given, needed, pretrained=pretrained, source=str(source),
                       key_prefix="model.decoder", folder="Hugging Face GPT-2 folder")
    decoder = TextDecoder(**nest(
        "mmtf.decoders.TextDecoder", context_dim=context_dim, dropout=dropout,
        attn_dropout=attn_dropout, activation_checkpointing=activation_checkpointing,
        positions="learned", bias=True, mlp_bias=True, **given))
    if hf:
        load_hf_gpt2(decoder, model, config)
    elif pretrained is not None:
        load_export(decoder, pretrained)
    if freeze:
        decoder.requires_grad_(False).eval()
    return decoder


def open_gpt2(source: str | Path) -> tuple[HFModel, dict[str, Any], str]:
    """Open a GPT-2 folder or hub id: the model, GPT-2's config (its defaults filled in) and
    where that config sits in ``config.json`` ("" or "decoder.").

    Raises:
        UserError: a missing file, another architecture, or attention scaling mmtf does not do.
    """
    model = open_hf_model(source, model_types={*MODEL_TYPES, ENCODER_DECODER}, owner=OWNER)
    config = model.config
    nested = model.model_type == ENCODER_DECODER
    if nested:
        config = model.field("decoder", owner=OWNER)
    if config.get("model_type") not in MODEL_TYPES:
        raise UserError(f"{OWNER}: {model.source}/config.json has decoder.model_type="
                        f"{config.get('model_type')!r}, but this loader reads 'gpt2'.")
    config = {**DEFAULTS, **config}
    where = "decoder." if nested else ""
    for key, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if config[key] is not value:
            raise UserError(f"{OWNER}: {model.source}/config.json has {where}{key}="
                            f"{config[key]}; mmtf's attention scales scores by 1/sqrt(head "
                            f"dim) in every layer, as GPT-2's default {key}={value}.")
    return model, config, where


def load_hf_gpt2(decoder: TextDecoder, model: HFModel, config: dict[str, Any]) -> None:
    """Fill ``decoder`` (built from ``config``) with the tensors of the opened GPT-2 ``model``.

    Cross-attention layers the folder lacks keep a fresh GPT-2 initialisation.
    """
    prefix = model.prefix(ANCHOR, owner=OWNER)
    names = set(model.keys())
    cross = f"{prefix}h.0.crossattention.c_attn.weight" in names
    table = links(decoder, prefix, cross=cross)
    fresh = [] if cross else [k for k in decoder.state_dict() if _is_cross(k)]
    copy_weights(decoder, model.tensors(original_names(table)), table, owner=OWNER,
                 source=model.source, keep_initialised=fresh)
    if fresh:
        init_cross_attention(decoder, std=config["initializer_range"])
        # New to the model: under LoRA they train in full (docs/design/lora.md).
        mark_new(decoder, [k for k, _ in decoder.named_parameters() if _is_cross(k)])


def decoder_values(config: dict[str, Any], where: str = "") -> dict[str, tuple[Any, str]]:
    """The ``gpt2_decoder`` settings a GPT-2 config needs: ``{key: (value, its field)}``; the
    pad id is GPT-2's pad token, else its eos (GPT-2 has no pad token)."""

    def field(key: str) -> str:
        return f"{where}{key}={config[key]!r}"

    inner = config["n_inner"] or 4 * config["n_embd"]
    act = config["activation_function"]
    pad = config.get("pad_token_id")
    pad_field = "pad_token_id"
    if pad is None:
        pad, pad_field = config.get("eos_token_id"), "eos_token_id"
    pad = pad[0] if isinstance(pad, list) else pad
    return {
        "pad_id": (pad, f"{where}{pad_field}={pad!r}"),
        "vocab_size": (config["vocab_size"], field("vocab_size")),
        "dim": (config["n_embd"], field("n_embd")),
        "depth": (config["n_layer"], field("n_layer")),
        "num_heads": (config["n_head"], field("n_head")),
        "max_len": (config["n_positions"], field("n_positions")),
        "mlp_ratio": (inner / config["n_embd"], field("n_inner")),
        "mlp": (ACTIVATIONS.get(act, act), field("activation_function")),
        "norm_eps": (config["layer_norm_epsilon"], field("layer_norm_epsilon")),
        "tie_embeddings": (config["tie_word_embeddings"], field("tie_word_embeddings")),
    }


def _split_qkv(fused: Tensor) -> tuple[Tensor, Tensor]:
    # Self-attention's c_attn, (3c, ...) once transposed: q, then k and v -> to_q, to_kv.
    width = fused.shape[0] // 3
    return fused[:width], fused[width:]


# GPT-2's fused self-attention projection as mmtf's to_q and to_kv; Conv1D weights transposed.
QKV = Rule(_split_qkv, lambda q, kv: (torch.cat([q, kv], dim=0),))
QKV_CONV1D = Rule(lambda fused: _split_qkv(fused.t()),
                  lambda q, kv: (torch.cat([q, kv], dim=0).t(),))


def links(decoder: TextDecoder, prefix: str = "transformer.", *, cross: bool = True,
          ) -> list[Link]:
    """The name table of ``decoder``'s architecture as GPT-2.

    Args:
        decoder: sets depth and tying.
        prefix: of the GPT-2 names (``"transformer."`` in ``GPT2LMHeadModel``, ``""`` in
            ``GPT2Model``, ``"decoder.transformer."`` in a ``VisionEncoderDecoderModel``).
        cross: include the cross-attention layers.
    """
    head = prefix.removesuffix("transformer.")
    table = [link("embed.weight", f"{prefix}wte.weight"),
             link("positions.weight", f"{prefix}wpe.weight"),
             link("stack.norm.weight", f"{prefix}ln_f.weight"),
             link("stack.norm.bias", f"{prefix}ln_f.bias"),
             link("lm_head.weight", f"{prefix}wte.weight", TIED) if decoder.tie_embeddings
             else link("lm_head.weight", f"{head}lm_head.weight")]
    for i in range(decoder.depth):
        t, o = f"{prefix}h.{i}.", f"stack.blocks.{i}."
        for kind in ("weight", "bias"):
            conv = TRANSPOSED if kind == "weight" else SAME
            table += [
                link(f"{o}norm_self.{kind}", f"{t}ln_1.{kind}"),
                link((f"{o}self_attn.to_q.{kind}", f"{o}self_attn.to_kv.{kind}"),
                     f"{t}attn.c_attn.{kind}", QKV_CONV1D if kind == "weight" else QKV),
                link(f"{o}self_attn.to_out.{kind}", f"{t}attn.c_proj.{kind}", conv),
                link(f"{o}norm_mlp.{kind}", f"{t}ln_2.{kind}"),
                link(f"{o}mlp.fc_in.{kind}", f"{t}mlp.c_fc.{kind}", conv),
                link(f"{o}mlp.fc_out.{kind}", f"{t}mlp.c_proj.{kind}", conv),
            ]
            if cross:
                table += [
                    link(f"{o}norm_cross.{kind}", f"{t}ln_cross_attn.{kind}"),
                    link(f"{o}cross_attn.to_q.{kind}", f"{t}crossattention.q_attn.{kind}", conv),
                    link(f"{o}cross_attn.to_kv.{kind}", f"{t}crossattention.c_attn.{kind}",
                         conv),
                    link(f"{o}cross_attn.to_out.{kind}", f"{t}crossattention.c_proj.{kind}",
                         conv),
                ]
    return table


def part_links(part: str, module: TextDecoder, prefix: str = "") -> list[Link]:
    """The name table of a built GPT-2 decoder (:mod:`mmtf.pretrained.peft`).

    Raises:
        UserError: ``part`` is not the decoder or the decoder is not GPT-2-shaped.
    """
    if part != "decoder":
        raise UserError(f"model.{part}: GPT-2 is a decoder.")
    hf_config(module, bos_id=0, eos_id=0)
    return links(module, prefix)


def hf_state_dict(decoder: TextDecoder, prefix: str = "transformer.") -> dict[str, Tensor]:
    """``decoder``'s weights under ``GPT2LMHeadModel``'s names (the export direction of
    :func:`links`); the tied LM head is left to ``tie_word_embeddings``."""
    return export_tensors(decoder.state_dict(), links(decoder, prefix))


def hf_config(decoder: TextDecoder, *, bos_id: int, eos_id: int, pad_id: int | None = None,
              ) -> dict[str, Any]:
    """``config.json`` of ``decoder`` as a ``GPT2LMHeadModel`` with cross-attention.

    Raises:
        UserError: the decoder is not GPT-2-shaped (positions, biases, norm, MLP, or a context
            width other than its own, which GPT-2's cross-attention cannot read).
    """
    block = decoder.stack.blocks[0]
    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "quick_gelu": "quick_gelu"}
    problems = []
    if decoder.positions is None:
        problems.append("positions must be 'learned' (GPT-2 has a wpe table), not rope")
    if block.mlp.kind not in act:
        problems.append(f"mlp {block.mlp.kind!r} has no GPT-2 activation_function")
    if block.self_attn.to_q.bias is None or block.mlp.fc_in.bias is None:
        problems.append("GPT-2 has biases on every projection (bias: true)")
    if not isinstance(block.norm_self, nn.LayerNorm):
        problems.append("GPT-2 uses LayerNorm")
    if decoder.context_dim != decoder.dim:
        problems.append(f"GPT-2's cross-attention reads encoder states of its own width n_embd="
                        f"{decoder.dim}, but context_dim={decoder.context_dim}")
    if problems:
        raise UserError(f"export format=hf: this decoder is no GPT-2: {'; '.join(problems)}.")
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": decoder.vocab_size, "n_positions": decoder.max_len,
        "n_embd": decoder.dim, "n_layer": decoder.depth,
        "n_head": block.self_attn.num_heads, "n_inner": block.mlp.fc_in.out_features,
        "activation_function": act[block.mlp.kind],
        "layer_norm_epsilon": block.norm_self.eps, "add_cross_attention": True,
        "tie_word_embeddings": decoder.tie_embeddings, "bos_token_id": bos_id,
        "eos_token_id": eos_id, "pad_token_id": pad_id,
        "resid_pdrop": decoder.drop.p, "embd_pdrop": decoder.drop.p,
        "attn_pdrop": block.self_attn.dropout, "initializer_range": 0.02,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
    }


def resolved_sizes(part: str, module: TextDecoder) -> dict[str, Any]:
    """The settings a built decoder was given (null ones read from ``config.json``), by
    :func:`gpt2_decoder` argument; recorded in a run's config so checkpoints rebuild."""
    block = module.stack.blocks[0]
    return {"vocab_size": module.vocab_size, "dim": module.dim, "depth": module.depth,
            "num_heads": block.self_attn.num_heads, "max_len": module.max_len,
            "mlp_ratio": block.mlp.fc_in.out_features / module.dim, "mlp": block.mlp.kind,
            "norm_eps": block.norm_self.eps, "pad_id": module.pad_id,
            "tie_embeddings": module.tie_embeddings}


def export_hf(task: Any, out: Path) -> None:
    """Write a captioning task's GPT-2 decoder (with cross-attention) for ``transformers`` as
    ``GPT2LMHeadModel``: ``config.json``, ``generation_config.json``, ``model.safetensors`` and
    GPT-2's tokenizer files; then import it back and check every tensor. (With a ViT or CLIP
    encoder the whole captioner is :mod:`mmtf.pretrained.vision_encoder_decoder`'s.)

    Raises:
        UserError: the decoder is not GPT-2-shaped (:func:`hf_config`) or the task's tokenizer
            is not a pretrained one (GPT-2's).
    """
    decoder, tokenizer = task.model.decoder, pretrained_tokenizer(task)
    config = hf_config(decoder, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                       pad_id=tokenizer.pad_id)
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
           "pad_token_id": tokenizer.pad_id}
    write_hf_folder(out, config, ids, hf_state_dict(decoder), tokenizer, decoder)
    check_decoder_back(task, out)
    print(f"Exported the GPT-2 decoder (GPT2LMHeadModel; the encoder is neither ViT nor CLIP: "
          f"export it with format=mmtf part=encoder), "
          f"{sum(p.numel() for p in decoder.parameters()):,} parameters, to {out}/")


def pretrained_tokenizer(task: Any) -> Any:
    """The task's tokenizer, which must be a pretrained one (GPT-2's) for ``transformers``."""
    from mmtf.text import PretrainedTokenizer

    if not isinstance(task.tokenizer, PretrainedTokenizer):
        raise UserError(f"export format=hf: the checkpoint's tokenizer is "
                        f"{type(task.tokenizer).__name__}, not GPT-2's (tokenizer="
                        f"pretrained); transformers could not read its captions.")
    return task.tokenizer


def write_hf_folder(out: Path, config: dict[str, Any], ids: dict[str, Any],
                    tensors: dict[str, Tensor], tokenizer: Any, decoder: TextDecoder) -> None:
    """``config.json``, ``generation_config.json``, ``model.safetensors`` and GPT-2's tokenizer
    files in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(ids, indent=2))
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    write_tokenizer_files(tokenizer, out, tokenizer_class="GPT2Tokenizer",
                          model_max_length=decoder.max_len)


def check_decoder_back(task: Any, out: Path) -> None:
    """Import the written folder's decoder and compare every tensor with the task's."""
    decoder = task.model.decoder
    back = gpt2_decoder(pretrained=out, context_dim=decoder.context_dim,
                        **dict.fromkeys(resolved_sizes("decoder", decoder)))
    check_same(decoder, back, out, "decoder")


def check_same(ours: nn.Module, back: nn.Module, out: Path, part: str) -> None:
    """Every tensor of ``back`` (read from ``out``) equals ``ours``'s, else a RuntimeError."""
    theirs = back.state_dict()
    for key, value in ours.state_dict().items():
        if not torch.equal(value.detach().cpu().float(), theirs[key].float()):
            raise RuntimeError(f"export format=hf: {out} does not import back into the "
                               f"exported weights ({part}.{key}).")


def init_cross_attention(decoder: TextDecoder, *, std: float = 0.02) -> None:
    """GPT-2's initialisation for the cross-attention layers (as ``VisionEncoderDecoderModel``
    gives its new ones): weights N(0, std), the output projection N(0, std / sqrt(2 n_layer)),
    biases 0, LayerNorm 1 and 0."""
    with torch.no_grad():
        for block in decoder.stack.blocks:
            block.norm_cross.reset_parameters()
            for name, layer in (("to_q", block.cross_attn.to_q),
                                ("to_kv", block.cross_attn.to_kv),
                                ("to_out", block.cross_attn.to_out)):
                scale = math.sqrt(2 * decoder.depth) if name == "to_out" else 1.0
                layer.weight.normal_(0.0, std / scale)
                layer.bias.zero_()


def load_export(decoder: nn.Module, path: str | Path) -> None:
    """Load an mmtf decoder export (``weights.safetensors``), every name and shape checked."""
    export = open_export(path, owner=OWNER, key="model.decoder.pretrained")
    copy_weights(decoder, export.tensors(), [link(k, k) for k in decoder.state_dict()],
                 owner=OWNER, source=str(export.weights_file))


def _is_cross(name: str) -> bool:
    return ".cross_attn." in name or ".norm_cross." in name
