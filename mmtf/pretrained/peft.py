"""LoRA adapters in PEFT's folder format, both ways, through the families' name tables.

A PEFT folder is ``adapter_config.json`` + ``adapter_model.safetensors``
(``base_model.model.M.lora_A.weight`` (r, in), ``...lora_B.weight`` (out, r)). Which Hugging
Face module each slice of an mmtf projection is comes from the same
:class:`~mmtf.pretrained.names.Link` rows as the base weights (GPT-2's fused ``c_attn`` is one
adapter of rank 3r with block-diagonal B); ``peft`` is never imported.
:func:`write_peft_adapter` (``format=peft``), :func:`load_peft_adapter`
(``model.lora.pretrained=<folder>``). Why: docs/design/lora.md"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from mmtf.errors import ConfigError, UserError, require_file
from mmtf.nn.lora import (
    BIAS_MODES,
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
    """One slice of an mmtf projection, all of or a block of rows of one Hugging Face module."""

    part: str
    path: str        # the projection, in the part (stack.blocks.0.self_attn.to_kv)
    slice: str       # k


def slice_modules(part: str, module: nn.Module, table: list[Link],
                  rename: Callable[[str], str] | None = None) -> dict[str, tuple[Site, ...]]:
    """``{Hugging Face module name: the Sites its output rows hold, in row order}`` for every
    projection slice of ``module`` that the name table maps to an original module: one Site for
    Whisper's, ViT's and CLIP's separate q/k/v; several for a fused original, GPT-2's
    ``attn.c_attn`` (q, k, v: slices of ``to_q`` and ``to_kv``) and ``crossattention.c_attn``
    (k, v). ``rename`` gives the module's name as the installed transformers names it, where
    that is not the checkpoint's (:func:`module_renames`)."""
    adapted = lora_sites(module, tuple(TARGETS))
    out: dict[str, tuple[Site, ...]] = {}
    for row in table:
        paths = [w.removesuffix(".weight") for w in row.ours]
        if not all(w.endswith(".weight") and p in adapted for w, p in zip(row.ours, paths,
                                                                          strict=True)):
            continue
        sites = tuple(Site(part, p, s) for p in paths for s in SLICES[p.rsplit(".", 1)[-1]])
        names = [t.removesuffix(".weight") for t in row.theirs]
        if rename is not None:
            names = [rename(n) for n in names]
        if len(names) == len(sites):                 # one original module per slice
            out.update({n: (site,) for n, site in zip(names, sites, strict=True)})
        elif len(names) == 1:                        # one original module holds them all
            out[names[0]] = sites
    return out


def module_renames(family: str) -> Callable[[str], str] | None:
    """The family's ``peft_module_name`` (checkpoint name -> the installed transformers' module
    name, which a PEFT folder made there uses), if its modules were renamed."""
    return getattr(family_module(family), "peft_module_name", None)


def part_tables(part: str, module: nn.Module, prefix: str = "",
                ) -> dict[str, list[Link]]:
    """The name tables of every family whose architecture ``module`` has, by family."""
    tables = {}
    for family, entry in FAMILIES.items():
        if part not in entry.builders:
            continue
        family_code = family_module(family)
        # Only for the class the family's builder returns: an error in its table's code on
        # that class is a bug to see, never "the adapter was trained on another base".
        built = inspect.signature(getattr(family_code, entry.builders[part])).return_annotation
        built = getattr(built, "__name__", built)       # a class, or its name (a string)
        if built not in {c.__name__ for c in type(module).__mro__}:
            continue
        try:
            tables[family] = family_code.part_links(part, module, prefix)
        except UserError:                          # not in that family's configuration
            continue
    return tables


def pattern_value(pattern: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's ``rank_pattern`` / ``alpha_pattern`` lookup (``peft.utils.other.get_pattern_key``:
    the first key that matches the end of the module name, at a dot)."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


# ------------------------------------------------------------------------------- reading
# The adapter_config.json keys of plain LoRA and the values mmtf computes (None: any value).
# Any other key set to a non-empty value is a method mmtf does not compute (DoRA, PiSSA, ...),
# whose tensors would load as plain LoRA and give other outputs than PeftModel.
_PLAIN_LORA: dict[str, Callable[[Any], bool] | None] = {
    "peft_type": lambda v: v == "LORA", "bias": lambda v: v in (None, *BIAS_MODES),
    # only how A and B were drawn before training
    "init_lora_weights": lambda v: v is True or v is False or v == "gaussian",
    # read from the folder or its tensors: rank, scale, and which layers hold adapters
    **dict.fromkeys(("r", "lora_alpha", "lora_dropout", "rank_pattern", "alpha_pattern",
                     "target_modules", "exclude_modules", "layers_to_transform",
                     "layers_pattern", "fan_in_fan_out")),
    # metadata, or settings of options refused here when they are on
    **dict.fromkeys(("base_model_name_or_path", "revision", "task_type", "inference_mode",
                     "auto_mapping", "peft_version", "library_name", "megatron_core",
                     "qalora_group_size", "ensure_weight_tying")),
}


def _plain_lora(key: str, value: Any) -> bool:
    if key in _PLAIN_LORA:
        check = _PLAIN_LORA[key]
        return check is None or check(value)
    return value is None or value is False or value in ({}, [], "")


def read_adapter(folder: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``adapter_config.json`` and the tensors of a PEFT folder, checked to be plain LoRA.

    Raises:
        UserError: a missing file, or an option mmtf does not compute (anything but plain
            LoRA: DoRA, rsLoRA, PiSSA, ..., or an option newer than this list), each named.
    """
    folder = Path(folder)
    key = "model.lora.pretrained"
    config_file = require_file(folder / ADAPTER_CONFIG, what="PEFT adapter config",
                               fix=f"point {key} at a folder saved by PeftModel.save_pretrained")
    weights = require_file(folder / ADAPTER_WEIGHTS, what="PEFT adapter weights",
                           fix=f"point {key} at a folder saved by PeftModel.save_pretrained "
                               f"(safetensors; pickled adapter_model.bin is never read)")
    config = json.loads(config_file.read_text())
    unsupported = [f"{k}={v!r}" for k, v in config.items() if not _plain_lora(k, v)]
    if unsupported:
        raise UserError(f"{key}: {config_file} has {', '.join(unsupported)}; mmtf loads plain "
                        f"LoRA adapters only (peft_type LORA, init_lora_weights true, false or "
                        f"gaussian, no DoRA / rsLoRA / PiSSA / OLoRA / CorDA / LoftQ / aLoRA / "
                        f"layer_replication / modules_to_save): load it with PeftModel, or "
                        f"train a plain LoRA adapter.")
    return config, load_file(str(weights))


def load_peft_adapter(folder: str | Path, parts: Mapping[str, nn.Module], config: LoRAConfig,
                      ) -> tuple[LoRAConfig, list[str]]:
    """Add the adapters of a PEFT folder to ``parts`` (imported from the folder's base model).

    Rank, alpha, dropout and bias come from ``adapter_config.json``; ``config`` gives only the
    defaults of what it leaves out. A module holding several mmtf slices (GPT-2's ``c_attn``)
    is split by blocks when B is block-diagonal (what ``format=peft`` writes), else each slice
    takes the whole A and its rows of B. Targets must be whole (every block of the part), so
    the returned config rebuilds the same adapters without the folder.

    Returns:
        The config the adapters have, and the parts that hold them.

    Raises:
        UserError: an adapter for another base (a module the parts lack, another shape), or
            slices of several ranks or scales.
        ConfigError: adapters that no target list describes, or a part without any.
    """
    peft_config, tensors = read_adapter(folder)
    base = peft_config.get("base_model_name_or_path")
    modules: dict[str, dict[str, Tensor]] = {}
    for name in tensors:
        if not name.endswith((".lora_A.weight", ".lora_B.weight")):
            raise UserError(f"model.lora.pretrained: {folder} holds {name!r}, which is no LoRA "
                            f"matrix of a linear layer; mmtf loads lora_A / lora_B only.")
        modules.setdefault(name.removeprefix(PEFT_PREFIX).rsplit(".", 2)[0], {})[
            name.rsplit(".", 2)[1]] = tensors[name]
    matched = _match(modules, parts, folder, base)
    rank = int(peft_config.get("r", config.r))
    alpha = float(peft_config.get("lora_alpha", config.alpha))
    pieces: dict[Site, tuple[Tensor, Tensor]] = {}
    scales: dict[tuple[int, float], str] = {}
    for name, sites in matched.items():
        a, b = modules[name]["lora_A"], modules[name]["lora_B"]
        scale = float(pattern_value(peft_config.get("alpha_pattern") or {}, name, alpha)
                      ) / a.shape[0]
        widths = [_width(parts[s.part], s.path) for s in sites]
        for site, (sa, sb) in _split(a, b, widths, rank, sites).items():
            pieces[site] = (sa, sb)
            scales.setdefault((sa.shape[0], round(scale, 12)), name)
    if len(scales) > 1:
        found = ", ".join(f"{m}: r={r}, alpha/r={s:g}" for (r, s), m in scales.items())
        raise UserError(f"model.lora.pretrained: {folder} has adapters of several ranks or "
                        f"scales ({found}); mmtf's adapters have one rank and one alpha.")
    by_part: dict[str, dict[str, set[str]]] = {}
    for site in pieces:
        by_part.setdefault(site.part, {}).setdefault(site.path, set()).add(site.slice)
    used = {_TARGET_OF[(path.rsplit(".", 1)[-1], s)] for adapted in by_part.values()
            for path, slices in adapted.items() for s in slices}
    targets = tuple(t for t in TARGETS if t in used)
    missing = [p for p in parts if p not in by_part]
    if missing:
        raise ConfigError(f"model.lora.pretrained: {folder} has no adapter in the "
                          f"{', '.join(missing)} (it adapts {sorted(by_part)}); set "
                          f"model.lora.parts=[{','.join(sorted(by_part))}].")
    (r, scale), = scales
    found = LoRAConfig(r=r, alpha=scale * r,
                       dropout=float(peft_config.get("lora_dropout", config.dropout)),
                       targets=targets, bias=peft_config.get("bias") or "none")
    for name, adapted in by_part.items():
        expected = lora_sites(parts[name], targets)
        if expected != adapted:
            raise ConfigError(f"model.lora.pretrained: {folder} adapts {len(adapted)} of the "
                              f"{len(expected)} projections that its targets {list(targets)} "
                              f"name in the {name} (some layers only); mmtf's adapters cover "
                              f"every block of a part.")
        add_lora(parts[name], found, owner=f"model.{name}", sites=adapted)
    with torch.no_grad():
        for site, (a, b) in pieces.items():
            layer = parts[site.part].get_submodule(site.path)
            layer.lora_A[site.slice].copy_(a)
            layer.lora_B[site.slice].copy_(b)
    return found, [p for p in parts if p in by_part]


def _split(a: Tensor, b: Tensor, widths: list[int], rank: int, sites: tuple[Site, ...],
           ) -> dict[Site, tuple[Tensor, Tensor]]:
    """The ``(A, B)`` of each slice of one PEFT module whose output rows are ``sites`` (of
    ``widths`` rows each), exact: ``B A`` restricted to a slice's rows is its ``B_i A_i``.

    Block mode (B block-diagonal in column groups of ``rank``, each group nonzero in one
    slice's rows at most; mmtf's export): a slice takes its group's rows of A and block of B,
    a slice without a group has no adapter. Otherwise each slice takes A and its rows of B (a
    slice whose rows are exactly zero while others' are not has none: mmtf's export of one
    adapted slice of several)."""
    bounds = [sum(widths[:i]) for i in range(len(widths) + 1)]
    rows = [b[bounds[i]:bounds[i + 1]] for i in range(len(sites))]
    if len(sites) == 1:
        return {sites[0]: (a, b)}
    groups = a.shape[0] // rank if a.shape[0] % rank == 0 and a.shape[0] > rank else 0
    owner: dict[int, int] = {}
    for g in range(groups):
        cols = slice(g * rank, (g + 1) * rank)
        nonzero = [i for i, block in enumerate(rows) if block[:, cols].abs().sum() > 0]
        if len(nonzero) > 1 or (nonzero and nonzero[0] in owner.values()):
            groups = 0
            break
        if nonzero:
            owner[g] = nonzero[0]
    if groups and groups <= len(sites):
        free = [i for i in range(len(sites)) if i not in owner.values()]
        for g in range(groups):
            if g not in owner:          # an all-zero group (a fresh adapter): in row order
                owner[g] = free.pop(0)
        return {sites[i]: (a[g * rank:(g + 1) * rank], rows[i][:, g * rank:(g + 1) * rank])
                for g, i in sorted(owner.items(), key=lambda item: item[1])}
    zero = [not block.any() for block in rows]
    return {site: (a, block) for site, block, none in zip(sites, rows, zero, strict=True)
            if not none or all(zero)}


# (projection, slice) -> the target that adapts it (mmtf.nn.lora.TARGETS read backwards)
_TARGET_OF = {(rel.rsplit(".", 1)[-1], slice_name): target for target, sites in TARGETS.items()
              for rel, slice_name in sites}


def _match(modules: Mapping[str, Mapping[str, Tensor]], parts: Mapping[str, nn.Module],
           folder: str | Path, base: Any) -> dict[str, tuple[Site, ...]]:
    """The Sites of every adapted module of the folder (under the checkpoint's name or the
    installed transformers' module name, any prefix), shapes checked."""
    known: dict[str, tuple[Site, ...]] = {}
    for part, module in parts.items():
        for family, table in part_tables(part, module).items():
            known.update(slice_modules(part, module, table))
            if (rename := module_renames(family)) is not None:
                known.update(slice_modules(part, module, table, rename))
    matched: dict[str, tuple[Site, ...]] = {}
    for name, pair in modules.items():
        words = name.split(".")
        sites = next((known[s] for s in (".".join(words[i:]) for i in range(len(words)))
                      if s in known), None)
        if sites is None or set(pair) != {"lora_A", "lora_B"}:
            raise UserError(f"model.lora.pretrained: {folder} adapts {name!r} of "
                            f"base_model_name_or_path={base!r}, which the model's "
                            f"{' and '.join(parts)} do not have; the adapter was trained on "
                            f"another base model than model.*.pretrained.")
        rank = pair["lora_A"].shape[0]
        want = {"lora_A": (rank, parts[sites[0].part].get_submodule(sites[0].path).in_features),
                "lora_B": (sum(_width(parts[s.part], s.path) for s in sites), rank)}
        for key, shape in want.items():
            if tuple(pair[key].shape) != shape:
                paths = list(dict.fromkeys(s.path for s in sites))
                where = "+".join([paths[0], *(p.rsplit(".", 1)[-1] for p in paths[1:])])
                raise UserError(f"model.lora.pretrained: {folder} was trained for "
                                f"base_model_name_or_path={base!r}: {name}.{key}.weight has "
                                f"shape {tuple(pair[key].shape)}, but mmtf's model."
                                f"{sites[0].part}.{where} ({', '.join(s.slice for s in sites)})"
                                f" needs {shape}; load the adapter onto the base it was "
                                f"trained on.")
        matched[name] = sites
    return matched


# ------------------------------------------------------------------------------- writing
def write_peft_adapter(parts: Mapping[str, nn.Module], tables: Mapping[str, list[Link]],
                       lora: Mapping[str, Any], base: str | None, out: str | Path, *,
                       renames: Mapping[str, Callable[[str], str] | None] | None = None,
                       fan_in_fan_out: bool = False) -> Path:
    """Write the adapters of ``parts`` as a PEFT folder for the Hugging Face base whose names
    ``tables`` give (per part, in the base class's layout: ``model.`` for Whisper), renamed by
    ``renames`` (per part) to the installed transformers' module names.

    A module holding several slices (GPT-2's ``c_attn``) gets one adapter of rank ``n r`` (A
    stacked, B block-diagonal; ``rank_pattern`` / ``alpha_pattern`` keep ``alpha / r``);
    ``fan_in_fan_out`` is set for ``Conv1D`` bases, as PEFT does.

    Raises:
        UserError: a part without adapters, or an adapted slice the table cannot name.
    """
    out = Path(out)
    tensors: dict[str, Tensor] = {}
    targets: list[str] = []
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    for part, module in parts.items():
        rename = (renames or {}).get(part)
        named = slice_modules(part, module, tables[part], rename)
        layers = lora_layers(module)
        sites = {site for group in named.values() for site in group}
        for path, layer in layers.items():
            for slice_name in layer.lora_A:
                if Site(part, path, slice_name) not in sites:
                    raise UserError(f"export format=peft: model.{part}.{path} ({slice_name}) "
                                    f"has no module of its own in the Hugging Face base; "
                                    f"export the merged model with format=hf merge_lora=true.")
        for theirs, group in named.items():
            pairs = [(layers[s.path].lora_A[s.slice], layers[s.path].lora_B[s.slice])
                     if s.path in layers and s.slice in layers[s.path].lora_A else None
                     for s in group]
            if not any(pairs):
                continue
            a, b = _fused([_width(module, s.path) for s in group], pairs)
            targets.append(theirs)
            n = sum(pair is not None for pair in pairs)
            if len(group) > 1 and n > 1:
                first = next(layers[s.path] for s in group if s.path in layers)
                rank_pattern[re.escape(theirs)] = n * first.r
                alpha_pattern[re.escape(theirs)] = n * first.alpha
            for key, value in (("lora_A", a), ("lora_B", b)):
                tensors[f"{PEFT_PREFIX}{theirs}.{key}.weight"] = (
                    value.detach().float().cpu().contiguous())
    all_layers = [layer for m in parts.values() for layer in lora_layers(m).values()]
    if not all_layers:
        raise UserError("export format=peft: the checkpoint's model has no LoRA adapters; "
                        "train with model/lora=default, or export with format=hf.")
    first: LoRALinear = all_layers[0]
    config = {
        "peft_type": "LORA", "task_type": None, "base_model_name_or_path": base,
        "r": first.r, "lora_alpha": first.alpha, "lora_dropout": float(lora.get("dropout", 0.0)),
        "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": fan_in_fan_out,
        "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
        "layers_to_transform": None, "layers_pattern": None, "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern, "use_rslora": False, "use_dora": False,
        "revision": None, "library_name": "mmtf",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    print(f"Exported {len(targets)} LoRA adapters ({sum(t.numel() for t in tensors.values()):,} "
          f"values) in PEFT's format to {out}/")
    return out


def _width(module: nn.Module, path: str) -> int:
    """The rows of one slice of the projection ``path`` of ``module``."""
    return module.get_submodule(path).out_features // len(SLICES[path.rsplit(".", 1)[-1]])


def _fused(widths: list[int], pairs: list[tuple[Tensor, Tensor] | None],
           ) -> tuple[Tensor, Tensor]:
    """One module's ``(A, B)`` from the ``(A_i, B_i)`` of the slices its rows hold (``widths``
    rows each; None: a slice without an adapter, zero rows): A stacks them, B is
    block-diagonal."""
    if len(pairs) == 1:
        return pairs[0]
    present = [pair for pair in pairs if pair is not None]
    a = torch.cat([pa for pa, _ in present])
    b = a.new_zeros(sum(widths), a.shape[0])
    row = col = 0
    for width, pair in zip(widths, pairs, strict=True):
        if pair is not None:
            b[row:row + width, col:col + pair[1].shape[1]] = pair[1]
            col += pair[1].shape[1]
        row += width
    return a, b
