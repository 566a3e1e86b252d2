"""Timed segments (``{"start": s, "end": s, "text": str}``) as SubRip (``.srt``) and WebVTT
(``.vtt``) documents: times to the millisecond, always with hours; empty cues kept."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

FORMATS = ("srt", "vtt")


def timestamp(seconds: float, *, marker: str = ",") -> str:
    """``HH:MM:SS<marker>mmm`` of ``seconds`` >= 0, rounded to the millisecond."""
    ms = round(max(float(seconds), 0.0) * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{marker}{ms:03d}"


def to_srt(segments: Iterable[Mapping[str, Any]]) -> str:
    """A SubRip document: numbered cues separated by blank lines."""
    cues = [f"{n}\n{timestamp(s['start'])} --> {timestamp(s['end'])}\n{str(s['text']).strip()}\n"
            for n, s in enumerate(segments, start=1)]
    return "\n".join(cues)


def to_vtt(segments: Iterable[Mapping[str, Any]]) -> str:
    """A WebVTT document: the ``WEBVTT`` header, then one cue per segment."""
    cues = [f"{timestamp(s['start'], marker='.')} --> {timestamp(s['end'], marker='.')}\n"
            f"{str(s['text']).strip()}\n" for s in segments]
    return "\n".join(["WEBVTT\n", *cues])


def subtitles(segments: Iterable[Mapping[str, Any]], fmt: str) -> str:
    """The document of ``segments`` in ``fmt`` (``srt`` or ``vtt``)."""
    return to_srt(segments) if fmt == "srt" else to_vtt(segments)


__all__ = ["FORMATS", "subtitles", "timestamp", "to_srt", "to_vtt"]
