"""Speech recognition and translation: :class:`SpeechTask` is a
:class:`~mmtf.tasks.captioning.CaptioningTask` with a Whisper vocabulary that also decodes by
language, job, timestamps and long-form audio, and scores WER / CER after a text normaliser.
Its generation settings (:data:`~mmtf.tasks.captioning.SPEECH_KEYS`,
:class:`~mmtf.decoders.speech.WindowRules`): docs/design/asr-decoding.md.

Shapes: b batch, n samples.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmtf.decoders import EncoderDecoder
from mmtf.decoders.generation import GenerationConfig, generate
from mmtf.decoders.speech import (
    WINDOW_FRAMES,
    TimestampRules,
    WindowRules,
    chunk_bounds,
    detect_language,
    merge_overlapping,
    transcribe_long,
)
from mmtf.errors import UserError
from mmtf.tasks.captioning import SPEECH_KEYS, CaptioningTask
from mmtf.text import Tokenizer
from mmtf.text.normalize import get_normalizer
from mmtf.text.prompt import FIRST_TIMESTAMP, JOBS, NO_TIMESTAMPS, WhisperPrompt, is_whisper

LONG_FORMS = ("sequential", "chunked")


@dataclass
class SpeechOptions(WindowRules):
    """The speech keys of the generation settings (see the module docstring)."""

    language: str | None = None
    task: str | None = None
    timestamps: bool = False
    long_form: str = "sequential"
    chunk_overlap: float = 5.0
    initial_prompt: str | None = None

    def __post_init__(self) -> None:
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            value = getattr(self, name)     # `off` where YAML's null means "not set"
            setattr(self, name, None if value in (None, "off") else float(value))
        temperatures = self.temperatures
        self.temperatures = tuple(float(t) for t in (
            temperatures if isinstance(temperatures, list | tuple) else [temperatures]))
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise UserError(f"generation.temperatures={temperatures!r} must be temperatures "
                            f">= 0, tried in order (openai's: [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]).")
        if self.sample_len is not None and int(self.sample_len) < 1:
            raise UserError(f"generation.sample_len={self.sample_len} must be >= 1 (or null: "
                            f"half the decoder's positions).")
        if self.task is not None and self.task not in JOBS:
            raise UserError(f"generation.task={self.task!r} must be transcribe or translate "
                            f"(or null: the prompt's own).")
        if self.long_form not in LONG_FORMS:
            raise UserError(f"generation.long_form={self.long_form!r} must be sequential "
                            f"(Whisper's timestamp-driven windows) or chunked (overlapping "
                            f"chunks, merged text).")
        if not 0.0 <= float(self.chunk_overlap) < 15.0:
            raise UserError(f"generation.chunk_overlap={self.chunk_overlap} must be in [0, 15) "
                            f"seconds (half a 30 s chunk at most).")
        self.timestamps = bool(self.timestamps)

    @property
    def active(self) -> bool:
        """Whether the prompt is built here (otherwise the tokenizer's prompt is used)."""
        return self.language is not None or self.task is not None or self.timestamps


def split_generation(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``GenerationConfig`` keys, speech keys) of generation settings."""
    decoding = {k: v for k, v in settings.items() if k not in SPEECH_KEYS}
    return decoding, {k: v for k, v in settings.items() if k in SPEECH_KEYS}


def check_speech(options: SpeechOptions, tokenizer: Tokenizer | None,
                 vocab_size: int | None = None) -> None:
    """The options fit the tokenizer (known language and job) and the decoder's ``vocab_size``
    (timestamp rows if asked)."""
    if not options.active:
        return
    if tokenizer is None or not is_whisper(tokenizer):
        raise UserError("generation.language / task / timestamps need a Whisper tokenizer "
                        "(tokenizer=pretrained with a Whisper folder).")
    prompt = WhisperPrompt(tokenizer)
    if options.language == "auto":
        if not tokenizer.languages:
            raise UserError(f"generation.language=auto: the tokenizer ({tokenizer.source}) has "
                            f"no language tokens to detect.")
        language = next(iter(tokenizer.languages)) if tokenizer.multilingual else None
    else:
        language = options.language or prompt.default_language()
    prompt.build(language, options.task or "transcribe", timestamps=options.timestamps)
    if options.timestamps and vocab_size is not None and tokenizer.timestamp_begin >= vocab_size:
        raise UserError(f"generation.timestamps=true: the tokenizer ({tokenizer.source}) has "
                        f"no timestamp tokens ({FIRST_TIMESTAMP} ..) and the decoder no rows "
                        f"past {NO_TIMESTAMPS}; set generation.timestamps=false.")


@torch.no_grad()
def decode_speech(model: EncoderDecoder, tokenizer, inputs: Tensor, lengths: Tensor | None,
                  options: SpeechOptions, config: GenerationConfig) -> list[dict[str, Any]]:
    """One result per waveform: ``caption``, ``language`` (with a language option) and
    ``segments`` (``[{start, end, text}]``, with timestamps or sequential long-form).

    Args:
        model: the task's encoder-decoder (a Whisper-type audio encoder).
        tokenizer: its :class:`~mmtf.text.PretrainedTokenizer`.
        inputs: (b, n) waveforms; lengths (b,) valid samples (None = all).
        options: the speech options; config: the decoding options.
    """
    encoder = model.encoder
    b, n = inputs.shape
    lengths = (torch.full((b,), n, dtype=torch.long) if lengths is None else lengths).cpu()
    window = WINDOW_FRAMES * encoder.frontend.hop_length                     # 30 s in samples
    first = inputs[:, :window]
    first_lengths = lengths.clamp(max=first.shape[1])
    task = options.task or "transcribe"
    prompt = WhisperPrompt(tokenizer)
    long = [int(length) > window for length in lengths]
    memory = mask = None
    if options.language == "auto" and tokenizer.multilingual:
        memory, mask = model.encode(first, first_lengths.to(inputs.device))
        if any(long):
            # As Whisper: a long clip's language from the first window of its whole-clip
            # features (normalised over the clip), not from its first 30 s alone.
            memory, mask = memory.clone(), None if mask is None else mask.clone()
            for i in (i for i in range(b) if long[i]):
                features = encoder.whisper_features(inputs[i, :int(lengths[i])])
                own, own_mask = model.encode_features(features[None, :, :WINDOW_FRAMES])
                memory[i] = own[0]
                if mask is not None and own_mask is not None:
                    mask[i] = own_mask[0]
        ids = detect_language(model.decoder, memory, mask,
                              start_id=tokenizer.start_of_transcript_id,
                              language_ids=list(tokenizer.languages.values()))
        codes = {i: code for code, i in tokenizer.languages.items()}
        languages = [codes[int(i)] for i in ids]
    elif options.language == "auto":
        languages = [None] * b                  # English-only: nothing to detect
    else:
        languages = [options.language or prompt.default_language()] * b
    sequential = [options.timestamps or (is_long and options.long_form == "sequential")
                  for is_long in long]
    results: list[dict[str, Any]] = [{} for _ in range(b)]
    # Short items without timestamps: one batched call with a prompt per item.
    plain = [i for i in range(b) if not sequential[i] and not long[i]]
    if plain:
        prompts = torch.tensor([prompt.build(languages[i], task) for i in plain])
        if memory is None or len(plain) != b:
            index = torch.tensor(plain, device=inputs.device)
            memory, mask = model.encode(first[index], first_lengths[plain].to(inputs.device))
        out = generate(model.decoder, memory, mask, config, prompt_ids=prompts,
                       eos_id=model.eos_id, pad_id=model.pad_id).best()
        for i, row in zip(plain, out.tokens.tolist()):
            results[i]["caption"] = tokenizer.decode(row)
    tb = tokenizer.timestamp_begin
    rules = None if tb is None else TimestampRules(
        timestamp_begin=tb, no_timestamps_id=tokenizer.no_timestamps_id, eos_id=tokenizer.eos_id)

    def text(ids: list[int]) -> str:       # timestamp ids may lie past the tokenizer's strings
        return tokenizer.decode([t for t in ids if t < tb])

    if any(sequential):
        backend = tokenizer.backend
        initial = (backend.encode(" " + options.initial_prompt.strip()).ids
                   if options.initial_prompt else [])
        # Undecodable ids are suppressed for plain decoding; timestamps past the tokenizer's
        # strings are the model's own rows.
        timed = dataclasses.replace(config, suppress_tokens=[
            i for i in config.suppress_tokens if i < tb or tb < tokenizer.vocab_size])
    for i in range(b):
        wave = inputs[i, :int(lengths[i])]
        if sequential[i]:
            if long[i]:
                features = encoder.whisper_features(wave)                   # (f, n // hop)
            else:                    # padded to 3000 frames, decoded up to the audio's end
                features = encoder.frontend(wave[None], lengths[i:i + 1].to(wave.device))[0][0]
            segments = transcribe_long(
                model, features, config=timed, rules=rules, options=options,
                prompt=prompt.build(languages[i], task, timestamps=True),
                frames=int(lengths[i]) // encoder.frontend.hop_length, text=text,
                prev_id=backend.token_to_id("<|startofprev|>"), initial_prompt=initial)
            for segment in segments:
                segment.text = text(segment.tokens)
            results[i]["caption"] = text([t for s in segments for t in s.tokens])
            results[i]["segments"] = [s.as_dict() for s in segments]
        elif long[i]:
            results[i]["caption"] = _chunked(model, tokenizer, wave, window, options,
                                             languages[i], task, config)
        if options.language is not None:
            results[i]["language"] = languages[i] or "en"
    return results


def _chunked(model: EncoderDecoder, tokenizer, wave: Tensor, window: int,
             options: SpeechOptions, language: str | None, task: str,
             config: GenerationConfig) -> str:
    """A long clip as 30 s chunks overlapping by ``chunk_overlap`` s, decoded in one batch and
    merged (:func:`mmtf.decoders.speech.merge_overlapping`)."""
    sample_rate = model.encoder.sample_rate
    bounds = chunk_bounds(wave.shape[0], chunk=window,
                          overlap=int(options.chunk_overlap * sample_rate))
    chunks = torch.zeros(len(bounds), window, device=wave.device)
    for k, (a, z) in enumerate(bounds):
        chunks[k, : z - a] = wave[a:z]
    sizes = torch.tensor([z - a for a, z in bounds], device=wave.device)
    memory, mask = model.encode(chunks, sizes)
    out = generate(model.decoder, memory, mask, config, eos_id=model.eos_id, pad_id=model.pad_id,
                   prompt_ids=WhisperPrompt(tokenizer).build(language, task)).best()
    special = tokenizer.special_ids
    texts = [[t for t in row if t not in special] for row in out.tokens.tolist()]
    reach = overlap_reach(texts, options.chunk_overlap, window / sample_rate)
    return tokenizer.decode(merge_overlapping(texts, max_overlap=reach))


def overlap_reach(texts: list[list[int]], overlap: float, chunk: float) -> int:
    """How many tokens at a chunk's edge the merge searches: the overlap holds about
    ``overlap / chunk`` of the longest chunk's tokens; twice that, and at least 4."""
    longest = max((len(t) for t in texts), default=0)
    return max(4, int(longest * 2 * overlap / chunk) + 2)


class SpeechTask(CaptioningTask):
    """A captioner with a Whisper vocabulary that transcribes and translates speech.

    Args:
        generation: also the speech options (see the module docstring).
        wer_normalizer: the text normaliser applied before WER / CER
            (:data:`mmtf.text.normalize.NORMALIZERS`).
        **kwargs: see :class:`CaptioningTask`.
    """

    def __init__(self, *, generation: dict | None = None,
                 wer_normalizer: str = "whisper_english", **kwargs: Any) -> None:
        decoding, speech = split_generation(dict(generation or {"strategy": "greedy"}))
        self.speech = SpeechOptions(**speech)
        super().__init__(generation=decoding, **kwargs)
        self.set_wer_normalizer(wer_normalizer)

    def set_wer_normalizer(self, name: str) -> None:
        """Normalise WER / CER text with ``name`` from now on (``evaluate wer_normalizer=``)."""
        get_normalizer(name)
        for metrics in self._all_metrics():
            metrics.normalizer = name

    def update_generation(self, overrides: dict[str, Any]) -> None:
        decoding, speech = split_generation(overrides)
        self.speech = dataclasses.replace(self.speech, **speech)
        super().update_generation(decoding)

    def generation_state(self) -> Any:
        return super().generation_state(), self.speech

    def restore_generation(self, state: Any) -> None:
        super().restore_generation(state[0])
        self.speech = state[1]

    def check_generation(self) -> None:
        super().check_generation()
        if self.tokenizer is not None:
            check_speech(self.speech, self.tokenizer, self.model.decoder.vocab_size)

    def too_long(self, lengths: Tensor | None) -> bool:
        """Whether an audio batch holds clips longer than the encoder takes (handed over whole
        for long-form speech decoding)."""
        limit = getattr(self.encoder, "max_samples", None) if self.modality == "audio" else None
        return limit is not None and lengths is not None and int(lengths.max()) > limit

    def decode_speech(self, inputs: Tensor, lengths: Tensor | None) -> list[dict[str, Any]]:
        """:func:`decode_speech` of a batch under the speech options."""
        config = GenerationConfig.build(**self.generation)
        return decode_speech(self.model, self.require_tokenizer(), inputs, lengths, self.speech,
                             config)

    def predict_batch(self, inputs: Tensor, lengths: Tensor | None) -> list[dict[str, Any]]:
        """With speech options (or audio longer than the encoder takes, from
        ``long_audio=sequential|chunked``) also ``language`` and ``segments``."""
        if self.speech.active or self.too_long(lengths):
            return self.decode_speech(inputs, lengths)
        return super().predict_batch(inputs, lengths)

    @torch.no_grad()
    def generate_captions(self, inputs: Tensor, lengths: Tensor | None, *,
                          prompt_ids: Tensor | None = None) -> list[str]:
        """Speech decoding settings (``generation.language`` / ``task`` / ``timestamps``, or
        clips longer than the encoder's window) decode by those instead of ``prompt_ids``."""
        if self.speech.active or self.too_long(lengths):
            return [row["caption"] for row in self.decode_speech(inputs, lengths)]
        return super().generate_captions(inputs, lengths, prompt_ids=prompt_ids)


__all__ = ["LONG_FORMS", "SpeechOptions", "SpeechTask", "check_speech", "decode_speech",
           "overlap_reach", "split_generation"]
