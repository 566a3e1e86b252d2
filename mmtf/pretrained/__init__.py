"""Pretrained networks from the ecosystem (Hugging Face format) in mmtf's own modules.

:mod:`mmtf.hub` reads folders; :mod:`mmtf.pretrained.names` copies tensors through a family's
name table, both ways. Every family is registered once, in :data:`FAMILIES`; its module provides
builders (the ``_target_`` of its YAML parts; null sizes are read from ``config.json``), a name
table of :class:`~mmtf.pretrained.names.Link` rows, ``resolved_sizes(part, module)`` (recorded in
the run's config so a checkpoint rebuilds without the folder), the ``format=hf`` writer of a pair
(:data:`PAIR_WRITERS`) and ``part_links(part, module, prefix)`` (PEFT names, :data:`PEFT_BASES`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from torch import nn

from mmtf.errors import UserError


class Family(NamedTuple):
    """One pretrained family: its module, the ``config.json`` ``model_type`` values it reads, its
    builder and conf/model group per part."""

    module: str
    model_types: frozenset[str]
    builders: Mapping[str, str]
    config_groups: Mapping[str, str]


FAMILIES: dict[str, Family] = {
    "whisper": Family("mmtf.pretrained.whisper", frozenset({"whisper"}),
                      {"encoder": "whisper_encoder", "decoder": "whisper_decoder"},
                      {"encoder": "whisper_encoder", "decoder": "whisper_decoder"}),
    "gpt2": Family("mmtf.pretrained.gpt2", frozenset({"gpt2"}), {"decoder": "gpt2_decoder"},
                   {"decoder": "gpt2"}),
    "vit": Family("mmtf.pretrained.vit", frozenset({"vit"}), {"encoder": "vit_encoder"},
                  {"encoder": "vit"}),
    "clip": Family("mmtf.pretrained.clip", frozenset({"clip", "clip_vision_model"}),
                   {"encoder": "clip_vision_encoder"}, {"encoder": "clip_vision"}),
    # Decoder-only LLMs: Llama 2/3.x (SmolLM, TinyLlama), Qwen2/2.5, Qwen3.
    "llm": Family("mmtf.pretrained.llm", frozenset({"llama", "qwen2", "qwen3"}),
                  {"decoder": "llm_decoder"}, {"decoder": "llm"}),
    # Text encoders: BERT / MiniLM, RoBERTa, XLM-RoBERTa (and sentence-transformers folders).
    "bert": Family("mmtf.pretrained.bert", frozenset({"bert", "roberta", "xlm-roberta"}),
                   {"encoder": "bert_encoder", "text_encoder": "bert_encoder"},
                   {"text_encoder": "bert"}),
}
# Who writes the Hugging Face layout of a pair, by (encoder family, decoder family); None = any
# encoder (only the decoder is written); a None decoder: an encoder alone (a text encoder).
# ``module:function``.
PAIR_WRITERS: dict[tuple[str | None, str | None], str] = {
    ("whisper", "whisper"): "mmtf.pretrained.whisper:export_hf",
    ("vit", "gpt2"): "mmtf.pretrained.vision_encoder_decoder:export_hf",
    ("clip", "gpt2"): "mmtf.pretrained.vision_encoder_decoder:export_hf",
    (None, "gpt2"): "mmtf.pretrained.gpt2:export_hf",
    (None, "llm"): "mmtf.pretrained.llm:export_hf",
    ("bert", None): "mmtf.pretrained.bert:export_hf",
}

# The Hugging Face base class a PEFT adapter folder is for and the prefix of each part's module
# names in it (``python -m mmtf.export ... format=peft``), by the families of (encoder,
# decoder): a pair's class when one folder holds both parts (Whisper;
# ``VisionEncoderDecoderModel`` when both parts were imported from one such folder), else the
# class of the one adapted part (None: the other part is not in the base).
PEFT_BASES: dict[tuple[str | None, str | None], tuple[str, dict[str, str]]] = {
    ("whisper", "whisper"): ("WhisperForConditionalGeneration",
                             {"encoder": "model.", "decoder": "model."}),
    ("vit", "gpt2"): ("VisionEncoderDecoderModel",
                      {"encoder": "encoder.", "decoder": "decoder.transformer."}),
    ("clip", "gpt2"): ("VisionEncoderDecoderModel",
                       {"encoder": "encoder.", "decoder": "decoder.transformer."}),
    ("vit", None): ("ViTModel", {"encoder": ""}),
    ("clip", None): ("CLIPVisionModel", {"encoder": ""}),
    (None, "gpt2"): ("GPT2LMHeadModel", {"decoder": "transformer."}),
    # LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM: the table names "model.layers..".
    (None, "llm"): ("AutoModelForCausalLM", {"decoder": ""}),
}
# Bases whose linear layers are GPT-2's Conv1D (PEFT's fan_in_fan_out).
CONV1D_BASES = frozenset({"GPT2LMHeadModel"})


def family_of(part_cfg: Any) -> str | None:
    """The family whose builder a part's config targets (``mmtf.pretrained.<family>.*``)."""
    target = part_cfg.get("_target_", "") if isinstance(part_cfg, Mapping) else ""
    for family, entry in FAMILIES.items():
        if str(target).startswith(entry.module + "."):
            return family
    return None


def family_module(family: str) -> ModuleType:
    return importlib.import_module(FAMILIES[family].module)


def resolved_sizes(model_cfg: Mapping[str, Any], parts: Mapping[str, nn.Module],
                   ) -> dict[str, dict[str, Any]]:
    """Every size of a pretrained-family part that its config left null and its builder read
    from ``config.json``, by part: plain values for the run's config (``train`` writes them
    there), so a checkpoint rebuilds its model without the pretrained folder."""
    out: dict[str, dict[str, Any]] = {}
    for name, module in parts.items():
        node = model_cfg.get(name)
        family = family_of(node)
        if family is None:
            continue
        sizes = family_module(family).resolved_sizes(name, module)
        filled = {k: _read_value(node.get(k), v) for k, v in sizes.items()}
        out[name] = {k: v for k, v in filled.items() if v is not None}
    return out


def _read_value(given: Any, value: Any) -> Any:
    """What to record of a size the config gave as ``given``: ``value`` where it was null, a
    part (a mapping) with its null fields filled, or None where the config set it."""
    if given is None:
        return value
    if isinstance(given, Mapping) and isinstance(value, Mapping) and any(
            given.get(k) is None for k in value):
        return {**given, **{k: v for k, v in value.items() if given.get(k) is None}}
    return None


def export_hf(task: Any, model_cfg: Mapping[str, Any], out: str | Path) -> Path:
    """Write ``task``'s model in the Hugging Face layout of its families; return the folder.

    Raises:
        UserError: the model is mmtf's own, or a pair no family writes.
    """
    encoder, decoder = (family_of(model_cfg.get(p)) for p in ("encoder", "decoder"))
    writer = PAIR_WRITERS.get((encoder, decoder)) or (
        PAIR_WRITERS.get((None, decoder)) if decoder is not None else None)
    if writer is None:
        found = sorted(f for f in (encoder, decoder) if f) or "mmtf modules only"
        decoders = sorted({d for _, d in PAIR_WRITERS if d is not None})
        alone = sorted({e for e, d in PAIR_WRITERS if d is None and e is not None})
        raise UserError(f"export format=hf: the checkpoint's model is not a pair that "
                        f"transformers holds ({found}); format=hf writes models built from "
                        f"{decoders} (model=whisper, model/decoder=gpt2 ...) and encoders "
                        f"alone from {alone}; use format=mmtf for mmtf's own models.")
    module, function = writer.split(":")
    out = Path(out)
    getattr(importlib.import_module(module), function)(task, out)
    return out


def peft_base(model_cfg: Mapping[str, Any], lora_parts: list[str],
              ) -> tuple[str, dict[str, str], str | None]:
    """The Hugging Face base of a PEFT folder for a model whose ``lora_parts`` are adapted:
    its class, the prefix of each part it holds and its folder (:data:`PEFT_BASES`).

    Raises:
        UserError: no base holds the adapted parts (the families and folders named).
    """
    families = {p: family_of(model_cfg.get(p)) for p in ("encoder", "decoder")}
    folders = {p: (model_cfg.get(p) or {}).get("pretrained") for p in ("encoder", "decoder")}
    pair = PEFT_BASES.get((families["encoder"], families["decoder"]))
    single = [PEFT_BASES.get((families["encoder"], None)), PEFT_BASES.get(
        (None, families["decoder"]))]
    one_folder = folders["encoder"] is not None and folders["encoder"] == folders["decoder"]
    if pair is not None and (one_folder or not any(single)):
        return pair[0], pair[1], folders["encoder"] or folders["decoder"]
    if len(lora_parts) == 1:
        (part,) = lora_parts
        entry = PEFT_BASES.get((families[part], None) if part == "encoder" else
                               (None, families[part]))
        if entry is not None:
            return entry[0], entry[1], folders[part]
    found = {p: families[p] or "mmtf's own" for p in families}
    bases = sorted({c for c, _ in PEFT_BASES.values()})
    raise UserError(f"export format=peft: no Hugging Face base holds the adapted "
                    f"{' and '.join(lora_parts)} (encoder {found['encoder']} from "
                    f"{folders['encoder']}, decoder {found['decoder']} from "
                    f"{folders['decoder']}); PEFT folders are written for {bases}, one folder "
                    f"per base (adapt one part, or import both from one folder); export the "
                    f"merged model with format=hf merge_lora=true (or format=mmtf "
                    f"merge_lora=true).")


def export_peft(task: Any, model_cfg: Mapping[str, Any], out: str | Path) -> Path:
    """Write ``task``'s LoRA adapters as a PEFT adapter folder for its Hugging Face base
    (:func:`peft_base`).

    Raises:
        UserError: no base holds the adapted parts, no adapters, trainable biases, a part of
            the base that trained outside its adapters, or layers new to the model (GPT-2's
            cross-attention when its folder had none), none of which a PEFT folder on the base
            model carries.
    """
    from mmtf.nn.lora import new_parameter_names
    from mmtf.pretrained.peft import module_renames, write_peft_adapter

    parts = task.export_parts()
    lora = model_cfg.get("lora") or {}
    lora_parts = list(lora.get("parts") or (parts if lora else []))   # null parts: all
    if not lora_parts:
        raise UserError("export format=peft: the checkpoint's model has no LoRA adapters; "
                        "train with model/lora=default, or export with format=hf.")
    base_class, prefixes, base = peft_base(model_cfg, lora_parts)
    if lora.get("bias", "none") != "none":
        raise UserError(f"export format=peft: model.lora.bias={lora['bias']} trained biases of "
                        f"the base; format=peft writes bias=none adapters; use format=hf "
                        f"merge_lora=true.")
    for name in prefixes:
        if name in lora_parts:
            continue
        frozen = (model_cfg.get(name, {}).get("freeze") if name == "encoder"
                  else model_cfg.get(f"freeze_{name}"))
        if not frozen or model_cfg.get(f"unfreeze_{name}_at_epoch") is not None:
            raise UserError(f"export format=peft: the {name} has no adapters and trained in "
                            f"full (model.lora.parts={lora_parts}), which an adapter folder on "
                            f"{base_class} cannot carry; export with format=hf merge_lora=true.")
    for name in lora_parts:
        new = sorted(new_parameter_names(parts[name]))
        if new:
            raise UserError(f"export format=peft: the {name}'s {new[0]} (and {len(new) - 1} "
                            f"more) are new to the model (its folder {base} has none) and "
                            f"trained in full, which an adapter folder on {base_class} cannot "
                            f"carry; export with format=hf merge_lora=true.")
    adapted = {name: parts[name] for name in lora_parts}
    families = {name: family_of(model_cfg.get(name)) for name in adapted}
    tables = {name: family_module(families[name]).part_links(name, module, prefixes[name])
              for name, module in adapted.items()}
    renames = {name: module_renames(families[name]) for name in adapted}
    outside = [p for p in parts if p not in prefixes]
    if outside:
        print(f"export format=peft: the {' and '.join(outside)} is not part of {base_class}; "
              f"the folder holds the {' and '.join(adapted)}'s adapters only.")
    return write_peft_adapter(adapted, tables, lora, None if base is None else str(base), out,
                              renames=renames, fan_in_fan_out=base_class in CONV1D_BASES)
