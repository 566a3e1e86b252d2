"""Model folders on disk: Hugging Face–format folders and hub ids, and mmtf export folders.

The lowest layer that knows a model folder, so every layer reads them alike. A Hugging Face
model is ``config.json`` + ``model.safetensors`` (or its shards and index), or a hub id resolved
through ``huggingface_hub``'s cache; pickled weights are refused. An mmtf export is
``weights.safetensors`` + ``config.yaml`` (+ ``tokenizer.json``): :func:`write_export` and
:func:`open_export` are the only code that knows that layout."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from mmtf.errors import UserError, require_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.ckpt")
# What a hub download fetches: config, safetensors weights, tokenizer and preprocessing files.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
# The files of an mmtf export folder.
EXPORT_WEIGHTS = "weights.safetensors"
EXPORT_CONFIG = "config.yaml"
EXPORT_TOKENIZER = "tokenizer.json"


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


def open_hf_model(source: str | Path, *, model_types: Collection[str], owner: str,
                  family: str | None = None, supported: str | None = None) -> HFModel:
    """Check and open a Hugging Face–format model folder or hub id.

    Args:
        source: a folder, or a hub id ``org/name`` (downloaded into the hub cache when online).
        model_types: the ``config.json`` ``model_type`` values the caller imports.
        owner: the importing class or config key, named in every message.
        family: what the caller builds ("LLM", "text-encoder"): another ``model_type`` is then
            "not a supported <family> family" with the supported list, checked before the
            weights (a folder of another family may hold weights mmtf cannot read).
        supported: how that message lists what is supported (default: the model types).

    Raises:
        UserError: no such folder or hub id, a missing or bad ``config.json``, no safetensors
            weights (or only pickled ones), or another ``model_type``.
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
    kind = config.get("model_type") if isinstance(config, dict) else None
    if family is not None and kind is not None and kind not in model_types:
        raise UserError(f"{source}: model_type {kind!r} is not a supported {family} family; "
                        f"mmtf builds {supported or ', '.join(sorted(model_types))}.")
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


# ---------------------------------------------------------------------------- mmtf exports
def is_export(source: str | Path) -> bool:
    """Whether ``source`` is an mmtf export rather than a Hugging Face model: a ``.safetensors``
    file, or a folder holding ``weights.safetensors`` and no ``config.json``."""
    path = Path(source).expanduser()
    if path.suffix == ".safetensors":
        return True
    return (path.is_dir() and not (path / CONFIG_FILE).is_file()
            and (path / EXPORT_WEIGHTS).is_file())


@dataclass
class ExportFolder:
    """An mmtf export, checked to hold its weights file.

    Attributes:
        weights_file: ``weights.safetensors`` (or the ``.safetensors`` file passed).
        owner: the reading class or config key, named in every message.
        error: the :class:`UserError` subclass raised.
    """

    weights_file: Path
    owner: str
    error: type[UserError] = UserError

    @property
    def folder(self) -> Path:
        return self.weights_file.parent

    @property
    def config_file(self) -> Path:
        return self.folder / EXPORT_CONFIG

    def tensors(self) -> dict[str, Tensor]:
        """The exported ``state_dict()`` (safetensors only; nothing is unpickled)."""
        try:
            return load_file(str(self.weights_file), device="cpu")
        except Exception as err:  # SafetensorError (a plain Exception): not a safetensors file
            raise self.error(f"{self.owner}: {str(self.weights_file)!r} is not a valid "
                             f"safetensors file ({err}); re-export it with python -m "
                             f"mmtf.export.") from None

    def config(self, *, resolve: bool = False) -> dict[str, Any]:
        """The part's node of ``config.yaml`` (the top level, ``encoder`` or ``model.encoder``,
        ``decoder`` or ``model.decoder``: what an export, a part's config or a run's config
        holds); ``{}`` when there is none or it does not parse (a broken config only costs the
        sizes or a hint, never the error about the weights)."""
        if not self.config_file.is_file():
            return {}
        try:
            cfg = OmegaConf.to_container(OmegaConf.load(self.config_file), resolve=resolve)
        except Exception:
            return {}
        if not isinstance(cfg, dict):
            return {}
        model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
        for node in (cfg, cfg.get("encoder"), model.get("encoder"), cfg.get("decoder"),
                     model.get("decoder")):
            if isinstance(node, dict) and ("_target_" in node or "dim" in node):
                return node
        return {}


def open_export(source: str | Path, *, owner: str, key: str = "model.encoder.pretrained",
                error: type[UserError] = UserError) -> ExportFolder:
    """An mmtf export folder (or its ``.safetensors`` file), checked to hold its weights.

    Args:
        source: the folder written by ``python -m mmtf.export``, or a ``.safetensors`` file.
        owner, key: the reading class or config key (named in every message), and the config
            key that names ``source`` (named in the fix).
        error: the :class:`UserError` subclass to raise (``CheckpointError`` for ``mmtf.export``).

    Raises:
        error: the weights file does not exist (or is a directory).
    """
    path = Path(source).expanduser()
    file = path if path.suffix == ".safetensors" else path / EXPORT_WEIGHTS
    require_file(file, what=f"{owner}: weights file",
                 fix=f"set {key} to a folder written by mmtf-export (it holds {EXPORT_WEIGHTS}) "
                     f"or to a .safetensors file", error=error)
    return ExportFolder(weights_file=file, owner=owner, error=error)


def write_export(out: str | Path, state: Mapping[str, Tensor], config: Mapping[str, Any], *,
                 metadata: Mapping[str, str] | None = None, tokenizer: Any = None) -> Path:
    """Write an mmtf export folder: ``weights.safetensors`` (copies of ``state``: safetensors
    refuses tensors that share memory, such as a decoder's tied embedding and output head),
    ``config.yaml`` (``config``) and, given a tokenizer, ``tokenizer.json``. Returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in state.items()},
              str(out / EXPORT_WEIGHTS), metadata=dict(metadata or {}))
    (out / EXPORT_CONFIG).write_text(OmegaConf.to_yaml(OmegaConf.create(dict(config))))
    if tokenizer is not None:
        tokenizer.save(out / EXPORT_TOKENIZER)
    return out
