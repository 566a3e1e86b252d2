"""`python -m mmtf.retrieve ckpt_path=<contrastive ckpt> media=<folder> query="a dog barks"`.

Ranks media for text queries (``query=`` / ``queries=[...]`` or a text file, one per line) or
texts (``texts=<file>``, one caption per line) for media queries (``media_query=<file>``) with a
contrastive checkpoint, and prints each query's ``top_k`` with their cosine scores
(``format=table|json``). ``index_out=<file>`` writes the embeddings of the ranked side as an
:class:`~mmtf.retrieve.index.EmbeddingIndex`; ``index=<file>`` reuses one instead of embedding
again (refused when another checkpoint or width wrote it). Media are read as ``mmtf.predict``
reads them (:mod:`mmtf.predict.embed`; ``long_audio=crop|window``). Equal scores keep the
items' order (a stable sort). The guide: docs/guide/retrieval.md

Shapes: q queries, n ranked items, e = the embedding width, k = top_k.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from mmtf.data.audio import AUDIO_EXTENSIONS
from mmtf.data.image import IMAGE_EXTENSIONS
from mmtf.errors import UserError, require_file
from mmtf.predict import expand_inputs
from mmtf.predict.embed import require_contrastive
from mmtf.predict.model import Model, load
from mmtf.retrieve.index import EmbeddingIndex, weights_fingerprint
from mmtf.utils.config import require_values, run_cli
from mmtf.utils.config_dir import CONF_DIR
from mmtf.utils.cpu_sharing import share_cpu

FORMATS = ("table", "json")
EXTENSIONS = {"audio": AUDIO_EXTENSIONS, "image": IMAGE_EXTENSIONS}


def rank(queries: Tensor, items: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """The ``top_k`` items of each query by cosine (both sides L2-normalised).

    Args:
        queries: (q, e); items: (n, e).

    Returns:
        scores (q, k) and item indices (q, k), best first, k = min(top_k, n); equal scores in
        the items' order.
    """
    scores = queries.float() @ items.float().T                                 # (q, n)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices    # (q, n)
    order = order[:, :min(top_k, items.shape[0])]                              # (q, k)
    return scores.gather(1, order), order


def _strings(value: Any) -> list[str] | None:
    """A config value that is a string or a list of them, as a list (None when unset)."""
    if value is None:
        return None
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def read_lines(path: str | Path, key: str) -> list[str]:
    """The non-empty lines (stripped) of a UTF-8 text file given as ``key``."""
    path = require_file(path, what=f"{key} file", fix=f"pass {key}=<a text file, one per line>")
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError:
        raise UserError(f"{key}={path} is not UTF-8 text; pass a text file, one per line."
                        ) from None
    lines = [line for line in lines if line]
    if not lines:
        raise UserError(f"{key}={path}: no lines found in it; write one per line.")
    return lines


def text_queries(cfg: DictConfig) -> list[str]:
    """``query`` and ``queries`` (a list, or a text file of one query per line)."""
    out = _strings(cfg.get("query")) or []
    queries = _strings(cfg.get("queries"))
    if queries is not None and len(queries) == 1 and Path(queries[0]).expanduser().is_file():
        queries = read_lines(queries[0], "queries")
    out += queries or []
    for text in out:
        path = Path(text).expanduser()
        if path.suffix.lower() in (*AUDIO_EXTENSIONS, *IMAGE_EXTENSIONS) and path.is_file():
            raise UserError(f"query={text} is a media file, and a query is text; pass "
                            f"media_query={text} (with texts=<file>) to rank texts for it.")
    return out


def media_files(model: Model, value: list[str], key: str) -> list[Path]:
    """Files of ``value`` (folders expanded) of the checkpoint's modality."""
    modality = model.task.modality
    extensions = EXTENSIONS[modality]
    other = "image" if modality == "audio" else "audio"
    for item in value:
        path = Path(item).expanduser()
        if path.is_file() and path.suffix.lower() in EXTENSIONS[other]:
            raise UserError(f"{key}={item} is an {other} file, and this checkpoint embeds "
                            f"{modality} ({'/'.join(extensions)}); pass {modality} files.")
    return expand_inputs(value, extensions, key=key)


def embed(model: Model, modality: str, items: Sequence[Any], cfg: DictConfig) -> Tensor:
    """(n, e) embeddings of media files or texts, ``cfg.batch_size`` at a time."""
    if modality == "text":
        return model.embed_text(list(items), batch_size=cfg.batch_size)
    if modality == "audio":
        return model.embed_audio(items, batch_size=cfg.batch_size,
                                 long_audio=cfg.get("long_audio", "crop"))
    return model.embed_image(items, batch_size=cfg.batch_size)


def gallery(model: Model, cfg: DictConfig, kind: str, fingerprint: str) -> EmbeddingIndex:
    """The ranked side: the index given, or ``media`` / ``texts`` embedded now (and written to
    ``index_out`` when set)."""
    ckpt = str(cfg.ckpt_path)
    sources = [k for k in ("index", "media", "texts") if cfg.get(k) is not None]
    if len(sources) != 1:
        raise UserError(f"set one of index=<file>, media=<folder or files>, texts=<file> to "
                        f"rank (got {', '.join(sources) or 'none'}).")
    if cfg.get("index") is not None:
        if cfg.get("index_out") is not None:
            raise UserError("index and index_out are both set; index reuses an index, "
                            "index_out writes one from media=... or texts=...: set one.")
        index = EmbeddingIndex.load(cfg.index)
        index.check(cfg.index, ckpt_path=ckpt, fingerprint=fingerprint,
                    embed_dim=model.task.hparams.embed_dim)
        if index.modality != kind and "text" in (index.modality, kind):
            want = ("media_query=<file> to rank its texts" if index.modality == "text"
                    else "query=<text> to rank its media")
            raise UserError(f"index={cfg.index} holds {index.modality} embeddings, and the "
                            f"query ranks {kind}; pass {want}.")
        if index.modality != kind:
            raise UserError(f"index={cfg.index} holds {index.modality} embeddings but "
                            f"ckpt_path={ckpt} embeds {kind}; use an index of its {kind}.")
        return index
    if cfg.get("texts") is not None:
        if kind != "text":
            raise UserError(f"texts=... ranks captions for media_query=<file>, but the query "
                            f"is text; pass media=<folder> to rank {kind} for it.")
        texts = _strings(cfg.texts) or []
        if len(texts) == 1 and Path(texts[0]).expanduser().is_file():
            texts = read_lines(texts[0], "texts")
        if not texts:
            raise UserError("texts: no captions given; pass texts=<file, one caption per "
                            "line>.")
        items: list[str] = texts
        embeddings = embed(model, "text", texts, cfg)
    else:
        if kind == "text":
            raise UserError("media=... ranks media for a text query, but media_query asks for "
                            "texts; pass texts=<file, one caption per line>.")
        files = media_files(model, _strings(cfg.media) or [], "media")
        items = [str(f) for f in files]
        embeddings = embed(model, kind, files, cfg)
    index = EmbeddingIndex(embeddings.cpu(), items, kind, fingerprint, ckpt,
                           str(cfg.get("long_audio", "crop")) if kind == "audio" else "")
    if cfg.get("index_out") is not None:
        path = index.save(cfg.index_out)
        # stderr: stdout stays the rankings alone (one JSON object per line with format=json)
        print(f"Wrote {path} ({len(items)} {kind} items, {index.embed_dim}-wide)",
              file=sys.stderr)
    return index


def retrieve(cfg: DictConfig) -> list[dict[str, Any]]:
    """The CLI body: rank, print, return one ``{"query", "results": [{"rank", "score",
    "item"}]}`` per query (an empty list when only an index was written)."""
    require_values(cfg)
    share_cpu(cfg.get("cpu_sharing"))
    fmt = cfg.get("format", "table")
    if fmt not in FORMATS:
        raise UserError(f"format={fmt!r} must be one of {', '.join(FORMATS)}.")
    if not isinstance(cfg.top_k, int) or cfg.top_k < 1:
        raise UserError(f"top_k ({cfg.top_k!r}) must be an int >= 1.")
    texts = text_queries(cfg)
    media_query = _strings(cfg.get("media_query"))
    if texts and media_query:
        raise UserError("query/queries and media_query are both set; a text query ranks "
                        "media=..., a media query ranks texts=...: set one.")
    if not texts and not media_query and cfg.get("index_out") is None:
        raise UserError("nothing to rank: set query=<text> (or queries=...) with "
                        "media=<folder>, media_query=<file> with texts=<file>, or "
                        "index_out=<file> to only write an index.")
    device = "cuda" if cfg.accelerator in ("auto", "gpu") and torch.cuda.is_available() else "cpu"
    model, _ = load(cfg.ckpt_path, device=device)
    require_contrastive(model.task, f"ckpt_path={cfg.ckpt_path}")
    modality = model.task.modality
    fingerprint = weights_fingerprint(model.task)
    if not texts and not media_query:
        kind = "text" if cfg.get("texts") is not None else modality
        gallery(model, cfg, kind, fingerprint)
        return []
    kind = modality if texts else "text"
    index = gallery(model, cfg, kind, fingerprint)
    if texts:
        names = texts
        queries = model.embed_text(texts, batch_size=cfg.batch_size)              # (q, e)
    else:
        files = media_files(model, media_query, "media_query")
        names = [str(f) for f in files]
        queries = embed(model, modality, files, cfg)                              # (q, e)
    scores, order = rank(queries.cpu(), index.embeddings, cfg.top_k)            # (q, k)
    rows = [{"query": name,
             "results": [{"rank": r + 1, "score": round(float(s), 6), "item": index.items[i]}
                         for r, (s, i) in enumerate(zip(row_scores.tolist(), row.tolist()))]}
            for name, row_scores, row in zip(names, scores, order)]
    for row in rows:
        if fmt == "json":
            print(json.dumps(row))
            continue
        print(f"query: {row['query']}")
        for hit in row["results"]:
            print(f"{hit['rank']:>4}  {hit['score']:+.4f}  {hit['item']}")
    return rows


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="retrieve")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(retrieve, cfg)


def main() -> None:
    """Console entry point (``mmtf-retrieve``)."""
    _hydra_main()


__all__ = ["EmbeddingIndex", "main", "rank", "retrieve", "weights_fingerprint"]
