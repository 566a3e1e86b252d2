"""LoRA adapters in PEFT's folder format, both ways, through the families' name tables.

A PEFT adapter folder is ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``,
``target_modules`` ...) and ``adapter_model.safetensors`` holding, for every adapted module
``M`` of the Hugging Face base, ``base_model.model.M.lora_A.weight`` (r, in) and
``...lora_B.weight`` (out, r). mmtf's adapters sit on its own projections
(:class:`mmtf.nn.lora.LoRALinear`); which Hugging Face module each slice of a projection is,
is read from the same :class:`~mmtf.pretrained.names.Link` rows that import and export the base
weights: a row ``to_kv.weight <- (k_proj.weight, v_proj.weight)`` says that slice ``k`` of
``to_kv`` is ``k_proj`` and slice ``v`` is ``v_proj``. No second mapping; ``peft`` itself is
never imported (a test extra only).

:func:`write_peft_adapter` writes a folder (``python -m mmtf.export ... format=peft``);
:func:`load_peft_adapter` reads one into a task's parts (``model.lora.pretrained=<folder>``).
Why: see docs/design/lora.md
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from mmtf.errors import ConfigError, UserError, require_file
from mmtf.nn.lora import (
    SLICES,
    TARGETS,
    LoRAConfig,
    LoRALinear,
    add_lora,
    lora_layers,
    lora_sites,
)
from mmtf.pretrained import FAMILIES, family_module
from mmtf.pretrained.names import Link

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."       # PeftModel's prefix of the base model's names


class Site(NamedTuple):
    """One slice of an mmtf projection that is one Hugging Face module."""

    part: str
    path: str        # the projection, in the part (stack.blocks.0.self_attn.to_kv)
    slice: str       # k


def slice_modules(part: str, module: nn.Module, table: list[Link]) -> dict[str, Site]:
    """``{Hugging Face module name: Site}`` for every projection slice of ``module`` that the
    name table maps to one original module of its own (Whisper's and ViT's separate q/k/v;
    not GPT-2's fused ``c_attn``, which holds three mmtf slices)."""
    by_weight = {row.ours: row for row in table}
    out: dict[str, Site] = {}
    for path in lora_sites(module, ("q", "k", "v", "o", "mlp")):
        slices = SLICES[path.rsplit(".", 1)[-1]]
        row = by_weight.get((f"{path}.weight",))
        if row is None or len(row.theirs) != len(slices):
            continue
        for slice_name, theirs in zip(slices, row.theirs, strict=True):
            out[theirs.removesuffix(".weight")] = Site(part, path, slice_name)
    return out


def part_tables(part: str, module: nn.Module, prefix: str = "") -> dict[str, list[Link]]:
    """The name tables of every family whose architecture ``module`` has, by family."""
    tables = {}
    for family, entry in FAMILIES.items():
        if part not in entry.builders:
            continue
        try:
            tables[family] = family_module(family).part_links(part, module, prefix)
        except (UserError, AttributeError, KeyError):     # not in that family's configuration
            continue
    return tables


# ------------------------------------------------------------------------------- reading
def read_adapter(folder: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``adapter_config.json`` and the tensors of a PEFT folder, checked to be plain LoRA.

    Raises:
        UserError: a missing file, or a PEFT method mmtf does not compute (DoRA, rsLoRA, ...).
    """
    folder = Path(folder)
    key = "model.lora.pretrained"
    config_file = require_file(folder / ADAPTER_CONFIG, what="PEFT adapter config",
                               fix=f"point {key} at a folder saved by PeftModel.save_pretrained")
    weights = require_file(folder / ADAPTER_WEIGHTS, what="PEFT adapter weights",
                           fix=f"point {key} at a folder saved by PeftModel.save_pretrained "
                               f"(safetensors; pickled adapter_model.bin is never read)")
    config = json.loads(config_file.read_text())
    unsupported = [f"{k}={config[k]!r}" for k, ok in (
        ("peft_type", "LORA"), ("use_dora", False), ("use_rslora", False)) if
        k in config and config[k] not in (ok, None)]
    if config.get("modules_to_save"):
        unsupported.append(f"modules_to_save={config['modules_to_save']!r}")
    if unsupported:
        raise UserError(f"{key}: {config_file} has {', '.join(unsupported)}; mmtf loads plain "
                        f"LoRA adapters (peft_type LORA, no DoRA / rsLoRA / modules_to_save).")
    return config, load_file(str(weights))


def load_peft_adapter(folder: str | Path, parts: Mapping[str, nn.Module], config: LoRAConfig,
                      ) -> tuple[LoRAConfig, list[str]]:
    """Add the adapters of a PEFT folder to ``parts`` (imported from the folder's base model).

    Rank, alpha, dropout and bias come from ``adapter_config.json``; ``config`` only gives the
    defaults of what the folder leaves out. The targets are read from the adapted modules and
    must be whole targets (every block of the part, self- and cross-attention alike), so that
    the returned config rebuilds the same adapters without the folder.

    Returns:
        The config the adapters have, and the parts that hold them.

    Raises:
        UserError: a module the parts do not have, or a tensor of another shape (the folder's
            ``base_model_name_or_path`` and both shapes named): an adapter for another base.
        ConfigError: adapters that no target list describes, or a part without any.
    """
    peft_config, tensors = read_adapter(folder)
    base = peft_config.get("base_model_name_or_path")
    r, alpha = int(peft_config.get("r", config.r)), float(peft_config.get("lora_alpha",
                                                                          config.alpha))
    patterns = {k: v for k in ("rank_pattern", "alpha_pattern") if (v := peft_config.get(k))}
    if patterns:
        raise UserError(f"model.lora.pretrained: {folder}/{ADAPTER_CONFIG} sets "
                        f"{', '.join(patterns)}; mmtf's adapters have one rank and alpha.")
    found = LoRAConfig(r=r, alpha=alpha, dropout=float(peft_config.get("lora_dropout",
                                                                       config.dropout)),
                       targets=config.targets, bias=peft_config.get("bias") or "none")
    modules = {}
    for name in tensors:
        if not name.endswith((".lora_A.weight", ".lora_B.weight")):
            raise UserError(f"model.lora.pretrained: {folder} holds {name!r}, which is no LoRA "
                            f"matrix of a linear layer; mmtf loads lora_A / lora_B only.")
        modules.setdefault(name.removeprefix(PEFT_PREFIX).rsplit(".", 2)[0], {})[
            name.rsplit(".", 2)[1]] = tensors[name]
    sites = _match(modules, parts, folder, base)
    by_part: dict[str, dict[str, set[str]]] = {}
    for site in sites.values():
        by_part.setdefault(site.part, {}).setdefault(site.path, set()).add(site.slice)
    used = {_TARGET_OF[(path.rsplit(".", 1)[-1], s)] for adapted in by_part.values()
            for path, slices in adapted.items() for s in slices}
    targets = tuple(t for t in TARGETS if t in used)
    missing = [p for p in parts if p not in by_part]
    if missing:
        raise ConfigError(f"model.lora.pretrained: {folder} has no adapter in the "
                          f"{', '.join(missing)} (it adapts {sorted(by_part)}); set "
                          f"model.lora.parts=[{','.join(sorted(by_part))}].")
    found = LoRAConfig(r=found.r, alpha=found.alpha, dropout=found.dropout, targets=targets,
                       bias=found.bias)
    for name, adapted in by_part.items():
        expected = {k: v for k, v in lora_sites(parts[name], targets).items()}
        if expected != adapted:
            raise ConfigError(f"model.lora.pretrained: {folder} adapts {len(adapted)} of the "
                              f"{len(expected)} projections that its targets {list(targets)} "
                              f"name in the {name} (some layers only); mmtf's adapters cover "
                              f"every block of a part.")
        add_lora(parts[name], found, owner=f"model.{name}", sites=adapted)
    with torch.no_grad():
        for module_name, site in sites.items():
            layer = parts[site.part].get_submodule(site.path)
            layer.lora_A[site.slice].copy_(modules[module_name]["lora_A"])
            layer.lora_B[site.slice].copy_(modules[module_name]["lora_B"])
    return found, [p for p in parts if p in by_part]


# (projection, slice) -> the target that adapts it (mmtf.nn.lora.TARGETS read backwards)
_TARGET_OF = {(rel.rsplit(".", 1)[-1], slice_name): target for target, sites in TARGETS.items()
              for rel, slice_name in sites}


def _match(modules: Mapping[str, Mapping[str, Tensor]], parts: Mapping[str, nn.Module],
           folder: str | Path, base: Any) -> dict[str, Site]:
    """The Site of every adapted module of the folder, shapes checked."""
    known: dict[str, Site] = {}
    for part, module in parts.items():
        for table in part_tables(part, module).values():
            known.update(slice_modules(part, module, table))
    sites: dict[str, Site] = {}
    for name, pair in modules.items():
        words = name.split(".")
        site = next((known[s] for s in (".".join(words[i:]) for i in range(len(words)))
                     if s in known), None)
        if site is None or set(pair) != {"lora_A", "lora_B"}:
            raise UserError(f"model.lora.pretrained: {folder} adapts {name!r} of "
                            f"base_model_name_or_path={base!r}, which the model's "
                            f"{' and '.join(parts)} do not have; the adapter was trained on "
                            f"another base model than model.*.pretrained.")
        layer = parts[site.part].get_submodule(site.path)
        want = {"lora_A": (pair["lora_A"].shape[0], layer.in_features),
                "lora_B": (layer.out_features // len(SLICES[site.path.rsplit('.', 1)[-1]]),
                           pair["lora_A"].shape[0])}
        for key, shape in want.items():
            if tuple(pair[key].shape) != shape:
                raise UserError(f"model.lora.pretrained: {folder} was trained for "
                                f"base_model_name_or_path={base!r}: {name}.{key}.weight has "
                                f"shape {tuple(pair[key].shape)}, but mmtf's model.{site.part}."
                                f"{site.path} ({site.slice}) needs {shape}; load the adapter "
                                f"onto the base it was trained on.")
        sites[name] = site
    return sites


# ------------------------------------------------------------------------------- writing
def write_peft_adapter(parts: Mapping[str, nn.Module], tables: Mapping[str, list[Link]],
                       lora: Mapping[str, Any], base: str | None, out: str | Path) -> Path:
    """Write the adapters of ``parts`` as a PEFT folder for the Hugging Face base whose names
    ``tables`` give (per part, in the base class's layout: ``model.`` for Whisper).

    Raises:
        UserError: a part without adapters, or an adapted slice the table cannot name.
    """
    out = Path(out)
    tensors: dict[str, Tensor] = {}
    targets: list[str] = []
    for part, module in parts.items():
        named = {(s.path, s.slice): theirs for theirs, s in
                 slice_modules(part, module, tables[part]).items()}
        for path, layer in lora_layers(module).items():
            for slice_name in layer.lora_A:
                theirs = named.get((path, slice_name))
                if theirs is None:
                    raise UserError(f"export format=peft: model.{part}.{path} ({slice_name}) "
                                    f"has no module of its own in the Hugging Face base; "
                                    f"export the merged model with format=hf merge_lora=true.")
                targets.append(theirs)
                for key in ("lora_A", "lora_B"):
                    tensors[f"{PEFT_PREFIX}{theirs}.{key}.weight"] = (
                        getattr(layer, key)[slice_name].detach().float().cpu().contiguous())
    layers = [layer for m in parts.values() for layer in lora_layers(m).values()]
    if not layers:
        raise UserError("export format=peft: the checkpoint's model has no LoRA adapters; "
                        "train with model/lora=default, or export with format=hf.")
    first: LoRALinear = layers[0]
    config = {
        "peft_type": "LORA", "task_type": None, "base_model_name_or_path": base,
        "r": first.r, "lora_alpha": first.alpha, "lora_dropout": float(lora.get("dropout", 0.0)),
        "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
        "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {}, "use_rslora": False, "use_dora": False,
        "revision": None, "library_name": "mmtf",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    print(f"Exported {len(targets)} LoRA adapters ({sum(t.numel() for t in tensors.values()):,} "
          f"values) in PEFT's format to {out}/")
    return out
