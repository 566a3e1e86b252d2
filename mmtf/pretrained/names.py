"""Name tables: how an mmtf module's tensors are a Hugging Face model's, both ways.

A family writes its names once, as :class:`Link` rows (mmtf tensors, original tensors, and the
:class:`Rule` between them: same, transpose, fused rows, folded CLS position ...). A rule is a
pair of functions, so one table serves :func:`copy_weights` (import; everything checked before
anything is copied) and :func:`export_tensors` (``format=hf``)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from mmtf.errors import UserError
from mmtf.hub import CONFIG_FILE


class Rule(NamedTuple):
    """How a row's mmtf tensors are made of its originals: ``load(*originals)`` returns the mmtf
    tensors in the row's order, ``save(*mmtf tensors)`` the originals; ``save`` None = an import
    only (a tied head that reads the token embedding, which the export leaves to the tie)."""

    load: Callable[..., tuple[Tensor, ...]]
    save: Callable[..., tuple[Tensor, ...]] | None


class Link(NamedTuple):
    """One row of a name table: mmtf tensor names, original names and the rule between them."""

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    rule: Rule


def _same(t: Tensor) -> tuple[Tensor, ...]:
    return (t,)


def _transposed(t: Tensor) -> tuple[Tensor, ...]:
    return (t.t(),)


SAME = Rule(_same, _same)
# Separate key and value projections stacked into one fused ``to_kv`` (key rows first).
FUSED_KV = Rule(lambda k, v: (torch.cat([k, v], dim=0),), lambda kv: tuple(kv.chunk(2, dim=0)))
# A tied output head: imported from the token embedding, exported by the tie.
TIED = Rule(_same, None)
# GPT-2's Conv1D stores (in, out), the transpose of nn.Linear's weight.
TRANSPOSED = Rule(_transposed, _transposed)


def link(ours: str | Sequence[str], theirs: str | Sequence[str], rule: Rule = SAME) -> Link:
    """A :class:`Link`; a single name may be given as a string."""
    return Link((ours,) if isinstance(ours, str) else tuple(ours),
                (theirs,) if isinstance(theirs, str) else tuple(theirs), rule)


def original_names(table: Iterable[Link]) -> set[str]:
    """Every original tensor name ``table`` reads."""
    return {name for row in table for name in row.theirs}


def copy_weights(module: nn.Module, tensors: Mapping[str, Tensor], table: Sequence[Link], *,
                 owner: str, source: str, keep_initialised: Collection[str] = ()) -> None:
    """Copy original tensors into ``module`` through a name table, all checks before any copy.

    Args:
        module: the mmtf module to fill.
        tensors: the original tensors by name (:meth:`mmtf.hub.HFModel.tensors`).
        table: a row for every tensor of ``module`` that the original holds.
        owner, source: named in messages (the importing builder, the folder).
        keep_initialised: mmtf names without an original (GPT-2's new cross-attention).

    Raises:
        UserError: a missing original, a shape that differs, or a tensor of ``module`` that
            neither the table nor ``keep_initialised`` covers.
    """
    own = module.state_dict()
    covered = {name for row in table for name in row.ours}
    uncovered = sorted(set(own) - covered - set(keep_initialised))
    if uncovered:
        raise UserError(f"{owner}: {len(uncovered)} tensor(s) of the mmtf model have no "
                        f"source in {source}: {', '.join(uncovered[:4])}"
                        f"{', ...' if len(uncovered) > 4 else ''}; the model config does not "
                        f"match the pretrained architecture.")
    values: dict[str, Tensor] = {}
    for row in table:
        original = "+".join(row.theirs)
        for name in row.ours:
            if name not in own:
                raise UserError(f"{owner}: the mmtf model has no tensor {name!r} (for "
                                f"{original!r} of {source}); the model config does not match "
                                f"the pretrained architecture.")
        for key in row.theirs:
            if key not in tensors:
                raise UserError(f"{owner}: tensor {key!r} not found in {source}; the weights "
                                f"do not belong to this architecture or are incomplete.")
        loaded = row.rule.load(*(tensors[key] for key in row.theirs))
        for name, value in zip(row.ours, loaded, strict=True):
            if tuple(value.shape) != tuple(own[name].shape):
                raise UserError(f"{owner}: {original!r} in {source} has shape "
                                f"{tuple(value.shape)} but mmtf's {name!r} has "
                                f"{tuple(own[name].shape)}; build the model with the "
                                f"pretrained config's sizes.")
            values[name] = value
    with torch.no_grad():
        for name, value in values.items():
            own[name].copy_(value.to(own[name].dtype))


def export_tensors(state: Mapping[str, Tensor], table: Iterable[Link]) -> dict[str, Tensor]:
    """The export direction of ``table``: ``{original name: tensor}`` from an mmtf
    ``state_dict()``, as contiguous CPU copies (import-only rows are left out)."""
    out: dict[str, Tensor] = {}
    for row in table:
        if row.rule.save is None:
            continue
        saved = row.rule.save(*(state[name].detach() for name in row.ours))
        for name, value in zip(row.theirs, saved, strict=True):
            out[name] = value.cpu().contiguous()
    return out


def block_links(ours: str, theirs: str, names: Mapping[str, str], *, qkv_bias: bool = True,
                key_bias: bool = True, cross: bool = False) -> list[Link]:
    """One pre-norm ``TransformerBlock``'s rows, from a family's table of its original module
    names by role.

    Args:
        ours, theirs: the block's name prefixes (``stack.blocks.3.``, ``encoder.layer.3.``).
        names: the original's module name of each role (``norm_self q k v out norm_mlp fc_in
            fc_out``, with ``cross`` also ``norm_cross`` and ``cross_q`` ... ``cross_out``).
        qkv_bias: the q/k/v projections have biases.
        key_bias: the key projection has one too; without it (Whisper) the value bias is the
            attention's ``v_bias``.
        cross: the block has cross-attention (a decoder block).
    """
    own = {"norm_self": "norm_self", "norm_mlp": "norm_mlp", "fc_in": "mlp.fc_in",
           "fc_out": "mlp.fc_out", **({"norm_cross": "norm_cross"} if cross else {})}
    attns = {"self_attn": "", **({"cross_attn": "cross_"} if cross else {})}
    rows: list[Link] = []
    for kind in ("weight", "bias"):
        for role, name in own.items():
            rows.append(link(f"{ours}{name}.{kind}", f"{theirs}{names[role]}.{kind}"))
        for attn, role in attns.items():
            a = f"{ours}{attn}."
            k, v = (f"{theirs}{names[role + r]}.{kind}" for r in ("k", "v"))
            rows.append(link(f"{a}to_out.{kind}", f"{theirs}{names[role + 'out']}.{kind}"))
            if kind == "weight" or qkv_bias:
                rows.append(link(f"{a}to_q.{kind}", f"{theirs}{names[role + 'q']}.{kind}"))
            if kind == "weight" or (qkv_bias and key_bias):
                rows.append(link(f"{a}to_kv.{kind}", (k, v), FUSED_KV))
            elif qkv_bias:
                rows.append(link(f"{a}v_bias", v))
    return rows


def require_config(owner: str, built: Mapping[str, Any],
                   required: Mapping[str, tuple[Any, str]], *, source: str,
                   key_prefix: str, hint: str = "") -> None:
    """Check that a module was built with the values a pretrained model needs.

    Args:
        owner: the importing class, named first.
        built: the module's constructor values (e.g. ``encoder.config``).
        required: ``{key: (needed value, "the config.json field=value it comes from")}``.
        source: the folder or hub id, named in the message.
        key_prefix: where the keys live in the Hydra config (``model.encoder``).
        hint: a further fix (e.g. the config group of the right family).

    Raises:
        UserError: one line naming every key that differs, the config.json field it disagrees
            with, and the overrides that fix it.
    """
    wrong = {k: v for k, (v, _) in required.items() if not _same(built.get(k), v)}
    if not wrong:
        return
    why = "; ".join(f"{k}={_override(built.get(k))}, but it has {required[k][1]} "
                    f"({k}={_override(v)})" for k, v in wrong.items())
    fix = " ".join(f"{key_prefix}.{k}={_override(v)}" for k, v in wrong.items())
    raise UserError(f"{owner}: {key_prefix} does not match {source}/{CONFIG_FILE}: {why}; "
                    f"set {fix}{hint}.")


def fill_sizes(owner: str, sizes: Mapping[str, Any],
               needed: Mapping[str, tuple[Any, str]] | None, *, pretrained: Any, source: str,
               key_prefix: str, fixed: Mapping[str, Any] | None = None,
               folder: str = "Hugging Face folder") -> dict[str, Any]:
    """A builder's sizes with every null read from ``config.json`` (a given size must equal it).

    Args:
        owner, source, key_prefix: as :func:`require_config`.
        sizes: the builder's size arguments; None = read from ``config.json``.
        needed: :func:`require_config`'s ``required``, or None without a Hugging Face folder.
        pretrained, folder: the builder's ``pretrained`` and what it should be, for messages.
        fixed: settings the architecture fixes, checked against ``needed`` too.

    Raises:
        UserError: a size that differs from ``config.json``, or a null one with nothing to read.
    """
    filled = dict(sizes)
    if needed is not None:
        fixed = dict(fixed or {})
        require_config(owner, {**fixed, **filled},
                       {k: v for k, v in needed.items() if k in fixed or filled.get(k) is not None},
                       source=source, key_prefix=key_prefix)
        filled = {k: needed[k][0] if v is None else v for k, v in filled.items()}
    unset = sorted(k for k, v in filled.items() if v is None)
    if unset:
        raise UserError(f"{owner}: {key_prefix}.{unset[0]} is null, which means 'read it from "
                        f"config.json', but {key_prefix}.pretrained ({pretrained}) is no "
                        f"{folder}; set the sizes or point pretrained at one.")
    return filled


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, bool) or isinstance(theirs, bool) or ours is None or theirs is None:
        return ours is theirs or ours == theirs and type(ours) is type(theirs)
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=0.0)
    return ours == theirs


def _override(value: Any) -> str:
    """A value as a Hydra command-line override spells it."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override(v) for v in value) + "]"
    return str(value)


def write_tokenizer_files(tokenizer: Any, out: Path, *, tokenizer_class: str,
                          model_max_length: int) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` of a :class:`mmtf.text.PretrainedTokenizer`
    as ``save_pretrained`` writes them, its special tokens named by their text."""
    tokenizer.backend.save(str(out / "tokenizer.json"))
    names = {f"{name}_token": tokenizer.id_to_token(i) for name, i in (
        ("bos", tokenizer.bos_id), ("eos", tokenizer.eos_id), ("pad", tokenizer.pad_id),
        ("unk", tokenizer.unk_id)) if i is not None}
    (out / "tokenizer_config.json").write_text(json.dumps(
        {**names, "tokenizer_class": tokenizer_class, "model_max_length": model_max_length},
        indent=2))
