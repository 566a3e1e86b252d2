"""An embedding index: the L2-normalised embeddings of a set of media files or texts, written
once by ``mmtf.retrieve index_out=<file>`` and reused with ``index=<file>``.

The file is safetensors: one tensor ``embeddings`` (n, e) float32 and string metadata
(``format``, ``version``, ``modality`` audio|image|text, ``embed_dim``, ``count``, ``items``:
a JSON list of the n item names (media paths as given, or the texts), ``checkpoint``: the path
it was embedded with, ``fingerprint``: :func:`weights_fingerprint` of that checkpoint's
weights, ``long_audio``: the long-audio rule of audio embeddings). Reusing an index with
another checkpoint's weights or another width is refused, naming both. Why:
docs/design/retrieval-index.md

Shapes: n items, e = the embedding width.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from mmtf.errors import UserError, require_file

FORMAT = "mmtf-embedding-index"
VERSION = "1"
MODALITIES = ("audio", "image", "text")


def weights_fingerprint(module: nn.Module) -> str:
    """sha256 (hex, first 16 digits) of a module's state: every entry's name, dtype, shape and
    bytes, in name order. Equal weights give equal fingerprints on any device."""
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        if not isinstance(value, Tensor):          # extra state: not weights
            continue
        flat = value.detach().cpu().contiguous().reshape(-1)                   # (numel,)
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class EmbeddingIndex:
    """Embeddings (n, e) of ``items`` (names or texts) of one ``modality``, from the checkpoint
    whose weights have ``fingerprint``."""

    embeddings: Tensor
    items: list[str]
    modality: str
    fingerprint: str
    checkpoint: str = ""
    long_audio: str = ""

    @property
    def embed_dim(self) -> int:
        return int(self.embeddings.shape[1])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index as safetensors (parent folders created); returns the path."""
        if self.embeddings.dim() != 2 or self.embeddings.shape[0] != len(self.items):
            raise ValueError(f"EmbeddingIndex: {len(self.items)} items for embeddings of shape "
                             f"{tuple(self.embeddings.shape)}; one (e,) row per item.")
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"format": FORMAT, "version": VERSION, "modality": self.modality,
                    "embed_dim": str(self.embed_dim), "count": str(len(self.items)),
                    "items": json.dumps(self.items), "checkpoint": self.checkpoint,
                    "fingerprint": self.fingerprint, "long_audio": self.long_audio}
        save_file({"embeddings": self.embeddings.detach().float().cpu().contiguous()},
                  str(path), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> EmbeddingIndex:
        """Read an index written by :meth:`save`.

        Raises:
            UserError: a missing file, not an mmtf embedding index, or one whose items and rows
                disagree.
        """
        path = require_file(path, what="index", fix="pass index=<file written with index_out>")
        rebuild = (f"rebuild it with python -m mmtf.retrieve ckpt_path=<ckpt> media=<folder> "
                   f"index_out={path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
                names = set(f.keys())
                embeddings = f.get_tensor("embeddings") if "embeddings" in names else None
        except (SafetensorError, OSError, ValueError) as err:
            raise UserError(f"index={path} is not a safetensors file ({err}); {rebuild}.") from None
        if metadata.get("format") != FORMAT or embeddings is None:
            raise UserError(f"index={path} is not an mmtf embedding index (no {FORMAT!r} "
                            f"metadata or no 'embeddings' tensor); {rebuild}.")
        try:
            items = json.loads(metadata.get("items", ""))
        except json.JSONDecodeError:
            items = None
        modality = metadata.get("modality", "")
        if (not isinstance(items, list) or embeddings.dim() != 2
                or embeddings.shape[0] != len(items) or modality not in MODALITIES):
            raise UserError(f"index={path} is damaged: its item list, modality ({modality!r}) "
                            f"and embeddings {tuple(embeddings.shape)} disagree; {rebuild}.")
        return cls(embeddings.float(), [str(i) for i in items], modality,
                   metadata.get("fingerprint", ""), metadata.get("checkpoint", ""),
                   metadata.get("long_audio", ""))

    def check(self, path: str | os.PathLike, *, ckpt_path: str, fingerprint: str,
              embed_dim: int) -> None:
        """Refuse an index that is empty or that another checkpoint (or width) wrote.

        Raises:
            UserError: naming the index and the checkpoint, and how to rebuild it.
        """
        side = "texts=<file>" if self.modality == "text" else "media=<folder>"
        rebuild = (f"rebuild it: python -m mmtf.retrieve ckpt_path={ckpt_path} {side} "
                   f"index_out={path}")
        if not self.items:
            raise UserError(f"index={path}: no {self.modality} items in it (an empty index); "
                            f"{rebuild}.")
        if self.embed_dim != embed_dim:
            raise UserError(f"index={path} holds {self.embed_dim}-wide embeddings (from "
                            f"{self.checkpoint or 'an unnamed checkpoint'}) but "
                            f"ckpt_path={ckpt_path} embeds {embed_dim}-wide ones; {rebuild}.")
        if self.fingerprint != fingerprint:
            raise UserError(f"index={path} was embedded by another checkpoint "
                            f"({self.checkpoint or 'unnamed'}, weights {self.fingerprint or '?'})"
                            f" than ckpt_path={ckpt_path} (weights {fingerprint}); {rebuild}.")


__all__ = ["EmbeddingIndex", "weights_fingerprint"]
