"""The shard index: naming shards, scanning a tar into its index, caching it, items from it.

The one place that knows the on-disk format (:mod:`mmtf.data.shards`): the reader and the
writer both go through it, so an index is the same whoever made it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import re
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from PIL import Image, UnidentifiedImageError

from mmtf.data.audio import AUDIO_EXTENSIONS, audio_info
from mmtf.data.formats.aqa import qa_line_problem
from mmtf.data.formats.base import CaptionItem, QAFields, Report, clean_captions
from mmtf.data.formats.instruction import MEDIA_TOKENS, messages_problem
from mmtf.data.image import IMAGE_EXTENSIONS
from mmtf.errors import ConfigError, DataError

__all__ = ["INDEX_SUFFIX", "ShardItem", "expand_braces", "load_index", "read_shards",
           "scan_shard", "shard_urls"]

log = logging.getLogger("mmtf.data")

INDEX_SUFFIX = ".idx.json"
# 2: samples carry an instruction item's messages (and question fields), which version 1's
# scan dropped; older indexes are rescanned once.
INDEX_VERSION = 2
QA_KEYS = ("question", "question_type", "choices", "answer")
MEDIA = {"audio": AUDIO_EXTENSIONS, "image": IMAGE_EXTENSIONS}
_FIX_SHARD = "check data.shards and data.root"


@dataclass(frozen=True)
class ShardItem(CaptionItem):
    """One sample of a shard: a :class:`CaptionItem` whose media is a tar member (the header
    fields come from the index: nothing is read to probe it)."""

    path: str  # type: ignore[assignment]  # <shard url>:<member>, what messages name; no file
    shard: str = ""                         # the shard's URL or absolute path
    offset: int = 0                         # of the member's data in the shard
    size: int = 0                           # of the member's data, bytes
    duration: float = 1.0                   # seconds (audio); 1.0 for images
    channels: int | None = None             # audio only
    image_size: tuple[int, int] | None = None   # images only: (width, height)


# ---------------------------------------------------------------------------- shard lists
_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """``a/{000..002}.tar`` -> ``a/000.tar a/001.tar a/002.tar``; ``{x,y}`` -> both; several
    braces multiply. A range keeps the zero padding of its first bound; other braces stay."""
    for m in _BRACE.finditer(pattern):
        body = m.group(1)
        r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
        if r:
            lo, hi = r.groups()
            if int(hi) < int(lo):
                raise ConfigError(f"data.shards: the range {{{body}}} in {pattern!r} runs "
                                  f"backwards; write {{{hi}..{lo}}}.")
            width = len(lo) if lo.startswith("0") else 0
            options = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
        elif "," in body:
            options = body.split(",")
        else:
            continue
        return [out for o in options
                for out in expand_braces(pattern[:m.start()] + o + pattern[m.end():])]
    return [pattern]


def _is_url(s: str) -> bool:
    return "://" in s


def _fs(url: str) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(url)


def shard_urls(spec: str | Sequence[str], root: Path, *, split: str) -> list[str]:
    """The shards of one split, in order: braces expanded, globs matched (sorted), relative
    paths resolved against ``root``, duplicates dropped. Listed shards are not checked here
    (a missing one is :func:`load_index`'s ``missing_file``).

    Raises:
        DataError: ``missing_split`` (never skippable) when a glob or the whole list matches
            nothing.
    """
    entries = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for entry in entries:
        for name in expand_braces(str(entry)):
            url = name if _is_url(name) else str(root / Path(name).expanduser())
            if any(c in name for c in "*?["):
                fs, path = _fs(url)
                found = sorted(fs.glob(path))
                if not found:
                    raise DataError.make("missing_split", url, f"no shard matches the pattern "
                                         f"of split {split!r}", _FIX_SHARD, skippable=False)
                out += [fs.unstrip_protocol(p) if _is_url(url) else p for p in found]
            else:
                out.append(url)
    unique = list(dict.fromkeys(out))
    if not unique:
        raise DataError.make("missing_split", root, f"data.shards.{split} names no shard",
                             "give a brace pattern, a glob or a list", skippable=False)
    return unique


# ---------------------------------------------------------------------------- scanning
def _split_name(name: str) -> tuple[str, str]:
    """WebDataset's key and extension: ``dir/abc.seg.flac`` -> (``dir/abc``, ``seg.flac``)."""
    folder, base = posixpath.split(name)
    stem, _, ext = base.partition(".")
    return posixpath.join(folder, stem), ext.lower()


def _kind(ext: str) -> str | None:
    suffix = "." + ext.rsplit(".", 1)[-1]
    return next((k for k, exts in MEDIA.items() if suffix in exts), None)


def _problem(reason: str, problem: str, fix: str) -> dict[str, str]:
    return {"reason": reason, "problem": problem, "fix": fix}


def _media_header(kind: str, name: str, data: bytes) -> dict[str, Any]:
    if kind == "audio":
        try:
            info = audio_info(name, data=data)
        except DataError as e:        # "<name>: <problem>; <fix>": keep the problem
            problem = str(e).split(": ", 1)[-1].split("; ", 1)[0]
            return {"error": _problem(e.reason, f"audio {problem}",
                                      "rewrite the member or remove the sample")}
        return {"duration": info.duration, "sample_rate": info.sample_rate,
                "channels": info.channels}
    if not data:
        return {"error": _problem("empty_file", "member is empty (0 bytes)",
                                  "rewrite the member or remove the sample")}
    try:
        with Image.open(io.BytesIO(data)) as img:   # the header only: no pixels decoded
            width, height = img.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        return {"error": _problem("unreadable_image", f"cannot be decoded as an image ({e})",
                                  "re-encode it (e.g. as PNG/JPEG) or remove the sample")}
    return {"width": width, "height": height}


def _captions(group: dict[str, bytes]) -> tuple[list[str] | None, dict[str, Any], str | None]:
    """(captions or None, the json's other keys, a problem) of one sample's text members."""
    if "json" in group:
        try:
            obj = json.loads(group["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return None, {}, f"its .json is not valid UTF-8 JSON ({e})"
        if not isinstance(obj, dict):
            return None, {}, "its .json must be an object"
        raw = obj.get("captions", obj.get("caption", obj.get("text")))
        messages = obj.get("messages")
        if raw is None and isinstance(messages, list) and messages and \
                isinstance(messages[-1], dict) and isinstance(messages[-1].get("content"), str):
            raw = [messages[-1]["content"]]     # a chat's reference: its final answer
        if raw is None and "txt" not in group:
            return None, obj, "its .json has no 'captions', 'caption' or 'text'"
        if raw is not None:
            raw = [raw] if isinstance(raw, str) else raw
            if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
                return None, obj, "its .json 'captions' must be a string or a list of strings"
            return raw, obj, None
    if "txt" in group:
        try:
            return [group["txt"].decode("utf-8")], {}, None
        except UnicodeDecodeError as e:
            return None, {}, f"its .txt is not UTF-8 ({e})"
    return None, {}, "it has no caption (a .json with 'captions'/'caption', or a .txt)"


def _fingerprint(fs: Any, path: str) -> dict[str, Any]:
    info = fs.info(path)
    stamp = info.get("mtime", info.get("LastModified", info.get("ETag", info.get("etag"))))
    return {"size": int(info["size"]), "stamp": str(stamp) if stamp is not None else None}


def scan_shard(url: str) -> dict[str, Any]:
    """Read one shard front to back once and return its index (plain JSON data).

    Raises:
        DataError: the shard is missing, compressed or not a tar (never skippable: the whole
            shard), naming it.
    """
    fs, path = _fs(url)
    order: list[str] = []
    groups: dict[str, dict[str, Any]] = {}
    try:
        fingerprint = _fingerprint(fs, path)
        with fs.open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                raise DataError.make("undecodable", url, "is a compressed tar; members are read "
                                     "by byte offset, which needs an uncompressed tar",
                                     "write it uncompressed (the media inside are compressed "
                                     "already): `gunzip` it or rewrite it with python -m "
                                     "mmtf.data.shard", skippable=False)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    if not member.isfile() or posixpath.basename(member.name).startswith("."):
                        continue
                    key, ext = _split_name(member.name)
                    if key not in groups:
                        groups[key] = {}
                        order.append(key)
                    group = groups[key]
                    kind = _kind(ext)
                    if ext in ("json", "txt"):
                        group[ext] = tar.extractfile(member).read()
                    elif kind is not None and kind not in group:
                        data = tar.extractfile(member).read()
                        group[kind] = {"member": member.name, "offset": member.offset_data,
                                       "size": member.size,
                                       **_media_header(kind, f"{url}:{member.name}", data)}
    except FileNotFoundError:
        raise DataError.make("missing_file", url, "shard not found", _FIX_SHARD) from None
    except tarfile.TarError as e:
        raise DataError.make("undecodable", url, f"is not a readable tar ({e})",
                             "re-copy it or rewrite it with python -m mmtf.data.shard",
                             skippable=False) from None
    samples = []
    for key in order:
        group = groups[key]
        captions, meta, problem = _captions(group)
        sample: dict[str, Any] = {"key": key, "id": str(meta.get("id") or key)}
        for k in ("language", "task", "instruction"):
            if isinstance(meta.get(k), str):
                sample[k] = meta[k]
        for k in ("messages", *QA_KEYS):        # instruction items: checked when read
            if k in meta:
                sample[k] = meta[k]
        if problem is not None:
            sample["error"] = _problem("bad_row", problem, "add captions or remove the sample")
        else:
            sample["captions"] = captions
        for kind in MEDIA:
            if kind in group:
                sample[kind] = group[kind]
        samples.append(sample)
    return {"version": INDEX_VERSION, "shard": url, **fingerprint, "samples": samples}


def _write_json(path: Path, obj: Any) -> None:
    """Atomic: a reader (another rank) sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_index(fs: Any, path: str, **want: Any) -> dict | None:
    """The index at ``path`` if it exists, parses and has ``want``'s values (and this version)."""
    try:
        with fs.open(path, "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(index, dict) and all(index.get(k) == v for k, v in want.items())
    return index if ok and index.get("version") == INDEX_VERSION else None


def load_index(url: str, *, cache_dir: str | os.PathLike | None = None) -> tuple[dict, str]:
    """The index of one shard: its sidecar, else a cached scan, else a new scan (cached).

    Returns:
        (index, how): ``how`` is ``sidecar`` | ``cache`` | ``scanned``.

    Raises:
        DataError: see :func:`scan_shard` (``missing_file`` is skippable).
    """
    fs, path = _fs(url)
    try:
        fingerprint = _fingerprint(fs, path)
    except FileNotFoundError:
        raise DataError.make("missing_file", url, "shard not found", _FIX_SHARD) from None
    # A sidecar travels with its shard (copies change the modification time): the size checks it.
    sidecar = _read_index(fs, path + INDEX_SUFFIX, size=fingerprint["size"])
    if sidecar is not None:
        return sidecar, "sidecar"
    cache = Path(cache_dir or Path(os.environ.get("MMTF_CACHE_DIR", "~/.cache/mmtf"))
                 / "shard-index").expanduser()
    cached_path = cache / f"{hashlib.sha1(url.encode()).hexdigest()}.json"
    cached = _read_index(fsspec.filesystem("file"), str(cached_path), shard=url, **fingerprint)
    if cached is not None:
        return cached, "cache"
    index = scan_shard(url)
    if not _is_url(url) or url.startswith("file://"):
        try:
            _write_json(Path(path + INDEX_SUFFIX), index)
            return index, "scanned"
        except OSError:
            pass                    # a read-only folder: the cache folder instead
    try:
        _write_json(cached_path, index)
    except OSError as e:
        log.warning("[data] cannot cache the index of %s in %s (%s); it will be scanned again "
                    "next time: set data.index_cache to a writable folder", url, cache, e)
    return index, "scanned"


# ---------------------------------------------------------------------------- reading
def _chat_fields(sample: Mapping[str, Any], token: str) -> dict[str, Any] | tuple[str, str]:
    """The item fields of a sample's chat (``messages``, ``qa``, ``instruction``), or (the
    problem, the fix) when its messages or question fields are not valid."""
    out: dict[str, Any] = {"instruction": sample.get("instruction")}
    if "messages" not in sample:
        return out
    problem = messages_problem(sample["messages"], token,
                               [t for t in MEDIA_TOKENS.values() if t != token])
    if problem is None and any(k in sample for k in QA_KEYS):
        problem = qa_line_problem({"audio": "member", **{k: sample.get(k) for k in QA_KEYS},
                                   "messages": sample["messages"]})
        if problem is None:
            out["qa"] = QAFields(question=sample["question"],
                                 question_type=sample["question_type"],
                                 choices=tuple(sample["choices"]), answer=sample["answer"])
    if problem is not None:
        return problem
    out["messages"] = tuple(dict(m) for m in sample["messages"])
    return out


def read_shards(root: Path, split: str, *, report: Report, modality: str = "audio",
                shards: Mapping[str, Any] | None = None,
                index_cache: str | None = None,
                placeholder: str | None = None) -> list[ShardItem]:
    """Read one split of a sharded set: its shards' indexes -> one item per usable sample,
    shard by shard, in member order (``format: shards``).

    Args:
        root: what relative shard paths resolve against (``data.root``).
        split, report: as the other format readers (:mod:`mmtf.data.formats`).
        modality: ``audio`` | ``image``: which media member a sample is read by.
        shards: ``{split: pattern or list}`` (``data.shards``).
        index_cache: the folder for indexes that cannot sit beside their shard.
        placeholder: the media placeholder an instruction sample's user turn holds (default
            by modality: ``<|audio|>`` / ``<|image|>``).
    """
    if not shards:
        raise ConfigError("format 'shards' needs data.shards ({train: pattern, val: ..., test: "
                          "...}) and is read by mmtf.data.shards.ShardDataModule: use data=shards "
                          "(or data=shards_image).")
    spec = shards.get(split)
    if spec is None or (not isinstance(spec, str) and not list(spec)):
        raise DataError.make("missing_split", root, f"data.shards has no shards for split "
                             f"{split!r}", f"set data.shards.{split}=<pattern or list>",
                             skippable=False)
    urls = shard_urls(spec, root, split=split)

    def load(url: str) -> tuple[dict, str] | DataError:
        try:
            return load_index(url, cache_dir=index_cache)
        except DataError as e:
            return e

    # I/O bound (an index read, or a scan, per shard; remote ones have latency): threads.
    with ThreadPoolExecutor(min(8, len(urls))) as ex:
        loaded = list(ex.map(load, urls))
    items: list[ShardItem] = []
    how: dict[str, int] = {}
    for url, result in zip(urls, loaded):
        if isinstance(result, DataError):
            if result.reason != "missing_file":     # a broken shard: never skipped silently
                raise result
            report(result)
            continue
        index, got = result
        how[got] = how.get(got, 0) + 1
        name = url.rsplit("/", 1)[-1]
        for sample in index["samples"]:
            where = f"{name} key {sample['key']}"
            media = sample.get(modality)
            problem = sample.get("error") or (media or {}).get("error")
            if media is None:
                other = next((k for k in MEDIA if k in sample and k != modality), None)
                problem = _problem("bad_row", f"has no {modality} member" + (
                    f" (it has an {other} member: set data.modality={other})" if other else ""),
                    f"add a {modality} member or remove the sample")
            if problem is not None:
                report(DataError.make(problem["reason"], url, f"sample {sample['key']} "
                                      f"{problem['problem']}", problem["fix"], where))
                continue
            captions = clean_captions(sample["captions"], url, where, report)
            if not captions:
                continue
            chat = _chat_fields(sample, placeholder or MEDIA_TOKENS[modality])
            if isinstance(chat, tuple):
                report(DataError.make("bad_row", url, f"sample {sample['key']}: {chat[0]}",
                                      chat[1], where))
                continue
            items.append(ShardItem(
                id=sample["id"], path=f"{url}:{media['member']}", captions=captions, where=where,
                language=sample.get("language"), task=sample.get("task"), shard=url,
                offset=int(media["offset"]), size=int(media["size"]),
                duration=float(media.get("duration", 1.0)), channels=media.get("channels"),
                image_size=(int(media["width"]), int(media["height"])) if "width" in media
                else None, **chat))
    log.info("[data] shards %s: %d items in %d of %d shard(s) (indexes: %s)", split, len(items),
             sum(how.values()), len(urls), ", ".join(f"{n} {k}" for k, n in sorted(how.items()))
             or "none")
    return items
