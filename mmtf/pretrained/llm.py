"""Pretrained decoder-only LLMs (Llama 2/3.x, SmolLM/SmolLM2, TinyLlama, Qwen2/2.5, Qwen3) as
mmtf's :class:`~mmtf.decoders.lm.CausalLM`.

One family for the three ``config.json`` ``model_type`` values; what differs is read from the
config: Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm and explicit ``head_dim``, Llama's
optional ``attention_bias`` / ``mlp_bias``, tied or untied embeddings, RoPE theta and its
``rope_scaling`` (linear, llama3, dynamic). The name table (:func:`links`) serves import
(:func:`load_llm`), ``format=hf`` export (:func:`save_hf`) and PEFT adapters both ways
(:func:`save_peft`, :func:`load_peft`); separate k/v and gate/up projections are fused into
mmtf's ``to_kv`` and ``fc_in``. Why: docs/design/llm-decoders.md.

Shapes: c = hidden_size, v = vocab_size, h / g query / key-value heads, d = head_dim."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from mmtf.decoders.lm import CausalLM
from mmtf.errors import UserError
from mmtf.hub import CONFIG_FILE, WEIGHTS_FILE, HFModel, is_hf_source, open_export, open_hf_model
from mmtf.nn.attention import projection_biases
from mmtf.pretrained.names import (
    FUSED_KV,
    TIED,
    Link,
    copy_weights,
    export_tensors,
    fill_sizes,
    link,
    original_names,
    require_config,
)

OWNER = "llm_decoder"
# model_type -> (the transformers class, its config's defaults for fields a folder may omit).
ARCHITECTURES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM"}
MODEL_TYPES = frozenset(ARCHITECTURES)
SUPPORTED = "llama (Llama 2/3.x, SmolLM/SmolLM2, TinyLlama), qwen2 (Qwen2/2.5), qwen3"
_COMMON: dict[str, Any] = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                           "tie_word_embeddings": False, "attention_bias": False,
                           "mlp_bias": False, "rope_scaling": None, "head_dim": None}
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "max_position_embeddings": 2048},
    "qwen2": {**_COMMON, "max_position_embeddings": 32768, "rope_theta": 1000000.0},
    "qwen3": {**_COMMON, "max_position_embeddings": 32768, "head_dim": 128},
}
# The llm_decoder arguments read from config.json, in order.
SIZES = ("vocab_size", "dim", "depth", "num_heads", "num_kv_heads", "head_dim", "mlp_hidden",
         "max_len", "norm_eps", "rope_base", "rope_scaling", "bias", "mlp_bias", "qk_norm",
         "tie_embeddings", "pad_id", "bos_id", "eos_id")
# Those a model built without a folder may leave null.
OPTIONAL = ("num_kv_heads", "head_dim", "mlp_hidden", "rope_scaling", "pad_id", "bos_id",
            "eos_id")


def llm_decoder(*, pretrained: str | Path | None = None, vocab_size: int | None = None,
                dim: int | None = None, depth: int | None = None, num_heads: int | None = None,
                num_kv_heads: int | None = None, head_dim: int | None = None,
                mlp_hidden: int | None = None, max_len: int | None = None,
                norm_eps: float | None = None, rope_base: float | None = None,
                rope_scaling: Mapping[str, Any] | None = None, bias: bool | str | None = None,
                mlp_bias: bool | None = None, qk_norm: bool | None = None,
                tie_embeddings: bool | None = None, pad_id: int | None = None,
                bos_id: int | None = None, eos_id: int | None = None, dropout: float = 0.0,
                activation_checkpointing: bool = False, freeze: bool = False) -> CausalLM:
    """A Llama/Qwen-shaped :class:`CausalLM`, filled from ``pretrained``.

    Args:
        pretrained: a Hugging Face folder or hub id of a supported family, an mmtf decoder
            export, or None (random weights; every size must then be given).
        vocab_size, ..., eos_id: the ``config.json`` fields of :func:`lm_values`; None reads
            them, a value must equal them. ``num_kv_heads`` and ``head_dim`` may stay None
            without a folder (plain multi-head, ``dim // num_heads``).
        dropout: residual and attention dropout (the families train without).
        activation_checkpointing: as :class:`mmtf.nn.TransformerStack`.
        freeze: frozen and in eval mode after loading.

    Raises:
        UserError: an unsupported ``model_type`` (named, with the supported list), a size that
            differs from ``config.json``, or a folder that is incomplete.
    """
    given = dict(vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                 num_kv_heads=num_kv_heads, head_dim=head_dim, mlp_hidden=mlp_hidden,
                 max_len=max_len, norm_eps=norm_eps, rope_base=rope_base,
                 rope_scaling=rope_scaling, bias=bias, mlp_bias=mlp_bias, qk_norm=qk_norm,
                 tie_embeddings=tie_embeddings, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
    hf = pretrained is not None and is_hf_source(pretrained)
    model = None
    if hf:
        model = open_llm(pretrained)
        needed = lm_values(model)
        require_config(OWNER, given, {k: v for k, v in needed.items() if given[k] is not None},
                       source=model.source, key_prefix="model.decoder")
        given = {k: needed[k][0] if v is None else v for k, v in given.items()}
    else:
        # Without a folder, what a plain model may leave out has a plain default.
        optional = {k: given.pop(k) for k in OPTIONAL}
        defaults = dict(norm_eps=1e-6, rope_base=10000.0, bias=False, mlp_bias=False,
                        qk_norm=False, tie_embeddings=False)
        given = {k: (defaults.get(k) if v is None else v) for k, v in given.items()}
        given = fill_sizes(OWNER, given, None, pretrained=pretrained, source=str(pretrained),
                           key_prefix="model.decoder", folder="Hugging Face Llama/Qwen folder")
        given.update(optional)
    lm = build_lm(given, dropout=dropout, activation_checkpointing=activation_checkpointing)
    if hf:
        copy_weights(lm, model.tensors(original_names(links(lm))), links(lm), owner=OWNER,
                     source=model.source)
    elif pretrained is not None:
        export = open_export(pretrained, owner=OWNER, key="model.decoder.pretrained")
        copy_weights(lm, export.tensors(), [link(k, k) for k in lm.state_dict()], owner=OWNER,
                     source=str(export.weights_file))
    if freeze:
        lm.requires_grad_(False).eval()
    return lm


def build_lm(sizes: Mapping[str, Any], *, dropout: float = 0.0,
             activation_checkpointing: bool = False) -> CausalLM:
    """A random-weight :class:`CausalLM` of ``sizes`` (the :data:`SIZES` keys)."""
    s = dict(sizes)
    block = dict(num_kv_heads=s["num_kv_heads"], mlp="swiglu", mlp_hidden=s["mlp_hidden"],
                 norm="rmsnorm", norm_eps=s["norm_eps"], bias=s["bias"],
                 mlp_bias=s["mlp_bias"], head_dim=s["head_dim"], qk_norm=s["qk_norm"],
                 dropout=dropout, attn_dropout=dropout)
    return CausalLM(vocab_size=s["vocab_size"], dim=s["dim"], depth=s["depth"],
                    num_heads=s["num_heads"], block=block, max_len=s["max_len"],
                    rope_base=s["rope_base"], rope_scaling=s["rope_scaling"],
                    tie_embeddings=s["tie_embeddings"], pad_id=s["pad_id"], bos_id=s["bos_id"],
                    eos_id=s["eos_id"], activation_checkpointing=activation_checkpointing)


def open_llm(source: str | Path) -> HFModel:
    """Open an LLM folder or hub id of a supported family.

    Raises:
        UserError: no folder, no weights, or a ``model_type`` mmtf does not build (named with
            the supported list).
    """

    return open_hf_model(source, model_types=MODEL_TYPES, owner=OWNER, family="LLM",
                         supported=SUPPORTED)


def lm_values(model: HFModel) -> dict[str, tuple[Any, str]]:
    """The :func:`llm_decoder` settings an LLM folder's ``config.json`` needs: ``{key: (value,
    "the field=value it comes from")}``.

    Raises:
        UserError: an activation other than SiLU, or Qwen2's sliding-window attention.
    """
    kind = model.model_type
    c = {**DEFAULTS[kind], **{k: v for k, v in model.config.items() if v is not None}}
    where = f"{model.source}/{CONFIG_FILE}"
    if c["hidden_act"] != "silu":
        raise UserError(f"{OWNER}: {where} has hidden_act={c['hidden_act']!r}; the {kind} "
                        f"family in mmtf is built with SwiGLU (silu).")
    if c.get("use_sliding_window"):
        raise UserError(f"{OWNER}: {where} has use_sliding_window=true; mmtf's Qwen2 attends "
                        f"over the whole context (set it false if the model allows).")

    def field(key: str) -> str:
        return f"{key}={c.get(key)!r}"

    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    theta, scaling = rope_settings(c)
    # Dynamic NTK scaling exists to read past the trained length: up to factor times it.
    dynamic = scaling is not None and scaling["rope_type"] == "dynamic"
    positions = c["max_position_embeddings"]
    if dynamic:
        positions = int(positions * scaling["factor"])
    bias: bool | str = bool(c["attention_bias"])
    if kind == "qwen2":
        bias = "qkv"
    ids = {}
    for name in ("pad", "bos", "eos"):
        value = c.get(f"{name}_token_id")
        ids[name] = value[0] if isinstance(value, list) else value
    return {
        "vocab_size": (c["vocab_size"], field("vocab_size")),
        "dim": (c["hidden_size"], field("hidden_size")),
        "depth": (c["num_hidden_layers"], field("num_hidden_layers")),
        "num_heads": (heads, field("num_attention_heads")),
        "num_kv_heads": (kv, field("num_key_value_heads")),
        "head_dim": (head_dim, field("head_dim")),
        "mlp_hidden": (c["intermediate_size"], field("intermediate_size")),
        "max_len": (positions, field("max_position_embeddings") + (
            f" x rope_scaling factor {scaling['factor']!r} (dynamic)" if dynamic else "")),
        "norm_eps": (c["rms_norm_eps"], field("rms_norm_eps")),
        "rope_base": (theta, f"rope_theta={theta!r}"),
        "rope_scaling": (scaling, f"rope_scaling={scaling!r}"),
        "bias": (bias, "model_type='qwen2'" if kind == "qwen2" else field("attention_bias")),
        "mlp_bias": (bool(c["mlp_bias"]), field("mlp_bias")),
        "qk_norm": (kind == "qwen3", f"model_type={kind!r}"),
        "tie_embeddings": (bool(c["tie_word_embeddings"]), field("tie_word_embeddings")),
        "pad_id": (ids["pad"], field("pad_token_id")),
        "bos_id": (ids["bos"], field("bos_token_id")),
        "eos_id": (ids["eos"], field("eos_token_id")),
    }


def rope_settings(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """RoPE's theta and scaling from a config in either spelling: ``rope_theta`` +
    ``rope_scaling`` (the hub's folders) or ``rope_parameters`` (transformers >= 5)."""
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or params)
    theta = float(params.get("rope_theta") or config.get("rope_theta") or 10000.0)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    keep = {k: v for k, v in scaling.items()
            if k in ("factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")}
    if kind == "dynamic":
        keep["max_position_embeddings"] = config["max_position_embeddings"]
    return theta, {"rope_type": kind, **keep}


# ----------------------------------------------------------------------------- name table
def links(lm: CausalLM, prefix: str = "") -> list[Link]:
    """The name table of ``lm`` as ``<Family>ForCausalLM`` (``model.layers.N....``,
    ``lm_head``); ``prefix`` goes before every original name."""
    m = f"{prefix}model."
    block = lm.stack.blocks[0]
    attn = block.self_attn
    biased = {"q": attn.to_q.bias is not None, "o": attn.to_out.bias is not None,
              "kv": attn.to_kv.bias is not None}
    table = [link("embed.weight", f"{m}embed_tokens.weight"),
             link("stack.norm.weight", f"{m}norm.weight"),
             link("lm_head.weight", f"{m}embed_tokens.weight", TIED) if lm.tie_embeddings
             else link("lm_head.weight", f"{prefix}lm_head.weight")]
    for i in range(lm.depth):
        o, t = f"stack.blocks.{i}.", f"{m}layers.{i}."
        a, ta = f"{o}self_attn.", f"{t}self_attn."
        table += [link(f"{o}norm_self.weight", f"{t}input_layernorm.weight"),
                  link(f"{o}norm_mlp.weight", f"{t}post_attention_layernorm.weight")]
        kinds = ["weight", *(["bias"] if biased["q"] else [])]
        table += [link(f"{a}to_q.{k}", f"{ta}q_proj.{k}") for k in kinds]
        kinds = ["weight", *(["bias"] if biased["kv"] else [])]
        table += [link(f"{a}to_kv.{k}", (f"{ta}k_proj.{k}", f"{ta}v_proj.{k}"), FUSED_KV)
                  for k in kinds]
        kinds = ["weight", *(["bias"] if biased["o"] else [])]
        table += [link(f"{a}to_out.{k}", f"{ta}o_proj.{k}") for k in kinds]
        if attn.q_norm is not None:
            table += [link(f"{a}q_norm.weight", f"{ta}q_norm.weight"),
                      link(f"{a}k_norm.weight", f"{ta}k_norm.weight")]
        kinds = ["weight", *(["bias"] if block.mlp.fc_in.bias is not None else [])]
        for k in kinds:
            # SwiGLU's fc_in is [gate; up], the order mmtf's MLP chunks it in.
            table += [link(f"{o}mlp.fc_in.{k}", (f"{t}mlp.gate_proj.{k}", f"{t}mlp.up_proj.{k}"),
                           FUSED_KV),
                      link(f"{o}mlp.fc_out.{k}", f"{t}mlp.down_proj.{k}")]
    return table


def part_links(part: str, module: CausalLM, prefix: str = "") -> list[Link]:
    """The name table of a built LLM decoder (:mod:`mmtf.pretrained.peft`).

    Raises:
        UserError: ``part`` is not the decoder or the module is not Llama/Qwen-shaped.
    """
    if part != "decoder" or not isinstance(module, CausalLM):
        raise UserError(f"model.{part}: the LLM family is a decoder-only CausalLM.")
    hf_config(module)
    return links(module, prefix)


def load_llm(source: str | Path, *, device: str | torch.device = "cpu",
             dtype: torch.dtype | None = None) -> CausalLM:
    """The LLM of a Hugging Face folder or hub id, in eval mode (weights as stored, cast to
    ``dtype`` when given)."""
    lm = llm_decoder(pretrained=source)
    return lm.to(device=device, dtype=dtype).eval()


# ----------------------------------------------------------------------------- export
def hf_config(lm: CausalLM, model_type: str | None = None) -> dict[str, Any]:
    """``config.json`` of ``lm`` for ``transformers`` (``model_type`` default: qwen3 with q/k
    norm, qwen2 with q/k/v-only biases, else llama).

    Raises:
        UserError: a module no family holds (not SwiGLU + RMSNorm, or a bias/norm layout the
            model type lacks).
    """
    block = lm.stack.blocks[0]
    attn = block.self_attn
    biases = "".join(x for x, layer in (("q", attn.to_q), ("kv", attn.to_kv), ("o", attn.to_out))
                     if layer.bias is not None)
    qk_norm = attn.q_norm is not None
    if model_type is None:
        model_type = "qwen3" if qk_norm else ("qwen2" if biases == "qkv" else "llama")
    problems = []
    if block.mlp.kind != "swiglu" or not isinstance(block.norm_self, torch.nn.RMSNorm):
        problems.append("the families use SwiGLU MLPs and RMSNorm")
    if attn.k_bias is not None or attn.v_bias is not None:
        problems.append("keys and values are biased together or not at all")
    if qk_norm != (model_type == "qwen3"):
        problems.append("per-head q/k norm is Qwen3's alone")
    if model_type == "qwen2" and biases != "qkv":
        problems.append("Qwen2 has biases on q, k and v only")
    if model_type != "qwen2" and biases not in ("", "qkvo"):
        problems.append(f"{model_type} has attention biases on all of q, k, v, o or none")
    if model_type not in MODEL_TYPES:
        problems.append(f"model_type {model_type!r} is none of {sorted(MODEL_TYPES)}")
    if problems:
        raise UserError(f"export format=hf: this CausalLM is no {model_type}: "
                        f"{'; '.join(problems)}.")
    rope = lm.stack.rope
    scaling = dict(rope.scaling) or None
    if scaling is not None:
        scaling.pop("max_position_embeddings", None)
    config = {
        "architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
        "vocab_size": lm.vocab_size, "hidden_size": lm.dim,
        "intermediate_size": block.mlp.fc_out.in_features, "num_hidden_layers": lm.depth,
        "num_attention_heads": attn.num_heads, "num_key_value_heads": attn.num_kv_heads,
        "head_dim": attn.head_dim, "hidden_act": "silu",
        "max_position_embeddings": rope.trained_len or lm.max_len,
        "rms_norm_eps": block.norm_self.eps,
        "rope_theta": rope.base, "rope_scaling": scaling,
        "tie_word_embeddings": lm.tie_embeddings, "torch_dtype": "float32",
        "bos_token_id": lm.bos_id, "eos_token_id": lm.eos_id, "pad_token_id": lm.pad_id,
        "attention_dropout": 0.0, "use_cache": True,
    }
    if model_type != "qwen2":
        config["attention_bias"] = biases == "qkvo"
    if model_type == "llama":
        config["mlp_bias"] = block.mlp.fc_in.bias is not None
    if model_type == "qwen2":
        config["use_sliding_window"] = False
    return config


def hf_state_dict(lm: CausalLM) -> dict[str, Tensor]:
    """``lm``'s weights under ``<Family>ForCausalLM``'s names (a tied head left to the tie)."""
    return export_tensors(lm.state_dict(), links(lm))


# Tokenizer and template files copied beside an export from the folder the model came from.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


def save_hf(lm: CausalLM, out: str | Path, *, tokenizer_folder: str | Path | None = None,
            model_type: str | None = None) -> Path:
    """Write ``lm`` as a Hugging Face folder (``config.json``, ``model.safetensors``, and the
    tokenizer files of ``tokenizer_folder``), then import it back and compare every tensor.

    Raises:
        UserError: the model is no family's (:func:`hf_config`).
        RuntimeError: the written folder does not import back into the same weights.
    """
    out = Path(out)
    config = hf_config(lm, model_type)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_file(hf_state_dict(lm), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    if tokenizer_folder is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_folder) / name
            if src.is_file() and src.resolve() != (out / name).resolve():
                shutil.copyfile(src, out / name)
    back = llm_decoder(pretrained=out)
    theirs = back.state_dict()
    for key, value in lm.state_dict().items():
        if not torch.equal(value.detach().cpu().float(), theirs[key].float()):
            raise RuntimeError(f"export format=hf: {out} does not import back into the "
                               f"exported weights ({key}).")
    return out


def export_hf(task: Any, out: Path) -> None:
    """``format=hf`` of a task whose ``model.decoder`` is a :class:`CausalLM` (the decoder
    alone: the LLM as ``<Family>ForCausalLM``)."""
    lm = task.model.decoder
    source = getattr(task, "run_config", {}).get("pretrained")
    save_hf(lm, out, tokenizer_folder=source)
    print(f"Exported the LLM ({hf_config(lm)['architectures'][0]}), "
          f"{sum(p.numel() for p in lm.parameters()):,} parameters, to {out}/")


def resolved_sizes(part: str, module: CausalLM) -> dict[str, Any]:
    """The :func:`llm_decoder` settings a built LLM was given, recorded in a run's config so a
    checkpoint rebuilds without the folder."""
    block = module.stack.blocks[0]
    attn = block.self_attn
    biases = projection_biases("".join(x for x, layer in (
        ("q", attn.to_q), ("kv", attn.to_kv), ("o", attn.to_out)) if layer.bias is not None))
    bias: bool | str = "".join(sorted(biases, key="qkvo".index))
    bias = {"": False, "qkvo": True}.get(bias, bias)
    return {"vocab_size": module.vocab_size, "dim": module.dim, "depth": module.depth,
            "num_heads": attn.num_heads, "num_kv_heads": attn.num_kv_heads,
            "head_dim": attn.head_dim, "mlp_hidden": block.mlp.fc_out.in_features,
            "max_len": module.max_len, "norm_eps": block.norm_self.eps,
            "rope_base": module.stack.rope.base,
            "rope_scaling": dict(module.stack.rope.scaling) or None, "bias": bias,
            "mlp_bias": block.mlp.fc_in.bias is not None, "qk_norm": attn.q_norm is not None,
            "tie_embeddings": module.tie_embeddings, "pad_id": module.pad_id,
            "bos_id": module.bos_id, "eos_id": module.eos_id}


# ----------------------------------------------------------------------------- PEFT
def save_peft(lm: CausalLM, out: str | Path, *, base: str | None = None,
              dropout: float = 0.0) -> Path:
    """Write ``lm``'s LoRA adapters as a PEFT folder for ``<Family>ForCausalLM`` (``base``: its
    ``base_model_name_or_path``). Adapters on the MLP have no PEFT module of their own (mmtf
    fuses gate and up): adapt q, k, v, o for a PEFT folder."""
    from mmtf.pretrained.peft import write_peft_adapter

    return write_peft_adapter({"decoder": lm}, {"decoder": part_links("decoder", lm)},
                              {"dropout": dropout}, base, out)


def load_peft(lm: CausalLM, folder: str | Path) -> Any:
    """Add the LoRA adapters of a PEFT folder made on ``<Family>ForCausalLM`` to ``lm``;
    returns their :class:`~mmtf.nn.lora.LoRAConfig` (rank, alpha, targets)."""
    from mmtf.nn.lora import LoRAConfig
    from mmtf.pretrained.peft import load_peft_adapter

    config, _ = load_peft_adapter(folder, {"decoder": lm}, LoRAConfig())
    return config


__all__ = ["ARCHITECTURES", "MODEL_TYPES", "build_lm", "export_hf", "hf_config",
           "hf_state_dict", "links", "llm_decoder", "lm_values", "load_llm", "load_peft",
           "open_llm", "part_links", "resolved_sizes", "save_hf", "save_peft"]
