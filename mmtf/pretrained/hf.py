"""Reading a Hugging Face–format model directory without ``transformers``.

A pretrained model is a folder with ``config.json`` and ``model.safetensors`` (or sharded
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``), tokenizer files
beside them; or a hub id (``openai/whisper-tiny``), resolved through ``huggingface_hub`` into
its usual cache when the machine is online (offline, a hub id already in the cache resolves
too). Pickled weights (``pytorch_model.bin``, ``*.pt``) are refused: nothing is ever unpickled.

:func:`open_hf_model` checks the folder and its ``config.json`` (``model_type`` must be one the
caller imports); :func:`copy_weights` copies the original tensors into an mmtf module through a
name map, checking every name and shape first so a failed import changes nothing. Each model
family's map lives in its own module of :mod:`mmtf.pretrained`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from mmtf.errors import UserError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.ckpt")
# What a hub download fetches: config, safetensors weights, tokenizer and preprocessing files.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]

# A transform applied to an original tensor before it is copied (e.g. GPT-2's Conv1D -> Linear
# transpose, or slicing a fused projection); with several originals it receives them in order
# (e.g. fusing separate key and value projections into one).
Transform = Callable[..., Tensor]
# What one mmtf tensor is made of: an original name, (name, transform) or ((names...), transform).
Source = str | tuple[str, Transform] | tuple[tuple[str, ...], Transform]


@dataclass
class HFModel:
    """A checked Hugging Face–format folder.

    Attributes:
        folder: the local folder (a hub id is resolved to its cache snapshot).
        config: ``config.json`` as a dict.
        source: what the user passed (folder or hub id), for messages.
    """

    folder: Path
    config: dict[str, Any]
    source: str
    _files: list[Path] = field(default_factory=list, repr=False)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    def field(self, key: str, *, owner: str) -> Any:
        """``config.json[key]``; a UserError naming the file and the key when it is missing."""
        if key not in self.config:
            raise UserError(f"{owner}: {self.folder / CONFIG_FILE} has no field {key!r}, which "
                            f"a {self.model_type or 'model'} config must have; is the folder "
                            f"complete (save it again with save_pretrained)?")
        return self.config[key]

    def weight_files(self) -> list[Path]:
        """The safetensors files holding the weights (one, or the shards of the index)."""
        return list(self._files)

    def keys(self) -> list[str]:
        """Names of every stored tensor (nothing is read)."""
        names: list[str] = []
        for file in self._files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                names.extend(handle.keys())
        return names

    def prefix(self, anchor: str, *, owner: str) -> str:
        """The prefix of the tensor names (``""``, ``"vit."``, ``"vision_model."``,
        ``"decoder.transformer."``, ...), found from the one name that ends with ``anchor``.

        Raises:
            UserError: no tensor name ends with ``anchor`` (named, with the folder).
        """
        found = sorted(k[:-len(anchor)] for k in self.keys()
                       if k == anchor or k.endswith("." + anchor))
        if not found:
            raise UserError(f"{owner}: no tensor named '*{anchor}' in {self.source}; the "
                            f"weights do not belong to a {self.model_type or 'model'} of this "
                            f"family or are incomplete.")
        return min(found, key=len)

    def tensors(self, keys: Collection[str] | None = None) -> dict[str, Tensor]:
        """The original tensors, float as stored (all of them, or only ``keys``)."""
        out: dict[str, Tensor] = {}
        for file in self._files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    if keys is None or key in keys:
                        out[key] = handle.get_tensor(key)
        return out


def open_hf_model(source: str | Path, *, model_types: Collection[str], owner: str) -> HFModel:
    """Check and open a Hugging Face–format model folder or hub id.

    Args:
        source: a folder, or a hub id ``org/name`` (downloaded into the hub cache when online).
        model_types: the ``config.json`` ``model_type`` values the caller imports.
        owner: the importing class or config key, named in every message.

    Raises:
        UserError: the folder or hub id cannot be found; ``config.json`` is missing or not
            JSON; only pickled weights are present (the message says how to convert); no
            safetensors weights; ``model_type`` is not one of ``model_types``.
    """
    folder = resolve_source(source, owner=owner)
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise UserError(f"{owner}: {config_file} not found; a pretrained model folder holds "
                        f"{CONFIG_FILE} and {WEIGHTS_FILE} (as save_pretrained writes them).")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{owner}: {config_file} is not valid JSON ({err}).") from None
    files = _weight_files(folder, owner=owner)
    model = HFModel(folder=folder, config=config, source=str(source), _files=files)
    if model.model_type not in model_types:
        raise UserError(f"{owner}: {config_file} has model_type={model.model_type!r}, but this "
                        f"loader reads {' or '.join(repr(t) for t in sorted(model_types))}; "
                        f"point it at a model of that family or pick the matching config.")
    return model


def resolve_source(source: str | Path, *, owner: str) -> Path:
    """A local folder as is; otherwise a hub id through ``huggingface_hub`` (its cache)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    text = str(source)
    if not _looks_like_hub_id(text):
        raise UserError(f"{owner}: {text!r} is neither a folder nor a hub id (org/name); "
                        f"pass the folder that holds {CONFIG_FILE}.")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"{owner}: {text!r} is not a folder, and reading hub ids needs "
                        f"huggingface_hub: pip install 'mmtf[hf]', or download the model "
                        f"elsewhere and pass its folder.") from None
    try:
        return Path(snapshot_download(text, allow_patterns=HUB_PATTERNS))
    except Exception as err:  # offline, unknown repo, gated repo: one message for each
        try:
            return Path(snapshot_download(text, allow_patterns=HUB_PATTERNS,
                                          local_files_only=True))
        except Exception:
            raise UserError(f"{owner}: {text!r} is no local folder, and as a hub id it "
                            f"could not be fetched ({type(err).__name__}: "
                            f"{str(err).strip().splitlines()[0]}); check the "
                            f"path, or on an offline machine download it elsewhere "
                            f"(huggingface-cli download {text}) and pass the folder.") from None


def is_hf_source(source: str | Path) -> bool:
    """Whether ``source`` names a Hugging Face–format model rather than an mmtf export: a folder
    holding ``config.json``, or an ``org/name`` hub id that is no local path."""
    path = Path(source).expanduser()
    if path.exists():
        return path.is_dir() and (path / CONFIG_FILE).is_file()
    return path.suffix != ".safetensors" and _looks_like_hub_id(str(source))


def _looks_like_hub_id(text: str) -> bool:
    return text.count("/") == 1 and not text.startswith((".", "/", "~"))


def _weight_files(folder: Path, *, owner: str) -> list[Path]:
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                                .values()))
        except (json.JSONDecodeError, KeyError) as err:
            raise UserError(f"{owner}: {index} is not a safetensors index ({err}).") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise UserError(f"{owner}: {index} lists {missing[0]!r}, which is not in {folder}; "
                            f"download every shard.")
        return [folder / s for s in shards]
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    pickled = [name for name in PICKLED_WEIGHTS if (folder / name).is_file()]
    if pickled:
        raise UserError(f"{owner}: {folder} holds only pickled weights ({pickled[0]}), which "
                        f"mmtf never unpickles; convert them once with transformers: "
                        f"AutoModel.from_pretrained(folder).save_pretrained(folder, "
                        f"safe_serialization=True), which writes {WEIGHTS_FILE}.")
    raise UserError(f"{owner}: {folder / WEIGHTS_FILE} not found; a pretrained model folder "
                    f"holds {CONFIG_FILE} and {WEIGHTS_FILE}.")


def copy_weights(module: nn.Module, tensors: Mapping[str, Tensor],
                 mapping: Mapping[str, Source], *, owner: str,
                 source: str, keep_initialised: Collection[str] = ()) -> None:
    """Copy original tensors into ``module`` by name, all checks before any copy.

    Args:
        module: the mmtf module to fill.
        tensors: the original tensors by their original names (:meth:`HFModel.tensors`).
        mapping: ``{mmtf name: original name}``, ``{mmtf name: (original name, transform)}``
            or ``{mmtf name: ((original names...), transform)}`` for every parameter and
            persistent buffer of ``module`` that the original holds.
        owner, source: named in messages (the importing class, the folder).
        keep_initialised: mmtf names that have no original (e.g. new cross-attention layers
            on GPT-2) and keep their fresh initialisation.

    Raises:
        UserError: an original tensor is missing (named, with the file it was expected in), a
            shape differs (both shapes named), or ``module`` has a tensor that neither the
            mapping nor ``keep_initialised`` covers.
    """
    own = module.state_dict()
    uncovered = sorted(set(own) - set(mapping) - set(keep_initialised))
    if uncovered:
        raise UserError(f"{owner}: {len(uncovered)} tensor(s) of the mmtf model have no "
                        f"source in {source}: {', '.join(uncovered[:4])}"
                        f"{', ...' if len(uncovered) > 4 else ''}; the model config does not "
                        f"match the pretrained architecture.")
    values: dict[str, Tensor] = {}
    for name, spec in mapping.items():
        original, transform = (spec, None) if isinstance(spec, str) else spec
        originals = (original,) if isinstance(original, str) else tuple(original)
        original = "+".join(originals)
        if name not in own:
            raise UserError(f"{owner}: the mmtf model has no tensor {name!r} (for {original!r} "
                            f"of {source}); the model config does not match the pretrained "
                            f"architecture.")
        for key in originals:
            if key not in tensors:
                raise UserError(f"{owner}: tensor {key!r} not found in {source}; the weights "
                                f"do not belong to this architecture or are incomplete.")
        parts = [tensors[key] for key in originals]
        value = parts[0] if transform is None else transform(*parts)
        if tuple(value.shape) != tuple(own[name].shape):
            raise UserError(f"{owner}: {original!r} in {source} has shape "
                            f"{tuple(value.shape)} but mmtf's {name!r} has "
                            f"{tuple(own[name].shape)}; build the model with the pretrained "
                            f"config's sizes.")
        values[name] = value
    with torch.no_grad():
        for name, value in values.items():
            own[name].copy_(value.to(own[name].dtype))


def original_names(mapping: Mapping[str, Source]) -> set[str]:
    """Every original tensor name a :func:`copy_weights` mapping reads."""
    names: set[str] = set()
    for spec in mapping.values():
        original = spec if isinstance(spec, str) else spec[0]
        names.update((original,) if isinstance(original, str) else original)
    return names


def block_map(ours: str, theirs: str, names: Mapping[str, str], *, qkv_bias: bool = True,
              key_bias: bool = True, cross: bool = False) -> dict[str, Source]:
    """One pre-norm ``TransformerBlock``'s ``{mmtf name: original name(s)}``, from a family's
    table of its original names by role.

    Args:
        ours, theirs: the block's name prefixes (``stack.blocks.3.``, ``encoder.layer.3.``).
        names: the original's module name (under ``theirs``) of each role: ``norm_self``,
            ``q``, ``k``, ``v``, ``out``, ``norm_mlp``, ``fc_in``, ``fc_out``, and with
            ``cross`` also ``norm_cross``, ``cross_q``, ``cross_k``, ``cross_v``,
            ``cross_out``; separate key and value projections are fused into ``to_kv`` (key
            rows first).
        qkv_bias: the q/k/v projections have biases.
        key_bias: the key projection has one too; without it (Whisper) the value bias is the
            attention's ``v_bias``.
        cross: the block has cross-attention (a decoder block).
    """
    own = {"norm_self": "norm_self", "norm_mlp": "norm_mlp", "fc_in": "mlp.fc_in",
           "fc_out": "mlp.fc_out", **({"norm_cross": "norm_cross"} if cross else {})}
    attns = {"self_attn": "", **({"cross_attn": "cross_"} if cross else {})}
    mapping: dict[str, Source] = {}
    for kind in ("weight", "bias"):
        for role, name in own.items():
            mapping[f"{ours}{name}.{kind}"] = f"{theirs}{names[role]}.{kind}"
        for attn, role in attns.items():
            a = f"{ours}{attn}."
            k, v = (f"{theirs}{names[role + r]}.{kind}" for r in ("k", "v"))
            mapping[f"{a}to_out.{kind}"] = f"{theirs}{names[role + 'out']}.{kind}"
            if kind == "weight" or qkv_bias:
                mapping[f"{a}to_q.{kind}"] = f"{theirs}{names[role + 'q']}.{kind}"
            if kind == "weight" or (qkv_bias and key_bias):
                mapping[f"{a}to_kv.{kind}"] = ((k, v), cat_rows)
            elif qkv_bias:
                mapping[f"{a}v_bias"] = v
    return mapping


def split_back(state: Mapping[str, Tensor], mapping: Mapping[str, Source]) -> dict[str, Tensor]:
    """The inverse of a :func:`copy_weights` mapping for its plain names and :func:`cat_rows`
    entries (split into equal row blocks, e.g. ``to_kv`` into key and value): ``{original
    name: tensor}``. Entries with other transforms are the caller's to invert."""
    out: dict[str, Tensor] = {}
    for ours, spec in mapping.items():
        if isinstance(spec, str):
            out[spec] = state[ours]
        elif spec[1] is cat_rows:
            names = spec[0]
            out.update(zip(names, state[ours].chunk(len(names), dim=0), strict=True))
    return out


def cat_rows(*tensors: Tensor) -> Tensor:
    """Separate projections stacked into one fused layer's weight or bias (dim 0 = outputs):
    key and value -> ``to_kv``."""
    return torch.cat(tensors, dim=0)


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
