"""Whisper's decoding rules for speech: language detection, timestamps and long-form audio.

After openai/whisper (``decoding.py``, ``transcribe.py``) and transformers'
``WhisperTimeStampLogitsProcessor`` and sequential long-form ``generate``; tests compare with
transformers on tiny random Whisper models. Why: docs/design/asr-decoding.md.

Shapes: r decoder rows, v vocab, t generated tokens, f mel bins, n mel frames.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from mmtf.decoders.align import caption_words, word_spans
from mmtf.decoders.generation import GenerationConfig, StepDecoder, generate

TIME_PRECISION = 0.02          # seconds per timestamp token: one encoder position
FRAME_SECONDS = 0.01           # seconds per mel frame (hop 160 at 16 kHz)
FRAMES_PER_TOKEN = 2           # mel frames per encoder position (the stem's stride)
WINDOW_FRAMES = 3000           # mel frames of Whisper's 30 s window
MAX_INITIAL_TIMESTAMP = 1.0    # seconds; Whisper's max_initial_timestamp (index 50)
log = logging.getLogger(__name__)


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
    (timestamps included), once decoded its text, and the decoding statistics of its window
    (openai's per-segment ``avg_logprob``, ``no_speech_prob``, ``compression_ratio``,
    ``temperature``; None where not computed)."""

    start: float
    end: float
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stats: dict[str, float | None] = field(default_factory=dict)
    words: list[dict] | None = None

    def as_dict(self) -> dict:
        out = {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text,
               **{k: None if v is None else round(v, 4) for k, v in self.stats.items()}}
        return out if self.words is None else {**out, "words": self.words}


@dataclass
class WindowRules:
    """openai/whisper ``transcribe``'s rules for each 30 s window; the defaults are openai's.

    Args:
        temperatures: decode at the first; retry a failed window at the next (sampling).
        compression_ratio_threshold, logprob_threshold: a window fails when its text's zlib
            ratio is above the first (a loop) or its mean token log-probability below the
            second; None = off.
        no_speech_threshold: a window whose ``<|nospeech|>`` probability exceeds it and whose
            mean log-probability is below ``logprob_threshold`` is silence (no text); None = off.
        condition_on_previous_text: the text so far prompts the next window (``<|startofprev|>``);
            reset after a window decoded above temperature 0.5.
        sample_len: tokens per window; None = half the decoder's positions (openai's).
        word_timestamps: segments get ``words`` from the cross-attention (:mod:`mmtf.decoders.align`).
    """

    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    sample_len: int | None = None
    word_timestamps: bool = False


# One pass per window, no thresholds, no context (transformers' temperature=0.0 without them).
PLAIN = WindowRules(temperatures=(0.0,), compression_ratio_threshold=None,
                    logprob_threshold=None, no_speech_threshold=None,
                    condition_on_previous_text=False)


def compression_ratio(text: str) -> float:
    """Bytes of ``text`` over bytes of its zlib compression (openai's ``get_compression_ratio``;
    transformers compresses token ids instead)."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def window_segments(tokens: Sequence[int], *, timestamp_begin: int, offset: float,
                    window_frames: int) -> tuple[list[TimedSegment], int]:
    """Split one window's generated tokens (no prompt, eos or padding) into segments, each from
    a timestamp to the next pair. The next window starts at the last complete pair, or after
    this one when it ends with a single timestamp or holds no pair.

    Args:
        offset: seconds of the window's start in the clip.
        window_frames: mel frames of audio the window holds (fewer than 3000 at the clip's end).

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


@torch.no_grad()
def transcribe_long(model, features: Tensor, *, prompt: Sequence[int], config: GenerationConfig,
                    rules: TimestampRules, options: WindowRules = PLAIN,
                    frames: int | None = None, text: Callable[[list[int]], str] | None = None,
                    prev_id: int | None = None, initial_prompt: Sequence[int] = (),
                    generator: torch.Generator | None = None) -> list[TimedSegment]:
    """Whisper's sequential decoding of one clip (openai's ``transcribe``): each 30 s window
    from ``seek`` is decoded under ``rules``, retried at the next of ``options.temperatures``
    while it fails the thresholds, skipped when silent, and cut into segments
    (:func:`window_segments`); the next starts at its last complete timestamp pair.

    Args:
        model: an :class:`~mmtf.decoders.EncoderDecoder` with an ``AudioEncoder``.
        features: (f, n) log-mel of the whole clip, or of a short clip padded to 3000 frames.
        prompt, config, rules: the decoder prompt, the decoding options (``max_new_tokens``
            replaced by the window's budget) and the timestamp rules.
        options: the window rules. frames: mel frames of real audio (decoding stops there).
        text: ids -> text (for the compression ratio and the words).
        prev_id, initial_prompt: ``<|startofprev|>`` and the ids that condition the first window.
        generator: random generator of the sampled (temperature > 0) windows.

    Returns:
        The clip's segments in order (no text yet), times clamped to the audio.
    """
    total = features.shape[-1] if frames is None else int(frames)
    max_len, tb = model.decoder.max_len, rules.timestamp_begin
    sample_len = options.sample_len or max_len // 2
    if (options.condition_on_previous_text or initial_prompt) and prev_id is None:
        raise ValueError("transcribe_long: conditioning on earlier text needs prev_id "
                         "(<|startofprev|>).")
    if (options.compression_ratio_threshold is not None or options.word_timestamps) and \
            text is None:
        raise ValueError("transcribe_long: the compression ratio and word timestamps need "
                         "text (the decoder of text ids).")
    # Never generated (openai's bans): the prompt's special ids, <|startofprev|> and
    # <|nospeech|> (the id before <|notimestamps|>); earlier text may be generated again.
    banned = {*prompt, rules.no_timestamps_id - 1, *(() if prev_id is None else (prev_id,))}
    suppress = (*config.suppress_tokens, *sorted(banned - set(config.suppress_tokens)))
    history, reset = list(initial_prompt), 0
    seek, segments = 0, []
    end_of_audio = total * FRAME_SECONDS
    while seek < total:
        size = min(total - seek, WINDOW_FRAMES)
        window = features[:, seek:seek + WINDOW_FRAMES]
        window = F.pad(window, (0, WINDOW_FRAMES - window.shape[-1]))           # (f, 3000)
        memory, mask = model.encode_features(window[None])
        context = history[reset:][-(max_len // 2 - 1):]
        full = [prev_id, *context, *prompt] if context else list(prompt)
        stats = _decode_window(model, memory, mask, full, len(full) - len(prompt), config,
                               rules, options, suppress, sample_len, text, generator)
        tokens = stats.pop("tokens")
        silent = (options.no_speech_threshold is not None
                  and stats["no_speech_prob"] > options.no_speech_threshold
                  and not (options.logprob_threshold is not None
                           and stats["avg_logprob"] > options.logprob_threshold))
        offset = seek * FRAME_SECONDS
        if silent:
            seek += size
            continue
        found, advance = window_segments(tokens, timestamp_begin=tb, offset=offset,
                                         window_frames=size)
        if not any(a >= tb and b >= tb for a, b in zip(tokens, tokens[1:])) and \
                len(tokens) >= stats["budget"]:
            log.warning("speech window at %.2f s: no timestamp pair within %d tokens; its "
                        "text is kept whole and decoding moves to the window's end.", offset,
                        stats["budget"])
        del stats["budget"]
        for segment in found:
            segment.start = min(segment.start, end_of_audio)
            segment.end = min(max(segment.end, segment.start), end_of_audio)
            segment.stats = dict(stats)
            # openai's history holds no segment's closing second timestamp.
            ends_in_pair = len(segment.tokens) > 2 and segment.tokens[-2] >= tb
            history += segment.tokens[:-1] if ends_in_pair else segment.tokens
        if options.word_timestamps:
            _add_words(model, memory, mask, [*prompt, rules.no_timestamps_id], found, tb,
                       size, offset, text)
        segments += found
        if not options.condition_on_previous_text or stats["temperature"] > 0.5:
            reset = len(history)
        seek += advance if advance > 0 else size
    return segments


def _add_words(model, memory: Tensor, mask: Tensor | None, head: list[int],
               segments: list[TimedSegment], timestamp_begin: int, frames: int, offset: float,
               text: Callable[[list[int]], str]) -> None:
    """Time the words of a window's segments: its text tokens teacher-forced after ``head``
    (``<|startoftranscript|> .. <|notimestamps|>``, openai's alignment prompt), the
    cross-attention of the upper half of the decoder layers over the window's audio positions,
    DTW (:func:`mmtf.decoders.align.word_spans`); a word goes to the segment of its first
    token."""
    pieces = [[t for t in s.tokens if t < timestamp_begin] for s in segments]
    ids = [t for piece in pieces for t in piece]
    for segment in segments:
        segment.words = []
    if not ids:
        return
    decoder = model.decoder
    layers = list(range(decoder.depth // 2, decoder.depth))
    tokens = torch.tensor([[*head, *ids]], device=memory.device)
    _, maps = decoder(tokens, memory, mask, attention_layers={"cross": layers})
    # Row t is the query that produced text token t (the last one: eos), (k, n, m).
    weights = torch.cat([maps["cross"][layer][0] for layer in layers])
    weights = weights[:, len(head) - 1:, :frames // FRAMES_PER_TOKEN].float()
    words = caption_words(SimpleNamespace(decode=text), ids)
    ends = list(itertools.accumulate(len(piece) for piece in pieces))
    for span in word_spans(weights, words, TIME_PRECISION, duration=frames * FRAME_SECONDS):
        owner = segments[bisect.bisect_right(ends, span.tokens[0])]
        owner.words.append({"word": span.word, "start": round(offset + span.start, 3),
                            "end": round(offset + span.end, 3)})


def _decode_window(model, memory: Tensor, mask: Tensor | None, full: list[int], sot: int,
                   config: GenerationConfig, rules: TimestampRules, options: WindowRules,
                   suppress: tuple[int, ...], sample_len: int,
                   text: Callable[[list[int]], str] | None,
                   generator: torch.Generator | None) -> dict:
    """One window decoded with temperature fallback: its tokens (no eos), the budget, and the
    statistics of the decode kept (``avg_logprob``, ``no_speech_prob``, ``compression_ratio``,
    ``temperature``)."""
    decoder, eos = model.decoder, model.eos_id
    no_speech = None
    if options.no_speech_threshold is not None:
        # openai: <|nospeech|> (the id before <|notimestamps|>) at <|startoftranscript|>'s
        # position, from the raw logits.
        head = torch.tensor([full[:sot + 1]], device=memory.device)
        logits = decoder(head, memory, mask)[0, -1].float()
        no_speech = float(logits.softmax(dim=-1)[rules.no_timestamps_id - 1])
    budget = min(sample_len, decoder.max_len - len(full))
    stats: dict = {}
    for temperature in options.temperatures:
        cfg = dataclasses.replace(config, max_new_tokens=budget, suppress_tokens=suppress,
                                  num_return_sequences=1)
        if temperature > 0:
            cfg = dataclasses.replace(cfg, strategy="sample", temperature=temperature)
        out = generate(decoder, memory, mask, cfg, prompt_ids=full, eos_id=eos,
                       pad_id=model.pad_id, processors=[rules], ban_prompt=False,
                       generator=generator).best()
        length = int(out.lengths)
        tokens = out.tokens[0, :length].tolist()
        if tokens and tokens[-1] == eos:
            tokens = tokens[:-1]
        # The sum of log-probabilities (beam scores are divided by length ** length_penalty);
        # openai averages over the tokens and eos, present or not.
        total = float(out.scores) * (length ** cfg.length_penalty
                                     if cfg.strategy == "beam" else 1.0)
        ratio = None if text is None else compression_ratio(
            text([t for t in tokens if t < rules.timestamp_begin]))
        stats = {"tokens": tokens, "budget": budget, "temperature": float(temperature),
                 "avg_logprob": total / (len(tokens) + 1), "no_speech_prob": no_speech,
                 "compression_ratio": ratio}
        failed = ((options.compression_ratio_threshold is not None
                   and stats["compression_ratio"] > options.compression_ratio_threshold)
                  or (options.logprob_threshold is not None
                      and stats["avg_logprob"] < options.logprob_threshold))
        if failed and no_speech is not None and no_speech > options.no_speech_threshold and \
                options.logprob_threshold is not None and \
                stats["avg_logprob"] < options.logprob_threshold:
            failed = False                # silence: skipped, not retried (openai)
        if not failed:
            break
    return stats


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


__all__ = ["FRAMES_PER_TOKEN", "FRAME_SECONDS", "PLAIN", "TIME_PRECISION", "WINDOW_FRAMES",
           "TimedSegment", "TimestampRules", "WindowRules", "chunk_bounds", "compression_ratio",
           "detect_language", "merge_overlapping", "transcribe_long", "window_segments"]
