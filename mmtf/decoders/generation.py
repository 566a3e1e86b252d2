"""Autoregressive generation from an encoder memory: greedy, beam search and sampling.

Every strategy runs on the decoder's static KV cache (allocated once per call; cross-attention
K/V projected on the first step), one decoder step per new token; ``compile=True`` compiles
that step (:mod:`mmtf.decoders.compiled`), ``use_cache=False`` recomputes the prefix (the
reference for tests). On a CPU the cached steps run on oneDNN-packed weights (``pack_weights``,
:mod:`mmtf.nn.linear`), made for the call and dropped after it.

Conventions: every row starts from its prompt, fed whole on the first step; pad and the
prompt's ids are never generated, except eos, which may equal them (GPT-2); outputs hold the
generated tokens only; a row stops at its first eos and is padded afterwards. Scores are sums
of log-probabilities after the repeat penalties and masks, before temperature and top-k/top-p,
eos included. Why: docs/design/generation-and-metrics.md.

Shapes: b batch, k beams, r = b * k (or b * num_return_sequences) decoder rows, t generated
tokens, m memory length, v vocab.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from mmtf.decoders.compiled import MIN_COMPILED_LENGTH, compiled_decode_step
from mmtf.errors import UserError
from mmtf.nn.linear import Packs, packed_linear_weights

Strategy = Literal["greedy", "beam", "sample"]
StepCallback = Callable[[int, Tensor, Tensor], None]
# processor(logits (r, v), generated (r, t)) masks logits in place after the bans.
LogitsProcessor = Callable[[Tensor, Tensor], None]


@dataclass
class GenerationConfig:
    """Decoding options, flat plain values so that YAML can hold them.

    Args:
        strategy: "greedy", "beam" or "sample".
        max_new_tokens: most tokens generated per row (eos included); at most the decoder's
            ``max_len``.
        min_new_tokens: eos is masked for the first ``min_new_tokens`` steps.
        num_beams: beam width (strategy "beam").
        length_penalty: beam hypotheses rank by ``logprob_sum / length ** length_penalty``;
            > 0 favours longer, < 0 shorter sequences, 0 = raw log-prob.
        early_stopping: beam search stops an item once it has ``num_beams`` finished
            hypotheses; False: once no running beam can beat the worst kept one.
        num_return_sequences: hypotheses returned per input: the n best beams (n <= num_beams)
            or n independent samples. Greedy returns 1.
        temperature: sampling temperature (> 0).
        top_k: sample among the k most likely tokens; 0 = no limit.
        top_p: nucleus sampling threshold; 1.0 = no limit.
        use_cache: False recomputes the whole prefix each step (reference only: slow).
        compile: compile the cached step (:mod:`mmtf.decoders.compiled`); needs ``use_cache``.
        suppress_tokens: ids never generated (e.g. decoder ids past the tokenizer's vocabulary).
        repetition_penalty: CTRL's penalty on tokens already in the row (> 0; 1.0 = off).
        no_repeat_ngram_size: n > 0 bans tokens that would repeat an n-gram of the row; 0 = off.
        begin_suppress_tokens: ids never generated first (Whisper's option).
        pack_weights: run the cached steps on oneDNN-packed weights where the CPU can (logits
            within ~1e-5 of ``F.linear``'s, not bit-equal); False: ``F.linear`` throughout.
    """

    strategy: Strategy = "greedy"
    max_new_tokens: int = 32
    min_new_tokens: int = 0
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: bool = True
    num_return_sequences: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    use_cache: bool = True
    compile: bool = False
    suppress_tokens: tuple[int, ...] = ()
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    begin_suppress_tokens: tuple[int, ...] = ()
    pack_weights: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in ("greedy", "beam", "sample"):
            raise UserError(f"GenerationConfig: strategy ({self.strategy!r}) must be 'greedy', "
                            f"'beam' or 'sample'.")
        if self.max_new_tokens < 1:
            raise UserError(f"GenerationConfig: max_new_tokens ({self.max_new_tokens}) must be "
                            f">= 1.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise UserError(f"GenerationConfig: min_new_tokens ({self.min_new_tokens}) must be "
                            f"in [0, max_new_tokens={self.max_new_tokens}].")
        if self.num_beams < 1:
            raise UserError(f"GenerationConfig: num_beams ({self.num_beams}) must be >= 1.")
        if self.num_return_sequences < 1:
            raise UserError(f"GenerationConfig: num_return_sequences "
                            f"({self.num_return_sequences}) must be >= 1.")
        if self.strategy == "beam" and self.num_return_sequences > self.num_beams:
            raise UserError(f"GenerationConfig: num_return_sequences "
                            f"({self.num_return_sequences}) > num_beams ({self.num_beams}); "
                            f"beam search returns at most num_beams hypotheses.")
        if self.strategy == "greedy" and self.num_return_sequences != 1:
            raise UserError(f"GenerationConfig: num_return_sequences "
                            f"({self.num_return_sequences}) > 1 with strategy 'greedy', which "
                            f"has one answer; use strategy 'beam' or 'sample'.")
        if self.compile and not self.use_cache:
            raise UserError("GenerationConfig: compile=True needs use_cache=True; the uncached "
                            "path is the slow reference and is never compiled.")
        if not self.temperature > 0:
            raise UserError(f"GenerationConfig: temperature ({self.temperature}) must be > 0; "
                            f"use strategy 'greedy' for the argmax.")
        if self.top_k < 0:
            raise UserError(f"GenerationConfig: top_k ({self.top_k}) must be >= 0 (0 = off).")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"GenerationConfig: top_p ({self.top_p}) must be in (0, 1] "
                            f"(1.0 = off).")
        if not self.repetition_penalty > 0:
            raise UserError(f"GenerationConfig: repetition_penalty ({self.repetition_penalty}) "
                            f"must be > 0 (1.0 = off, > 1 discourages repeated tokens).")
        if isinstance(self.no_repeat_ngram_size, bool) or self.no_repeat_ngram_size != int(
                self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise UserError(f"GenerationConfig: no_repeat_ngram_size "
                            f"({self.no_repeat_ngram_size}) must be an integer >= 0 (0 = off, "
                            f"n bans repeating any n-gram).")
        self.no_repeat_ngram_size = int(self.no_repeat_ngram_size)
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            ids = tuple(int(i) for i in getattr(self, name))
            setattr(self, name, ids)
            if any(i < 0 for i in ids):
                raise UserError(f"GenerationConfig: {name} ({list(ids)}) must be token ids "
                                f">= 0.")

    @classmethod
    def build(cls, config: GenerationConfig | None = None, **overrides) -> GenerationConfig:
        """``config`` (default: the defaults) with ``overrides`` applied, validated."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"generate: unknown option(s) {unknown}; valid options are "
                            f"{sorted(names)} (see GenerationConfig).")
        return dataclasses.replace(config or cls(), **overrides)


class GenerationOutput(NamedTuple):
    """Generated tokens (without the prompt; eos-terminated, then pad) and their scores.

    tokens: (b, t) long, or (b, n, t) when ``num_return_sequences`` n > 1.
    scores: (b,) or (b, n) float sequence scores (length-penalised for beam search), best first.
    lengths: (b,) or (b, n) long, generated tokens per sequence, eos included.
    """

    tokens: Tensor
    scores: Tensor
    lengths: Tensor

    def best(self) -> GenerationOutput:
        """The best hypothesis of each input: tokens (b, t), scores and lengths (b,)."""
        if self.tokens.dim() == 2:
            return self
        return GenerationOutput(self.tokens[:, 0], self.scores[:, 0], self.lengths[:, 0])


class StepDecoder(Protocol):
    """What generation needs from a decoder (:class:`mmtf.decoders.TextDecoder` has it)."""

    max_len: int

    def make_cache(self, *, batch_size: int, context_len: int, max_len: int | None = None,
                   ) -> object: ...

    def step(self, tokens: Tensor, cache, *, memory: Tensor | None = None,
             memory_mask: Tensor | None = None) -> Tensor: ...

    def __call__(self, tokens: Tensor, memory: Tensor, memory_mask: Tensor | None = None,
                 ) -> Tensor: ...


class _Stepper:
    """Next-token logits (r, v) of every row, cached (the whole prompt on the first call, then
    one position) or uncached (prompt + whole prefix), penalised and masked."""

    def __init__(self, decoder: StepDecoder, memory: Tensor, memory_mask: Tensor | None,
                 config: GenerationConfig, *, prompt: Tensor, pad_id: int, eos_id: int,
                 pack: bool, processors: Sequence[LogitsProcessor], ban_prompt: bool) -> None:
        self.decoder, self.memory, self.memory_mask = decoder, memory, memory_mask
        self.prompt, self.eos_id = prompt, eos_id                                # (r, p)
        self.min_new_tokens = config.min_new_tokens
        self.penalties = (None if config.repetition_penalty == 1.0
                          and config.no_repeat_ngram_size == 0 else
                          dict(repetition_penalty=config.repetition_penalty,
                               no_repeat_ngram_size=config.no_repeat_ngram_size))
        self.processors = tuple(processors)
        self.compiled = (compiled_decode_step(decoder, pack=pack, rows=memory.shape[0])
                         if config.compile else None)
        self.compiled_steps = 0       # of this generation: only after one are guards skipped
        self.cache = None
        if config.use_cache:
            # The only allocation of K/V memory in a generate call: every position it will hold.
            self.cache = decoder.make_cache(batch_size=memory.shape[0],
                                            context_len=memory.shape[1],
                                            max_len=prompt.shape[1] + config.max_new_tokens - 1)
        # Never generated: pad and the prompt's ids unless they are eos, suppress_tokens, and eos
        # in the first min_new_tokens steps; step t masks banned[t >= min_new_tokens] in place.
        # Ids that only some rows' prompts hold are banned per row (row_banned).
        device = memory.device
        shared = (set(prompt[0].tolist()).intersection(*(set(r) for r in prompt.tolist()))
                  if ban_prompt else set())
        never = [*sorted({pad_id, *shared} - {eos_id}), *config.suppress_tokens]
        self.banned = (torch.tensor([*never, eos_id], device=device),
                       torch.tensor(never, dtype=torch.long, device=device))
        self.first_banned = torch.tensor(config.begin_suppress_tokens, dtype=torch.long,
                                         device=device)
        self.row_banned = (prompt if ban_prompt and any(set(r) - shared for r in prompt.tolist())
                           else None)

    def step(self, last: Tensor, generated: Tensor) -> Tensor:
        """Raw logits (r, v); last: (r,) latest token of each row (unused on the first,
        prompt-fed call); generated: (r, t) tokens so far."""
        if self.cache is not None and not self.cache.filled:
            # The first step feeds the whole prompt and projects the cross-attention K/V.
            logits = self.decoder.step(self.prompt, self.cache, memory=self.memory,
                                       memory_mask=self.memory_mask)     # (r, p, v)
        elif self.cache is not None:
            if self.compiled is not None and self.cache.length >= MIN_COMPILED_LENGTH:
                logits = self.compiled(last[:, None], self.cache,
                                       same_call=self.compiled_steps > 0)
                self.compiled_steps += 1
            else:
                logits = self.decoder.step(last[:, None], self.cache)
        else:
            prefix = torch.cat([self.prompt, generated], dim=1)          # (r, p + t)
            logits = self.decoder(prefix, self.memory, self.memory_mask)
        return logits[:, -1]                                             # (r, v)

    def logits(self, last: Tensor, generated: Tensor) -> Tensor:
        """:meth:`step`'s logits as float after the repeat penalties, the bans (each row's own
        prompt ids but eos, the shared banned ids, begin_suppress_tokens first) and the
        processors, in that order."""
        logits = self.step(last, generated).float()                      # (r, v)
        t = generated.shape[1]
        if self.penalties is not None:
            history = torch.cat([self.prompt, generated], dim=1)         # (r, p + t)
            penalize_repeats(logits, history, **self.penalties)
        if self.row_banned is not None:
            eos = logits[:, self.eos_id].clone()     # eos may be in a prompt (GPT-2's bos)
            logits.scatter_(1, self.row_banned, -math.inf)              # r * p elements
            logits[:, self.eos_id] = eos
        logits.index_fill_(1, self.banned[t >= self.min_new_tokens], -math.inf)
        if t == 0 and len(self.first_banned):
            logits.index_fill_(1, self.first_banned, -math.inf)
        for processor in self.processors:
            processor(logits, generated)
        return logits

    def reorder(self, index: Tensor) -> None:
        # Uncached decoding recomputes from the reordered prefix. Beams move within their item,
        # whose prompt all its rows hold: row_banned and prompt stay valid.
        if self.cache is not None:
            self.cache.reorder(index)


def _prompt_rows(prompt_ids: Sequence[int] | Sequence[Sequence[int]] | Tensor, b: int,
                 device: torch.device) -> Tensor:
    """The prompt of each of the b items as a (b, p) long tensor."""
    if isinstance(prompt_ids, Tensor):
        prompt = prompt_ids.to(device=device, dtype=torch.long)
        if prompt.dim() == 1:
            prompt = prompt[None]
    elif len(prompt_ids) and not isinstance(prompt_ids[0], int | Tensor) and hasattr(
            prompt_ids[0], "__len__"):
        lengths = sorted({len(row) for row in prompt_ids})
        if len(lengths) > 1:
            raise UserError(f"generate: the per-item prompts have different lengths {lengths}; "
                            f"every row of a call needs a prompt of the same length (Whisper's "
                            f"<|startoftranscript|> <|lang|> <|task|> .. are): generate items "
                            f"with different prompt lengths in separate calls.")
        prompt = torch.tensor([[int(i) for i in row] for row in prompt_ids], dtype=torch.long,
                              device=device)
    else:
        prompt = torch.tensor([int(i) for i in prompt_ids], dtype=torch.long,
                              device=device)[None]
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise UserError(f"generate: prompt_ids has shape {tuple(prompt.shape)}; give the ids "
                        f"of one prompt (p,) or one per item (batch, p), p >= 1 (at least the "
                        f"bos id).")
    if prompt.shape[0] == 1:
        return prompt.expand(b, -1)
    if prompt.shape[0] != b:
        raise UserError(f"generate: {prompt.shape[0]} per-item prompts for a batch of {b}; give "
                        f"one prompt, or one per item.")
    return prompt


def generate(decoder: StepDecoder, memory: Tensor, memory_mask: Tensor | None,
             config: GenerationConfig, *, prompt_ids: Sequence[int] | Sequence[Sequence[int]]
             | Tensor, eos_id: int, pad_id: int,
             generator: torch.Generator | None = None, callback: StepCallback | None = None,
             processors: Sequence[LogitsProcessor] = (), ban_prompt: bool = True,
             ) -> GenerationOutput:
    """Decode from an encoder memory (use :meth:`EncoderDecoder.generate` for raw inputs).

    Args:
        decoder: a :class:`TextDecoder` or anything with its step API.
        memory: (b, m, c_ctx) encoder output.
        memory_mask: (b, m) bool, True = real position, or None.
        config: decoding options.
        prompt_ids: the ids every row starts from, or one prompt per item: a (b, p) long
            tensor or b lists of equal length; a row's own prompt ids are banned in that row.
        eos_id, pad_id: special token ids (they may be equal).
        generator: random generator for sampling.
        callback: ``callback(step, tokens (r,), logits (r, v))`` after every step, banned
            tokens already at -inf.
        processors: ``processor(logits, generated)`` on every step's logits after the bans,
            masking in place (Whisper's timestamp rules); the scores include them.
        ban_prompt: False: the prompt's ids may be generated (a prompt holding earlier text,
            Whisper's ``<|startofprev|>`` context); ban its specials with suppress_tokens.

    Returns:
        A :class:`GenerationOutput`.
    """
    b = memory.shape[0]
    prompt = _prompt_rows(prompt_ids, b, memory.device)                          # (b, p)
    p = prompt.shape[1]
    # The decoder reads the prompt and every generated token but the last.
    if p + config.max_new_tokens - 1 > decoder.max_len:
        raise UserError(f"generate: the prompt ({p} tokens) + max_new_tokens "
                        f"({config.max_new_tokens}) - 1 > model.decoder.max_len "
                        f"({decoder.max_len}); lower max_new_tokens or raise "
                        f"model.decoder.max_len.")
    if memory_mask is not None and bool(memory_mask.all()):
        memory_mask = None               # one check per call; no mask is built in any step then
    rows = config.num_beams if config.strategy == "beam" else config.num_return_sequences
    if rows > 1:
        # Expanded once, before the first step, so the cross K/V are projected for every row.
        memory = repeat(memory, "b m c -> (b k) m c", k=rows)
        if memory_mask is not None:
            memory_mask = repeat(memory_mask, "b m -> (b k) m", k=rows)
        prompt = repeat(prompt, "b p -> (b k) p", k=rows)
    # The one switch for oneDNN-packed weights; only cached steps of an nn.Module pack.
    pack = config.pack_weights and config.use_cache and isinstance(decoder, nn.Module)
    stepper = _Stepper(decoder, memory, memory_mask, config, prompt=prompt, pad_id=pad_id,
                       eos_id=eos_id, pack=pack, processors=processors, ban_prompt=ban_prompt)
    ids = dict(start_id=int(prompt[0, -1]), eos_id=eos_id, pad_id=pad_id)
    # The compiled step's graph holds its own copies by identity: attach those, never new ones.
    packs: Packs | None = stepper.compiled.packs if stepper.compiled is not None else None
    with (packed_linear_weights(decoder, rows=memory.shape[0], packs=packs) if pack
          else nullcontext()):
        if config.strategy == "beam":
            return _beam_search(stepper, config, b, callback=callback, **ids)
        out = _greedy_or_sample(stepper, config, b * rows, generator=generator,
                                callback=callback, **ids)
    if rows > 1:
        out = GenerationOutput(*(rearrange(x, "(b n) ... -> b n ...", n=rows) for x in out))
    return out


def penalize_repeats(logits: Tensor, history: Tensor, *, repetition_penalty: float = 1.0,
                     no_repeat_ngram_size: int = 0) -> Tensor:
    """Apply the repeat penalties (as in :class:`GenerationConfig`) to next-token ``logits``
    (r, v) float in place, given each row's tokens so far ``history`` (r, t), prompt first;
    returns ``logits``."""
    if repetition_penalty != 1.0:
        seen = logits.gather(1, history)                                 # (r, t)
        seen = torch.where(seen < 0, seen * repetition_penalty, seen / repetition_penalty)
        logits.scatter_(1, history, seen)      # a repeated id writes the same value each time
    n = no_repeat_ngram_size
    if 0 < n <= history.shape[1]:
        grams = history.unfold(1, n, 1)                                  # (r, w, n)
        tail = history[:, history.shape[1] - n + 1:]                     # (r, n - 1)
        match = (grams[:, :, :-1] == tail[:, None, :]).all(dim=-1)      # (r, w)
        # Count matches per completing token: scatter_add is exact with repeated ids.
        hits = torch.zeros_like(logits).scatter_add_(1, grams[:, :, -1], match.to(logits.dtype))
        logits.masked_fill_(hits > 0, -math.inf)
    return logits


def _greedy_or_sample(stepper: _Stepper, config: GenerationConfig, rows: int, *,
                      start_id: int, eos_id: int, pad_id: int, generator: torch.Generator | None,
                      callback: StepCallback | None) -> GenerationOutput:
    device = stepper.memory.device
    max_t = config.max_new_tokens
    tokens = torch.full((rows, max_t), pad_id, dtype=torch.long, device=device)
    scores = torch.zeros(rows, device=device)
    lengths = torch.zeros(rows, dtype=torch.long, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    last = torch.full((rows,), start_id, dtype=torch.long, device=device)
    t = 0
    for t in range(max_t):
        logits = stepper.logits(last, tokens[:, :t])                     # (r, v)
        if config.strategy == "greedy":
            # max(dim).indices: the first maximum, as argmax, one kernel cheaper on CPU.
            nxt = logits.max(dim=-1).indices                             # (r,)
        else:
            nxt = sample_next(logits, temperature=config.temperature, top_k=config.top_k,
                              top_p=config.top_p, generator=generator)
        # One fused kernel, where logsumexp is six small ones (each a thread wake-up on CPU).
        step_logprob = logits.log_softmax(dim=-1).gather(1, nxt[:, None]).squeeze(1)
        nxt = nxt.masked_fill(finished, pad_id)                         # stopped rows: pad
        scores += step_logprob.masked_fill(finished, 0.0)
        lengths += ~finished
        tokens[:, t] = nxt
        finished |= nxt == eos_id
        last = nxt
        if callback is not None:
            callback(t, nxt, logits)
        # The one host sync per step: stop as soon as every row has emitted eos.
        if t + 1 >= config.min_new_tokens and bool(finished.all()):
            break
    return GenerationOutput(tokens[:, : t + 1], scores, lengths)


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> Tensor:
    """Draw one token per row, (r,) long, from ``softmax(logits / temperature)`` of logits
    (r, v) after top-k/top-p filtering (options as in :class:`GenerationConfig`)."""
    logits = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def filter_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """A copy of ``logits`` (r, v) with -inf outside the top-k and outside the top-p nucleus
    (the smallest set of most likely tokens reaching ``top_p``, Holtzman et al. 2020,
    arXiv:1904.09751; the most likely token is always kept)."""
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]                  # (r, 1)
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs    # probability of the more likely tokens
        drop_sorted = before >= top_p            # the set already reached top_p without it
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def _beam_search(stepper: _Stepper, config: GenerationConfig, b: int, *, start_id: int,
                 eos_id: int, pad_id: int, callback: StepCallback | None) -> GenerationOutput:
    """Vectorised beam search over r = b * k rows (no Python loop over the batch)."""
    k, max_t, lp = config.num_beams, config.max_new_tokens, config.length_penalty
    device = stepper.memory.device
    rows = b * k
    seqs = torch.full((rows, max_t), pad_id, dtype=torch.long, device=device)   # running beams
    beam_scores = torch.zeros(b, k, device=device)
    beam_scores[:, 1:] = -math.inf       # all beams start equal: expand only the first one
    beam_scores = beam_scores.view(rows)
    # Finished hypotheses, k per item, best first; score = logprob_sum / length ** lp.
    done_tokens = torch.full((b, k, max_t), pad_id, dtype=torch.long, device=device)
    done_scores = torch.full((b, k), -math.inf, device=device)
    done_lengths = torch.zeros(b, k, dtype=torch.long, device=device)
    item_done = torch.zeros(b, dtype=torch.bool, device=device)
    row_base = torch.arange(b, device=device)[:, None] * k                       # (b, 1)
    top_rank_ok = torch.arange(2 * k, device=device) < k                         # (2k,)
    last = torch.full((rows,), start_id, dtype=torch.long, device=device)
    t = 0
    for t in range(max_t):
        logits = stepper.logits(last, seqs[:, :t])                               # (r, v)
        logprobs = logits.log_softmax(dim=-1)
        vocab = logprobs.shape[-1]
        cand = rearrange(beam_scores[:, None] + logprobs, "(b k) v -> b (k v)", k=k)
        # 2k candidates guarantee k that do not end in eos.
        top_scores, top_index = cand.topk(2 * k, dim=1)                          # (b, 2k)
        top_tokens, src_rows = top_index % vocab, row_base + top_index // vocab
        is_eos = top_tokens == eos_id
        length = t + 1
        # Finished hypotheses: eos among the k best candidates (as in Hugging Face: with k = 1
        # this is greedy search) of items that are still open.
        finish = is_eos & top_rank_ok & ~item_done[:, None]
        new_scores = torch.where(finish, top_scores / length ** lp, -math.inf)  # (b, 2k)
        new_tokens = seqs[src_rows.view(-1)].view(b, 2 * k, max_t)
        new_tokens[:, :, t] = eos_id
        done_tokens, done_scores, done_lengths = _keep_best(
            k, (done_tokens, done_scores, done_lengths),
            (new_tokens, new_scores, torch.full_like(src_rows, length)))
        # Running beams: the k best candidates that do not end in eos.
        run_scores, pick = top_scores.masked_fill(is_eos, -math.inf).topk(k, dim=1)   # (b, k)
        src = src_rows.gather(1, pick).view(rows)
        last = top_tokens.gather(1, pick).view(rows)
        beam_scores = run_scores.view(rows)
        seqs = seqs[src]
        seqs[:, t] = last
        stepper.reorder(src)
        if callback is not None:
            callback(t, last, logits)
        worst_kept = done_scores[:, -1]                                          # (b,)
        if config.early_stopping:
            item_done |= worst_kept > -math.inf
        else:
            # Log-probs only add negative terms, so the best a running beam can still reach is
            # its current sum over the most favourable length it can still have.
            best_len = max_t if lp > 0 else length + 1
            item_done |= (worst_kept > -math.inf) & (run_scores[:, 0] / best_len ** lp
                                                     <= worst_kept)
        if bool(item_done.all()):
            break
    else:
        # Out of steps: open items also consider their running beams (not eos-terminated).
        open_scores = torch.where(item_done[:, None], -math.inf,
                                  run_scores / (t + 1) ** lp)                    # (b, k)
        done_tokens, done_scores, done_lengths = _keep_best(
            k, (done_tokens, done_scores, done_lengths),
            (seqs.view(b, k, max_t), open_scores, torch.full_like(open_scores, t + 1,
                                                                  dtype=torch.long)))
    n = config.num_return_sequences
    width = int(done_lengths[:, :n].max())
    out = GenerationOutput(done_tokens[:, :n, :width], done_scores[:, :n], done_lengths[:, :n])
    return out.best() if n == 1 else out


def _keep_best(k: int, kept: tuple[Tensor, Tensor, Tensor], new: tuple[Tensor, Tensor, Tensor],
               ) -> tuple[Tensor, Tensor, Tensor]:
    """Merge hypotheses (tokens (b, j, t), scores (b, j), lengths (b, j)) and keep the k best."""
    tokens, scores, lengths = (torch.cat([a, c], dim=1) for a, c in zip(kept, new))
    scores, index = scores.topk(k, dim=1)                                        # sorted
    tokens = tokens.gather(1, repeat(index, "b k -> b k t", t=tokens.shape[-1]))
    return tokens, scores, lengths.gather(1, index)


__all__ = ["GenerationConfig", "GenerationOutput", "LogitsProcessor", "StepCallback", "filter_logits", "generate",
           "penalize_repeats", "sample_next"]
