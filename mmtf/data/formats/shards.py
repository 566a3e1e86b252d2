"""WebDataset-convention tar shards, read by member offset: shard lists, indexes, members, writer.

A shard is an uncompressed tar whose members are grouped into samples by key (the member name
up to the first dot of its file name, WebDataset's convention)::

    000017.flac  000017.json          {"captions": ["a dog barks", ...], "id": "dog_17"}
    000018.png   000018.txt           a red circle left of a blue square

Media: ``.wav .flac .mp3 .ogg .opus`` (audio) or ``.png .jpg .jpeg .webp ...`` (images).
Captions: ``.json`` with ``captions`` or ``caption`` (a string or a list) or ``text``
(speech), optional ``id`` / ``language`` / ``task``; or a ``.txt`` member (one caption).

Shards are named by a brace pattern (``/data/wavcaps/{000000..000127}.tar``, ``{a,b}``), a
glob (``train/*.tar``) or a list of either; relative paths resolve against ``data.root``; any
fsspec URL (``s3://``, ``gs://``, ``https://``, ``memory://``) works wherever a path does.

Every shard is read through an **index** (one JSON per shard): per sample its key, captions, and
per media kind the member's name, byte offset and size of its data, and its header (duration,
sample rate, channels; image width and height). :func:`write_shards` writes the index beside
each shard (``<shard>.idx.json``); a shard without one is scanned once (tar headers, the small
caption members, the media headers) and its index cached: beside the shard when that is a
writable local folder, else under ``data.index_cache`` (default ``$MMTF_CACHE_DIR`` or
``~/.cache/mmtf``, ``shard-index/``), keyed by URL and checked against the shard's size and
modification time. A sample is then read by ``(shard, offset, size)`` (:func:`read_member`),
so any process can read any sample, and the order is the sampler's
(:class:`mmtf.data.shards.ShardStreamSampler`). Why: docs/design/shards.md.

Problems (always named by shard and key): a missing shard (``missing_file``), a sample without
captions or media (``bad_row``), an undecodable header (``undecodable`` / ``unreadable_image``)
are found at setup and raised or, under ``data.on_error=skip``, counted; a member corrupt past
its header fails when it is decoded (the dataset's skip-and-count).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import tarfile
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
from PIL import Image, UnidentifiedImageError

from mmtf.data.audio import AUDIO_EXTENSIONS, audio_info
from mmtf.data.formats.base import CaptionItem, Report, clean_captions
from mmtf.data.image import IMAGE_EXTENSIONS
from mmtf.errors import ConfigError, DataError

__all__ = ["INDEX_SUFFIX", "ShardItem", "expand_braces", "load_index", "read_member",
           "read_shards", "scan_shard", "shard_urls", "write_shards"]

log = logging.getLogger("mmtf.data")

INDEX_SUFFIX = ".idx.json"
INDEX_VERSION = 1
MEDIA = {"audio": AUDIO_EXTENSIONS, "image": IMAGE_EXTENSIONS}
_FIX_SHARD = "check data.shards and data.root"


@dataclass(frozen=True)
class ShardItem(CaptionItem):
    """One sample of a shard: a :class:`CaptionItem` whose media is a tar member.

    Attributes:
        path: ``<shard url>:<member name>`` (a str: what messages name; not a file).
        shard: the shard's URL or absolute path.
        offset: byte offset of the member's data in the shard.
        size: the member's size in bytes.
        duration: seconds (audio, from the index); 1.0 for images.
        channels: audio channel count from the index (None for images).
        image_size: images: ``(width, height)`` from the index (None for audio).
    """

    path: str  # type: ignore[assignment]
    shard: str = ""
    offset: int = 0
    size: int = 0
    duration: float = 1.0
    channels: int | None = None
    image_size: tuple[int, int] | None = None


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
    seen: set[str] = set()
    unique = [u for u in out if not (u in seen or seen.add(u))]
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
        for k in ("language", "task"):
            if isinstance(meta.get(k), str):
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


def default_index_cache() -> Path:
    """Where indexes of shards without a writable folder go (``$MMTF_CACHE_DIR`` or
    ``~/.cache/mmtf``, then ``shard-index/``)."""
    return Path(os.environ.get("MMTF_CACHE_DIR", "~/.cache/mmtf")).expanduser() / "shard-index"


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


def _read_json(fs: Any, path: str) -> Any:
    try:
        with fs.open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


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
    sidecar = _read_json(fs, path + INDEX_SUFFIX) if fs.exists(path + INDEX_SUFFIX) else None
    # A sidecar travels with its shard (copies change the modification time): the size checks it.
    if (isinstance(sidecar, dict) and sidecar.get("version") == INDEX_VERSION
            and sidecar.get("size") == fingerprint["size"]):
        return sidecar, "sidecar"
    cache = Path(cache_dir).expanduser() if cache_dir else default_index_cache()
    cached_path = cache / f"{hashlib.sha1(url.encode()).hexdigest()}.json"
    cached = _read_json(fsspec.filesystem("file"), str(cached_path)) \
        if cached_path.is_file() else None
    if (isinstance(cached, dict) and cached.get("version") == INDEX_VERSION
            and cached.get("shard") == url and cached.get("size") == fingerprint["size"]
            and cached.get("stamp") == fingerprint["stamp"]):
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
def read_shards(root: Path, split: str, *, report: Report, modality: str = "audio",
                shards: Mapping[str, Any] | None = None, index_cache: str | None = None,
                threads: int = 8) -> list[ShardItem]:
    """Read one split of a sharded set: its shards' indexes -> one item per usable sample,
    shard by shard, in member order (see the module docstring).

    Args:
        root: what relative shard paths resolve against (``data.root``).
        split: ``train`` | ``val`` | ``test``.
        report: called with each problem (raises or counts, per ``data.on_error``).
        modality: ``audio`` | ``image``: which media member a sample is read by.
        shards: ``{split: pattern or list}`` (``data.shards``).
        index_cache: the folder for indexes that cannot sit beside their shard.
        threads: shards whose indexes are read (or scanned) at the same time.
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
    if len(urls) > 1 and threads > 1:
        with ThreadPoolExecutor(min(threads, len(urls))) as ex:
            loaded = list(ex.map(load, urls))
    else:
        loaded = [load(url) for url in urls]
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
            items.append(ShardItem(
                id=sample["id"], path=f"{url}:{media['member']}", captions=captions, where=where,
                language=sample.get("language"), task=sample.get("task"), shard=url,
                offset=int(media["offset"]), size=int(media["size"]),
                duration=float(media.get("duration", 1.0)), channels=media.get("channels"),
                image_size=(int(media["width"]), int(media["height"])) if "width" in media
                else None))
    log.info("[data] shards %s: %d items in %d of %d shard(s) (indexes: %s)", split, len(items),
             sum(how.values()), len(urls), ", ".join(f"{n} {k}" for k, n in sorted(how.items()))
             or "none")
    return items


class MemberReader:
    """Reads members by ``(shard, offset, size)``, keeping up to ``max_open`` shards open.

    One per process: a forked worker drops the handles it inherited (an fsspec file's buffer
    and connection belong to the parent) and opens its own. Local shards are read with
    ``os.pread`` (no shared file position); other URLs through fsspec's read-ahead cache, so
    members read in order are sequential reads.
    """

    def __init__(self, max_open: int = 16, block_size: int = 4 * 2 ** 20) -> None:
        self.max_open, self.block_size = max_open, block_size
        self._files: OrderedDict[str, Any] = OrderedDict()
        self._pid = os.getpid()

    def _open(self, url: str) -> Any:
        if not _is_url(url) or url.startswith("file://"):
            return os.open(url.removeprefix("file://"), os.O_RDONLY)
        fs, path = _fs(url)
        try:
            return fs.open(path, "rb", block_size=self.block_size, cache_type="readahead")
        except TypeError:           # a file system without block caches (memory://)
            return fs.open(path, "rb")

    def _close(self, f: Any) -> None:
        with contextlib.suppress(OSError):
            os.close(f) if isinstance(f, int) else f.close()

    def read(self, url: str, offset: int, size: int, *, where: str | None = None) -> bytes:
        """The ``size`` bytes at ``offset`` of shard ``url``.

        Raises:
            DataError: the shard is gone (``missing_file``) or shorter than the index says
                (``truncated``), naming it.
        """
        if os.getpid() != self._pid:
            self._files, self._pid = OrderedDict(), os.getpid()
        f = self._files.get(url)
        try:
            if f is None:
                f = self._files[url] = self._open(url)
                while len(self._files) > self.max_open:
                    self._close(self._files.popitem(last=False)[1])
            else:
                self._files.move_to_end(url)
            if isinstance(f, int):
                data = os.pread(f, size, offset)
            else:
                f.seek(offset)
                data = f.read(size)
        except FileNotFoundError:
            self._files.pop(url, None)
            raise DataError.make("missing_file", url, "shard not found (it was indexed before)",
                                 _FIX_SHARD, where) from None
        if len(data) != size:
            raise DataError.make("truncated", url, f"holds {len(data)} of the {size} bytes the "
                                 f"index promises at offset {offset}", "re-copy the shard, or "
                                 f"delete its {INDEX_SUFFIX} to index it again", where)
        return data

    def __getstate__(self) -> dict[str, Any]:
        return {"max_open": self.max_open, "block_size": self.block_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


_READER = MemberReader()


def read_member(item: ShardItem) -> bytes:
    """The media bytes of one shard sample (this process's :class:`MemberReader`)."""
    return _READER.read(item.shard, item.offset, item.size, where=item.where)


# ---------------------------------------------------------------------------- writing
def _key(item_id: str, seen: set[str]) -> str:
    """A WebDataset key for ``item_id``: no dots (they start the extension) or slashes."""
    key = re.sub(r"[^A-Za-z0-9_-]+", "_", item_id).strip("_") or "sample"
    base, n = key, 1
    while key in seen:
        key, n = f"{base}_{n}", n + 1
    seen.add(key)
    return key


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644   # the same bytes on every run
    tar.addfile(info, io.BytesIO(data))


def write_shards(items: Sequence[CaptionItem], out_dir: str | os.PathLike, *, prefix: str,
                 shard_size: int = 1000, shard_bytes: int | None = None,
                 shuffle_seed: int | None = 0,
                 read: Callable[[CaptionItem], bytes] | None = None) -> list[Path]:
    """Write ``items`` as WebDataset shards ``<out_dir>/<prefix>-000000.tar`` ... plus the index
    of each (``.idx.json``, so nothing needs scanning). Media bytes are copied as they are (no
    re-encoding: the decoded media stay the same); captions, id, language and task go to
    ``<key>.json``.

    Args:
        items: any caption items (files, or members of other shards).
        out_dir: the folder (created).
        prefix: the shard file names' prefix (the split).
        shard_size: samples per shard.
        shard_bytes: also start a new shard before one would pass this many bytes.
        shuffle_seed: write the items in an order shuffled by this seed (so each shard mixes
            the whole set, as a sorted source would not); None keeps their order.
        read: an item -> its media bytes (default: :func:`read_member` for shard items, the
            file for the others).

    Returns:
        The shard paths.
    """
    if shard_size < 1 or (shard_bytes is not None and shard_bytes < 1):
        raise ConfigError(f"shard_size ({shard_size}) and shard_bytes ({shard_bytes}) must be "
                          f">= 1 (shard_bytes may be null).")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(out / f"{glob.escape(prefix)}-*.tar*")):
        os.remove(stale)            # a shorter rewrite must not leave old shards behind

    def default_read(item: CaptionItem) -> bytes:
        return read_member(item) if isinstance(item, ShardItem) else Path(item.path).read_bytes()

    def nbytes(item: CaptionItem) -> int:
        return item.size if isinstance(item, ShardItem) else Path(item.path).stat().st_size

    read = read or default_read
    order = list(range(len(items)))
    if shuffle_seed is not None:
        order = [int(k) for k in np.random.default_rng(shuffle_seed).permutation(len(items))]
    groups: list[list[int]] = []
    size = 0
    for k in order:                 # which items go to which shard (headers: ~3 blocks each)
        grow = nbytes(items[k]) + 4 * 512
        if not groups or len(groups[-1]) >= shard_size or (
                shard_bytes and size + grow > shard_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += grow
    seen: set[str] = set()
    paths: list[Path] = []
    for group in groups:
        path = out / f"{prefix}-{len(paths):06d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
            for k in group:
                item = items[k]
                key = _key(item.id, seen)
                meta: dict[str, Any] = {"id": item.id, "captions": list(item.captions)}
                meta.update({n: v for n, v in (("language", item.language),
                                               ("task", item.task)) if v})
                ext = Path(str(item.path)).suffix.lower() or ".bin"
                _add(tar, f"{key}{ext}", read(item))
                _add(tar, f"{key}.json", json.dumps(meta, ensure_ascii=False).encode("utf-8"))
        os.replace(tmp, path)
        _write_json(Path(str(path) + INDEX_SUFFIX), scan_shard(str(path)))
        paths.append(path)
    return paths
