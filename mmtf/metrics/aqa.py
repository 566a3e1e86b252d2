"""Multiple-choice audio question answering (DCASE 2025 task 5's form): the item's chat prompt,
the option a free-text reply chose, rotated variants of an item, shuffle-robust accuracy.

An item is a mapping (a line of a JSONL set, :mod:`mmtf.data.formats.aqa`) or an object with the
same attributes: ``id``, ``question_type``, ``question``, ``choices`` (distinct option texts)
and ``answer`` (the correct option's text, as DCASE writes it). Its chat form
(:func:`format_messages`)::

    user:      <|audio|>\\n<question>\\n(A) ...\\n(B) ...\\n(C) ...\\n(D) ...\\nAnswer with the letter.
    assistant: (B) <option text>

**Which option a reply chose** (:func:`parse_choice`; a reply matching none or several options
is wrong). First the letters the reply names, case-insensitive, among the item's own letters:

1. a letter in parentheses anywhere: ``(C)``, ``The answer is (c).``;
2. the whole reply is one letter, bare or with punctuation: ``c``, ``B.``, ``**B**``;
3. a letter opening the reply followed by ``)``, ``.`` or ``:`` and more text: ``B) dog``;
4. a letter after ``answer`` / ``option`` / ``choice`` (optionally ``is`` or ``:``) that ends the
   sentence or is followed by ``is``/``was``: ``Answer: B``, ``the correct option is D``;
5. an upper-case letter ending the reply: ``I think it is B.``;
6. two letters joined by ``or`` / ``and`` / ``,`` / ``/`` (``A or B``) name both.

One distinct letter: that option. Two or more: none (a hedge is wrong). No letter: the option
*texts* the reply contains, compared as lower-case word runs (``"the low tone"`` contains option
``low tone``), an option inside a longer matching one dropped (``tone`` inside ``low tone``);
exactly one left: that option. A letter wins over text (``(B) low tone`` is B even when B is
another option). DCASE 2025 task 5 scores top-1 accuracy on the option a system returns; its
official scorer was not available to us, so this rule is ours: the letter forms chat models
write, and the option-text fallback of MMAU/MMAR's ``string_match`` made answer-blind (it names
the chosen option, so a confusion table can be built).

**Rotations** (:func:`rotate_item`): rotation ``r`` moves option ``i`` to position
``(i + r) % n``; the answer's text stays, its letter moves by ``r``. With ``k = n`` rotations
(4 by default) the correct option visits every letter, so a model that always answers ``A`` is
right under exactly one of them.

**Scores** (:class:`AQAAccuracy`, :func:`aqa_scores`): ``accuracy`` (rotation 0: the set as
written), ``mean_accuracy`` (every (item, rotation) reply counts once), ``strict_accuracy``
(items answered right under all ``k`` rotations), ``unparsed`` (share of replies naming no
option), ``items`` (items with all rotations scored); each also as ``<question_type>/<name>``;
and the confusion counts: per question type, right letter x chosen letter (last column: none).
The guide: docs/guide/aqa-scoring.md. Why rotations and a count state: see
docs/design/audio-qa.md"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
AUDIO_PLACEHOLDER = "<|audio|>"      # where the model side puts the clip's embeddings
INSTRUCTION = "Answer with the letter."

_PAREN = re.compile(r"\(\s*([A-Za-z])\s*\)")
_ALONE = re.compile(r"^\W*([A-Za-z])\W*$")
_LEAD = re.compile(r"^\W*?([A-Za-z])\**\s*[.):]\s*\S")
_NAMED = re.compile(r"\b(?:answer|option|choice)\s*(?:is\s*|:\s*)?\(?([A-Za-z])\)?"
                    r"(?=\s*$|\s*[.,;:!?]|\s+(?:is|was)\b)", re.IGNORECASE)
_TAIL = re.compile(r"(?:^|\s)([A-Z])[.!]?\s*$")
_PAIR = re.compile(r"(?<![A-Za-z])\(?([A-Z])\)?\s*(?:or|and|,|/)\s*\(?([A-Z])\)?(?![A-Za-z])")


def _field(item: Any, key: str) -> Any:
    return item[key] if isinstance(item, Mapping) else getattr(item, key)


def answer_index(item: Any) -> int:
    """Position of ``item``'s answer among its choices.

    Raises:
        ValueError: the answer is not one of the choices, or the choices repeat.
    """
    choices, answer = list(_field(item, "choices")), _field(item, "answer")
    if len(set(choices)) != len(choices) or answer not in choices:
        raise ValueError(f"item {_field_or(item, 'id')!r}: the answer ({answer!r}) must be "
                         f"exactly one of the distinct choices {choices}.")
    return choices.index(answer)


def _field_or(item: Any, key: str) -> Any:
    try:
        return _field(item, key)
    except (KeyError, AttributeError):
        return None


def user_prompt(question: str, choices: Sequence[str]) -> str:
    """The user turn: the audio placeholder, the question, the lettered options, the instruction."""
    options = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))
    return f"{AUDIO_PLACEHOLDER}\n{question}\n{options}\n{INSTRUCTION}"


def format_messages(question: str, choices: Sequence[str], answer: str) -> list[dict[str, str]]:
    """The item as a two-turn chat: the user prompt and the assistant's ``(B) <option text>``."""
    return [{"role": "user", "content": user_prompt(question, choices)},
            {"role": "assistant", "content": f"({LETTERS[list(choices).index(answer)]}) {answer}"}]


def rotate_item(item: Any, rotation: int) -> dict[str, Any]:
    """``item`` with its options rotated by ``rotation`` (option ``i`` to ``(i + r) % n``) and the
    messages rebuilt; the answer's text is unchanged, its letter moved (``rotation`` 0: the item
    as written). A mapping's other keys are kept; ``rotation`` is added."""
    choices = list(_field(item, "choices"))
    answer_index(item)
    n = len(choices)
    rotated = [choices[(i - rotation) % n] for i in range(n)]
    out = dict(item) if isinstance(item, Mapping) else {
        k: _field(item, k) for k in ("id", "question_type") if _field_or(item, k) is not None}
    question, answer = _field(item, "question"), _field(item, "answer")
    out.update(question=question, choices=rotated, answer=answer, rotation=rotation,
               messages=format_messages(question, rotated, answer))
    return out


def rotations(item: Any, k: int = 4) -> list[dict[str, Any]]:
    """The ``k`` rotated variants of ``item`` the model answers (:func:`rotate_item` 0..k-1)."""
    return [rotate_item(item, r) for r in range(k)]


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z0-9]+", text.lower()))


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    k = len(needle)
    return k > 0 and any(haystack[i:i + k] == needle for i in range(len(haystack) - k + 1))


def parse_choice(reply: str, choices: Sequence[str]) -> int | None:
    """The index of the option ``reply`` chose among ``choices``, or None when it names none or
    several (the rule: this module's docstring)."""
    n = len(choices)
    found: set[str] = set()
    for m in _PAREN.finditer(reply):
        found.add(m.group(1).upper())
    for pattern in (_ALONE, _LEAD, _TAIL):
        m = pattern.search(reply)
        if m:
            found.add(m.group(1).upper())
    for m in _NAMED.finditer(reply):
        found.add(m.group(1).upper())
    for m in _PAIR.finditer(reply):
        found.update(g.upper() for g in m.groups())
    letters = {LETTERS.index(x) for x in found if LETTERS.index(x) < n}
    if letters:
        return letters.pop() if len(letters) == 1 else None
    words = _words(reply)
    options = [_words(c) for c in choices]
    hits = [i for i, o in enumerate(options) if _contains(words, o)]
    # "tone" inside "low tone": the longer matching option is what the reply says.
    hits = [i for i in hits if not any(j != i and options[j] != options[i]
                                       and _contains(options[j], options[i]) for j in hits)]
    return hits[0] if len(hits) == 1 else None


class AQAScores(dict):
    """The scores (name -> float) plus ``confusion``: question type (and ``all``) -> counts
    (letters, letters + 1) of right letter x chosen letter, the last column replies naming none."""

    def __init__(self, scores: dict[str, float], confusion: dict[str, Tensor]) -> None:
        super().__init__(scores)
        self.confusion = confusion


class AQAAccuracy(Metric):
    """Shuffle-robust multiple-choice accuracy over a fixed set of items (any DDP layout).

    The model answers each item under ``rotations`` rotations (:func:`rotations`); every reply
    goes to :meth:`update`. The only state is a count tensor (items, rotations, letters + 1):
    how often each (item, rotation) reply chose each letter (or none), summed over ranks, so
    torchmetrics' DDP sync is exact; a reply that a DistributedSampler's padding repeats on
    another rank adds to the same cell and chooses the same letter.

    A torchmetrics Metric and not plain functions: the parsing runs where the replies are and
    only integer counts cross ranks (strings cannot go through torchmetrics' sync);
    :func:`aqa_scores` is the plain-function entry for a finished list of replies.

    Args:
        items: the items (mappings or objects: ``id``, ``question_type``, ``choices``,
            ``answer``) as written, i.e. rotation 0.
        rotations: rotations per item (``k``), at most the smallest number of options.

    Raises:
        ValueError: repeated ids, an answer that is not one of its choices, or ``rotations``
            out of range.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, items: Iterable[Any], rotations: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        items = list(items)
        if not items:
            raise ValueError("AQAAccuracy: items is empty; pass the items the replies answer.")
        self.ids = [str(_field(it, "id")) for it in items]
        self._index = {item_id: i for i, item_id in enumerate(self.ids)}
        if len(self._index) != len(self.ids):
            raise ValueError("AQAAccuracy: item ids repeat; every item needs its own id.")
        self.choices = [list(_field(it, "choices")) for it in items]
        answers = [answer_index(it) for it in items]
        fewest = min(len(c) for c in self.choices)
        if not 1 <= rotations <= fewest:
            raise ValueError(f"AQAAccuracy: rotations ({rotations}) must be in 1..{fewest} "
                             f"(the fewest options of an item), so no rotation repeats another.")
        self.rotations = rotations
        self.letters = max(len(c) for c in self.choices)
        self.types = sorted({str(_field(it, "question_type")) for it in items})
        type_of = [self.types.index(str(_field(it, "question_type"))) for it in items]
        n = torch.tensor([len(c) for c in self.choices])
        # (items, rotations): the right letter of each variant
        gold = (torch.tensor(answers)[:, None] + torch.arange(rotations)[None, :]) % n[:, None]
        self.register_buffer("gold", gold, persistent=False)
        self.register_buffer("type_of", torch.tensor(type_of), persistent=False)
        self.add_state("votes", default=torch.zeros(len(items), rotations, self.letters + 1,
                                                    dtype=torch.long), dist_reduce_fx="sum")

    def update(self, ids: Sequence[str], rotations: Sequence[int] | Tensor,
               replies: Sequence[str], answers: Sequence[str]) -> None:
        """Add replies: for each, the item's id, the rotation it was asked under, the model's
        text, and that variant's answer as the model side has it (its letter, ``(C) text``
        or the option text: checked against this metric's own rotation, so the two sides
        cannot disagree silently).

        Raises:
            ValueError: lengths differ, an unknown id, a rotation out of range, or an answer
                that is not this rotation's answer.
        """
        rotations = rotations.tolist() if isinstance(rotations, Tensor) else list(rotations)
        if not len(ids) == len(rotations) == len(replies) == len(answers):
            raise ValueError(f"AQAAccuracy.update: ids ({len(ids)}), rotations "
                             f"({len(rotations)}), replies ({len(replies)}) and answers "
                             f"({len(answers)}) must have one entry per reply.")
        for item_id, r, reply, answer in zip(ids, rotations, replies, answers):
            i = self._index.get(str(item_id))
            if i is None:
                raise ValueError(f"AQAAccuracy.update: item id {item_id!r} is not one of the "
                                 f"{len(self.ids)} items this metric was built with.")
            if not 0 <= int(r) < self.rotations:
                raise ValueError(f"AQAAccuracy.update: rotation ({r}) of item {item_id!r} must "
                                 f"be in 0..{self.rotations - 1}.")
            choices = self.choices[i]
            shown = [choices[(j - int(r)) % len(choices)] for j in range(len(choices))]
            gold = int(self.gold[i, int(r)])
            if parse_choice(answer, shown) != gold:
                raise ValueError(f"AQAAccuracy.update: item {item_id!r} rotation {r}: the answer "
                                 f"given ({answer!r}) is not ({LETTERS[gold]}) {shown[gold]!r}; "
                                 f"make the variants with mmtf.metrics.aqa.rotate_item.")
            chosen = parse_choice(reply, shown)
            self.votes[i, int(r), self.letters if chosen is None else chosen] += 1

    def compute(self) -> dict[str, float]:
        """The scores over everything accumulated (on every rank, after torchmetrics' sync).

        Rates whose denominator is empty (e.g. ``strict_accuracy`` before any item has all its
        rotations) are NaN.

        Raises:
            ValueError: no reply was accumulated.
        """
        seen, chosen, right = self._cells()
        complete = seen.all(-1)                       # (items,)
        scores: dict[str, float] = {}
        for prefix, rows in self._groups():
            s, r, c = seen[rows], right[rows], complete[rows]
            scores[f"{prefix}accuracy"] = _rate(r[:, 0].sum(), s[:, 0].sum())
            scores[f"{prefix}mean_accuracy"] = _rate(r.sum(), s.sum())
            scores[f"{prefix}strict_accuracy"] = _rate((r.all(-1) & c).sum(), c.sum())
            scores[f"{prefix}unparsed"] = _rate((s & (chosen[rows] == self.letters)).sum(),
                                                s.sum())
            scores[f"{prefix}items"] = float(c.sum())
        return scores

    def confusion(self) -> dict[str, Tensor]:
        """Per question type (and ``all``): counts (letters, letters + 1) of right letter x
        chosen letter over the scored replies, the last column replies naming none; collective
        under DDP like :meth:`compute` (call it on every rank)."""
        with self.sync_context():
            seen, chosen, _ = self._cells()
            width = self.letters + 1
            out = {}
            for prefix, rows in self._groups():
                flat = (self.gold[rows] * width + chosen[rows])[seen[rows]]
                out[prefix.rstrip("/") or "all"] = torch.bincount(
                    flat, minlength=self.letters * width).view(self.letters, width).cpu()
        return out

    def _cells(self) -> tuple[Tensor, Tensor, Tensor]:
        """Per (item, rotation): replied at all, the letter chosen (``letters``: none), right."""
        votes = self.votes
        seen = votes.sum(-1) > 0                      # (items, rotations)
        if not seen.any():
            raise ValueError("AQAAccuracy: no replies were accumulated; call update() first.")
        chosen = votes.argmax(-1)                     # (items, rotations)
        return seen, chosen, seen & (chosen == self.gold)

    def _groups(self) -> list[tuple[str, Tensor]]:
        """(score name prefix, item mask): all items, then each question type."""
        every = torch.ones(len(self.ids), dtype=torch.bool, device=self.type_of.device)
        return [("", every)] + [(f"{t}/", self.type_of == k) for k, t in enumerate(self.types)]


def _rate(num: Tensor, den: Tensor) -> float:
    return float(num) / float(den) if int(den) else float("nan")


def aqa_scores(items: Iterable[Any], replies: Iterable[tuple[str, int, str]],
               rotations: int = 4) -> AQAScores:
    """Score finished replies: ``(item id, rotation, reply text)`` triples for ``items`` (as
    written); the plain-function face of :class:`AQAAccuracy`."""
    items = list(items)
    metric = AQAAccuracy(items, rotations=rotations)
    variants = {(str(_field(it, "id")), r): rotate_item(it, r)
                for it in items for r in range(rotations)}
    ids, rots, texts, answers = [], [], [], []
    for item_id, r, text in replies:
        variant = variants.get((str(item_id), int(r)))
        ids.append(item_id)
        rots.append(r)
        texts.append(text)
        answers.append(variant["messages"][1]["content"] if variant else "")
    metric.update(ids, rots, texts, answers)
    return AQAScores(metric.compute(), metric.confusion())


def confusion_table(confusion: Mapping[str, Tensor]) -> str:
    """The confusion counts as text: per question type, right letter (rows) x chosen letter
    (columns, then ``none``), with each column's share of the replies (the letter bias)."""
    lines = []
    for name, table in confusion.items():
        k = table.shape[0]
        width = len(name) + 18                    # the label column
        lines.append(f"{name}: right \\ chosen".ljust(width)
                     + " ".join(f"{h:>5}" for h in [*LETTERS[:k], "none"]))
        for g in range(k):
            lines.append(f"{LETTERS[g]:>{width - 1}} " + " ".join(f"{int(v):>5}" for v in table[g]))
        total = max(int(table.sum()), 1)
        lines.append(f"{'share':>{width - 1}} "
                     + " ".join(f"{float(v) / total:>5.2f}" for v in table.sum(0)))
    return "\n".join(lines)
