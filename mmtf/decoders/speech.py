"""Whisper's decoding rules for speech: language detection, timestamps and long-form audio.

After openai/whisper (``decoding.py``, ``transcribe.py``) and transformers'
``WhisperTimeStampLogitsProcessor`` and sequential long-form ``generate``; tests compare with
transformers on tiny random Whisper models. Why: docs/design/asr-decoding.md.

Shapes: r decoder rows, v vocab, t generated tokens, f mel bins, n mel frames.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from mmtf.decoders.generation import GenerationConfig, StepDecoder, generate

TIME_PRECISION = 0.02          # seconds per timestamp token: one encoder position
FRAME_SECONDS = 0.01           # seconds per mel frame (hop 160 at 16 kHz)
FRAMES_PER_TOKEN = 2           # mel frames per encoder position (the stem's stride)
WINDOW_FRAMES = 3000           # mel frames of Whisper's 30 s window
MAX_INITIAL_TIMESTAMP = 1.0    # seconds; Whisper's max_initial_timestamp (index 50)


class TimestampRules:
    """Whisper's timestamp rules as a logits processor, vectorised over rows: timestamps come
    in pairs and never decrease, text is followed by a timestamp, the first token is a timestamp
    of at most ``max_initial_timestamp``, and a timestamp is forced when the timestamps together
    are more likely than the best text token.

    Args:
        timestamp_begin: id of ``<|0.00|>``; every id from it on is a timestamp.
        no_timestamps_id: ``<|notimestamps|>``, never generated.
        eos_id: ``<|endoftext|>``; ids below it are text.
        max_initial_timestamp: the first timestamp is at most this many seconds (None = any).
    """

    def __init__(self, *, timestamp_begin: int, no_timestamps_id: int, eos_id: int,
                 max_initial_timestamp: float | None = MAX_INITIAL_TIMESTAMP) -> None:
        self.timestamp_begin, self.no_timestamps_id, self.eos_id = (
            timestamp_begin, no_timestamps_id, eos_id)
        self.max_initial_index = (None if max_initial_timestamp is None
                                  else round(max_initial_timestamp / TIME_PRECISION))

    def __call__(self, logits: Tensor, generated: Tensor) -> None:
        """Mask ``logits`` (r, v) in place given each row's ``generated`` tokens (r, t)."""
        tb, t = self.timestamp_begin, generated.shape[1]
        logits[:, self.no_timestamps_id] = -math.inf
        if t == 0:
            logits[:, :tb] = -math.inf
            if self.max_initial_index is not None:
                logits[:, tb + self.max_initial_index + 1:] = -math.inf
        else:
            is_time = generated >= tb                                          # (r, t)
            last = is_time[:, -1]
            penultimate = is_time[:, -2] if t >= 2 else torch.ones_like(last)
            # A pair closed a segment: text next. A single timestamp after text: another
            # timestamp (closing the pair) or eos, no text.
            logits[:, tb:].masked_fill_((last & penultimate)[:, None], -math.inf)
            logits[:, :self.eos_id].masked_fill_((last & ~penultimate)[:, None], -math.inf)
            # Never decreasing: the latest timestamp is the largest; it may repeat only to close
            # a pair (so <|0.00|> is never emitted twice).
            latest = torch.where(is_time, generated, tb - 1).amax(dim=1)       # (r,)
            floor = torch.where(last & ~penultimate, latest, latest + 1)
            floor = torch.where(is_time.any(dim=1), floor, tb)
            ids = torch.arange(logits.shape[1], device=logits.device)
            logits.masked_fill_((ids >= tb) & (ids < floor[:, None]), -math.inf)
        logprobs = logits.float().log_softmax(dim=-1)
        time_mass = logprobs[:, tb:].logsumexp(dim=-1)
        best_text = logprobs[:, :tb].max(dim=-1).values
        logits[:, :tb].masked_fill_((time_mass > best_text)[:, None], -math.inf)


@torch.no_grad()
def detect_language(decoder: StepDecoder, memory: Tensor, memory_mask: Tensor | None, *,
                    start_id: int, language_ids: Sequence[int]) -> Tensor:
    """The most likely language token of each item, (b,) long: one decoder step on
    ``<|startoftranscript|>`` (``start_id``), argmax over ``language_ids`` (ties: the first in
    vocabulary order, as Whisper's argmax)."""
    ids = torch.tensor(sorted(language_ids), dtype=torch.long, device=memory.device)
    start = torch.full((memory.shape[0], 1), start_id, dtype=torch.long, device=memory.device)
    logits = decoder(start, memory, memory_mask)[:, -1]                      # (b, v)
    return ids[logits[:, ids].argmax(dim=-1)]


@dataclass
class TimedSegment:
    """A stretch of speech: ``start``/``end`` seconds from the clip start, its tokens
    (timestamps included) and, once decoded, its text."""

    start: float
    end: float
    tokens: list[int] = field(default_factory=list)
    text: str = ""

    def as_dict(self) -> dict:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text}


def window_segments(tokens: Sequence[int], *, timestamp_begin: int, offset: float,
                    window_frames: int) -> tuple[list[TimedSegment], int]:
    """Split one window's generated tokens (no prompt, eos or padding) into segments, each from
    a timestamp to the next pair. The next window starts at the last complete pair, or after
    this one when it ends with a single timestamp or holds no pair.

    Args:
        offset: seconds of the window's start in the clip.
        window_frames: mel frames the window holds (fewer than 3000 at the clip's end).

    Returns:
        The segments, and how many mel frames the next window moves by.
    """
    tokens = list(tokens)
    is_time = [i >= timestamp_begin for i in tokens]
    single_ending = is_time[-2:] == [False, True]
    pairs = [i + 1 for i in range(len(tokens) - 1) if is_time[i] and is_time[i + 1]]
    if not pairs:
        # No complete segment: one segment over the window, up to its last timestamp if any.
        end = int(window_frames * FRAME_SECONDS / TIME_PRECISION)
        stamps = [i for i in tokens if i >= timestamp_begin]
        if stamps and stamps[-1] != timestamp_begin:
            end = stamps[-1] - timestamp_begin
        return [TimedSegment(offset, offset + end * TIME_PRECISION, tokens)], window_frames
    cuts = pairs + [len(tokens)] if single_ending else pairs[:-1] + [pairs[-1] + 1]
    segments, begin = [], 0
    for n, cut in enumerate(cuts):
        piece = tokens[begin:cut]
        # The last piece of a window that does not end in a single timestamp ends with its
        # pair: its end is the pair's first timestamp.
        end = piece[-1] if n < len(cuts) - 1 or single_ending else piece[-2]
        segments.append(TimedSegment(offset + (piece[0] - timestamp_begin) * TIME_PRECISION,
                                     offset + (end - timestamp_begin) * TIME_PRECISION, piece))
        begin = cut
    if single_ending:
        return segments, window_frames
    return segments, (tokens[begin - 2] - timestamp_begin) * FRAMES_PER_TOKEN


def transcribe_long(model, features: Tensor, *, prompt: Sequence[int], config: GenerationConfig,
                    rules: TimestampRules, window_frames: int = WINDOW_FRAMES,
                    ) -> list[TimedSegment]:
    """Whisper's sequential long-form decoding of one clip.

    Each window is decoded with the timestamp rules and cut into segments
    (:func:`window_segments`); the next starts at its last complete timestamp (or after it).
    The last window is zero-padded. No temperature fallback, no conditioning on the previous
    window's text.

    Args:
        model: an :class:`~mmtf.decoders.EncoderDecoder` with an ``AudioEncoder``.
        features: (f, n) the whole clip's log-mel (``AudioEncoder.whisper_features``).
        prompt, config, rules: the decoder prompt, decoding options and timestamp rules.

    Returns:
        The clip's segments in order (no text yet).
    """
    total, seek, segments = features.shape[-1], 0, []
    while seek < total:
        frames = min(total - seek, window_frames)
        window = F.pad(features[:, seek:seek + frames], (0, window_frames - frames))
        memory, mask = model.encode_features(window[None])
        out = generate(model.decoder, memory, mask, config, prompt_ids=list(prompt),
                       eos_id=model.eos_id, pad_id=model.pad_id, processors=[rules]).best()
        row = out.tokens[0, :int(out.lengths)].tolist()
        if row and row[-1] == model.eos_id:
            row = row[:-1]
        found, advance = window_segments(row, timestamp_begin=rules.timestamp_begin,
                                         offset=seek * FRAME_SECONDS, window_frames=frames)
        segments += found
        seek += advance if advance > 0 else frames
    return segments


def chunk_bounds(n: int, *, chunk: int, overlap: int) -> list[tuple[int, int]]:
    """Chunks of ``chunk`` samples starting every ``chunk - overlap`` samples, covering ``n``
    (the last one shorter); one chunk when ``n <= chunk``."""
    if n <= chunk:
        return [(0, n)]
    step = chunk - overlap
    starts = range(0, max(n - overlap, 1), step)
    return [(a, min(a + chunk, n)) for a in starts]


def merge_overlapping(chunks: Sequence[Sequence[int]], *, max_overlap: int | None = None,
                      ) -> list[int]:
    """Join the token sequences of consecutive overlapping chunks.

    Each join takes the longest run of tokens shared by the end of the text so far and the
    start of the next chunk (within ``max_overlap`` tokens of either, None = all), and cuts
    both at the middle of that run: the first half from the earlier chunk, the rest from the
    later one, so each word comes from the chunk where it is farther from an edge. No common
    token: the chunks are concatenated.
    """
    merged = list(chunks[0]) if chunks else []
    for nxt in chunks[1:]:
        nxt = list(nxt)
        tail = merged if max_overlap is None else merged[-max_overlap:]
        head = nxt if max_overlap is None else nxt[:max_overlap]
        base = len(merged) - len(tail)
        best, at_a, at_b = 0, 0, 0
        # Longest common substring by dynamic programming (tails and heads are short).
        previous = [0] * (len(head) + 1)
        for i in range(1, len(tail) + 1):
            current = [0] * (len(head) + 1)
            for j in range(1, len(head) + 1):
                if tail[i - 1] == head[j - 1]:
                    current[j] = previous[j - 1] + 1
                    if current[j] > best:
                        best, at_a, at_b = current[j], i - current[j], j - current[j]
            previous = current
        if best == 0:
            merged += nxt
            continue
        half = best // 2
        merged = merged[:base + at_a + half] + nxt[at_b + half:]
    return merged


__all__ = ["FRAMES_PER_TOKEN", "FRAME_SECONDS", "TIME_PRECISION", "WINDOW_FRAMES",
           "TimedSegment", "TimestampRules", "chunk_bounds", "detect_language",
           "merge_overlapping", "transcribe_long", "window_segments"]
