"""Text normalizers applied before word/character error rates: Whisper's English and basic rules.

A WER is only comparable with Whisper's published numbers under the same normalisation. By name
(``model.wer_normalizer``):

* ``whisper_english``: Whisper's ``EnglishTextNormalizer``: lower case; bracketed spans and
  fillers removed; contractions and titles expanded; spelled-out numbers to digits; British
  spellings to American (``whisper_english_spelling.json``); symbols and diacritics removed.
* ``whisper_basic``: Whisper's ``BasicTextNormalizer``, for any language: lower case, bracketed
  spans removed, marks, symbols and punctuation to spaces (diacritics kept).
* ``none``: the text as it is.

Written from openai/whisper ``whisper/normalizers`` (MIT) and checked equal to transformers'
copies (tests/unit/text/test_normalize.py). Why: docs/design/asr-normalizers.md.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from fractions import Fraction
from functools import cache
from importlib import resources

from mmtf.errors import ConfigError

NORMALIZERS: tuple[str, ...] = ("whisper_english", "whisper_basic", "none")
SPELLING_FILE = "whisper_english_spelling.json"

# Letters NFKD does not split into a base letter + a combining mark.
_LETTER_FOLDS = {"œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "ß": "ss",
                 "ẞ": "SS", "đ": "d", "Đ": "D", "ð": "d", "Ð": "D", "þ": "th", "Þ": "th",
                 "ł": "l", "Ł": "L"}
_BRACKETED = re.compile(r"[<\[][^>\]]*[>\]]")
_PARENTHESISED = re.compile(r"\(([^)]+?)\)")
_SPACES = re.compile(r"\s+")
_DECIMAL = re.compile(r"^\d+(\.\d+)?$")


def _is_mark_symbol_or_punct(char: str) -> bool:
    return unicodedata.category(char)[0] in "MSP"


def strip_symbols(text: str, *, diacritics: bool = False, keep: str = "") -> str:
    """Every mark, symbol and punctuation character replaced by a space.

    Args:
        text: any text.
        diacritics: also drop diacritics (NFKD, combining marks removed, ``æ`` -> ``ae``);
            False keeps them (NFKC).
        keep: characters left as they are (the English rules keep ``.%$¢€£`` for numbers).
    """
    if not diacritics:
        return "".join(" " if _is_mark_symbol_or_punct(c) else c
                       for c in unicodedata.normalize("NFKC", text))
    out = []
    for c in unicodedata.normalize("NFKD", text):
        if c in keep:
            out.append(c)
        elif c in _LETTER_FOLDS:
            out.append(_LETTER_FOLDS[c])
        elif unicodedata.category(c) == "Mn":
            continue
        else:
            out.append(" " if _is_mark_symbol_or_punct(c) else c)
    return "".join(out)


def _drop_spans(text: str) -> str:
    return _PARENTHESISED.sub("", _BRACKETED.sub("", text))


def basic_normalize(text: str, *, remove_diacritics: bool = False) -> str:
    """Whisper's basic (language-independent) normalisation; see the module docstring."""
    text = strip_symbols(_drop_spans(text.lower()), diacritics=remove_diacritics).lower()
    return _SPACES.sub(" ", text)


# ---------------------------------------------------------------------------- numbers
_ONES = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ["hundred", "thousand", "million", "billion", "trillion", "quadrillion", "quintillion", "sextillion", "septillion", "octillion", "nonillion", "decillion"]


class _Vocabulary:
    """The number words and what each means: value, and the suffix it leaves (1960s, 21st)."""

    def __init__(self) -> None:
        self.zeros = {"o", "oh", "zero"}
        self.ones = {w: i for i, w in enumerate(_ONES, start=1)}
        self.tens = {w: 10 * i for i, w in enumerate(_TENS, start=2)}
        self.scales = {w: 100 if i == 0 else 1000 ** i for i, w in enumerate(_SCALES)}
        ordinal_ones = {"first": 1, "second": 2, "third": 3, "fifth": 5, "twelfth": 12}
        for w, v in self.ones.items():
            if v not in ordinal_ones.values():
                ordinal_ones[w + ("h" if w.endswith("t") else "th")] = v
        # (value, suffix); the plurals and ordinals of ones, tens and scales
        self.ones_suffixed = {("sixes" if w == "six" else w + "s"): (v, "s")
                              for w, v in self.ones.items()}
        self.ones_suffixed.update({"zeroth": (0, "th")})
        self.ones_suffixed.update({w: (v, _ordinal_suffix(w)) for w, v in ordinal_ones.items()})
        self.tens_suffixed = {w.replace("y", "ies"): (v, "s") for w, v in self.tens.items()}
        self.tens_suffixed.update({w.replace("y", "ieth"): (v, "th")
                                   for w, v in self.tens.items()})
        self.scales_suffixed = {w + "s": (v, "s") for w, v in self.scales.items()}
        self.scales_suffixed.update({w + "th": (v, "th") for w, v in self.scales.items()})
        self.signs = {"minus": "-", "negative": "-", "plus": "+", "positive": "+"}
        self.currencies = {"pound": "£", "pounds": "£", "euro": "€", "euros": "€",
                           "dollar": "$", "dollars": "$", "cent": "¢", "cents": "¢"}
        self.prefix_symbols = set(self.signs.values()) | set(self.currencies.values())
        self.percent = {"percent"}            # and "per cent"
        self.specials = {"and", "double", "triple", "point"}
        self.decimals = set(self.ones) | set(self.tens) | self.zeros
        self.all = (self.zeros | set(self.ones) | set(self.ones_suffixed) | set(self.tens)
                    | set(self.tens_suffixed) | set(self.scales) | set(self.scales_suffixed)
                    | set(self.signs) | set(self.currencies) | self.percent | {"per"}
                    | self.specials)


def _ordinal_suffix(word: str) -> str:
    return {"first": "st", "second": "nd", "third": "rd"}.get(word, "th")


def _fraction(text: object) -> Fraction | None:
    try:
        return Fraction(str(text))
    except ValueError:
        return None


class _NumberReader:
    """One left-to-right pass over the words, collecting a number and emitting words.

    ``value`` is the number being read: an int while it is arithmetic (twenty one -> 21, two
    hundred -> 200), a digit string once digits are read one by one (one oh one -> "101", two
    point five -> "2.5"); ``prefix`` is a sign or currency symbol put before it when emitted.
    """

    def __init__(self, vocab: _Vocabulary, words: list[str]) -> None:
        self.v, self.words = vocab, words
        self.value: int | str | None = None
        self.prefix: str | None = None

    def emit(self, result: object) -> str:
        text = str(result) if self.prefix is None else self.prefix + str(result)
        self.value, self.prefix = None, None
        return text

    def flush(self) -> Iterator[str]:
        if self.value is not None:
            yield self.emit(self.value)

    def run(self) -> Iterator[str]:
        words, skip = self.words, False
        for i, word in enumerate(words):
            if skip:
                skip = False
                continue
            prev = words[i - 1] if i else None
            nxt = words[i + 1] if i + 1 < len(words) else None
            out, skip = self.step(word, prev, nxt)
            yield from out
        yield from self.flush()

    def step(self, word: str, prev: str | None, nxt: str | None) -> tuple[list[str], bool]:
        """The words emitted at ``word``, and whether the next word was consumed too."""
        v = self.v
        nxt_numeric = nxt is not None and bool(_DECIMAL.match(nxt))
        signed = word[0] in v.prefix_symbols
        bare = word[1:] if signed else word
        if _DECIMAL.match(bare):
            return self.digits(word, bare, signed), False
        if word not in v.all:
            return [*self.flush(), self.emit(word)], False
        if word in v.zeros:
            self.value = f"{self.value or ''}0"
            return [], False
        if word in v.ones:
            self.value = self.join_ones(v.ones[word], prev)
            return [], False
        if word in v.ones_suffixed:
            number, suffix = v.ones_suffixed[word]
            joined = number if self.value is None else self.join_ones(number, prev)
            return [self.emit(f"{joined}{suffix}")], False
        if word in v.tens:
            self.value = self.join_tens(v.tens[word])
            return [], False
        if word in v.tens_suffixed:
            number, suffix = v.tens_suffixed[word]
            return [self.emit(f"{self.join_tens(number)}{suffix}")], False
        if word in v.scales:
            return self.scale(v.scales[word]), False
        if word in v.scales_suffixed:
            return self.scale_suffixed(*v.scales_suffixed[word]), False
        if word in v.signs:
            out = list(self.flush())
            if nxt in v.all or nxt_numeric:
                self.prefix = v.signs[word]
            else:
                out.append(self.emit(word))
            return out, False
        if word in v.currencies:
            if self.value is None:
                return [self.emit(word)], False
            self.prefix = v.currencies[word]
            return [self.emit(self.value)], False
        if word in v.percent or word == "per":
            return self.percent(word, nxt)
        return self.special(word, prev, nxt, nxt_numeric)

    def digits(self, word: str, bare: str, signed: bool) -> list[str]:
        out: list[str] = []
        if self.value is not None:
            if isinstance(self.value, str) and self.value.endswith("."):
                self.value = self.value + word      # decimals, IP address parts
                return out
            out.append(self.emit(self.value))
        if signed:
            self.prefix = word[0]
        f = _fraction(bare)
        self.value = f.numerator if f.denominator == 1 else bare
        return out

    def join_ones(self, number: int, prev: str | None) -> int | str:
        value = self.value
        if value is None:
            return number
        if isinstance(value, str) or prev in self.v.ones:
            if prev in self.v.tens and number < 10:   # "twenty" then "one": 20 -> 21
                return str(value)[:-1] + str(number)
            return f"{value}{number}"
        place = 10 if number < 10 else 100
        return value + number if value % place == 0 else f"{value}{number}"

    def join_tens(self, number: int) -> int | str:
        value = self.value
        if value is None:
            return number
        if isinstance(value, str) or value % 100:
            return f"{value}{number}"
        return value + number

    def scale(self, multiplier: int) -> list[str]:
        value = self.value
        if value is None:
            self.value = multiplier
            return []
        if isinstance(value, str) or value == 0:
            f = _fraction(value)
            if f is not None and (f * multiplier).denominator == 1:
                self.value = (f * multiplier).numerator
                return []
            out = [self.emit(value)]
            self.value = multiplier
            return out
        self.value = value // 1000 * 1000 + value % 1000 * multiplier
        return []

    def scale_suffixed(self, multiplier: int, suffix: str) -> list[str]:
        value = self.value
        if value is None:
            return [self.emit(f"{multiplier}{suffix}")]
        if isinstance(value, str):
            f = _fraction(value)
            if f is not None and (f * multiplier).denominator == 1:
                return [self.emit(f"{(f * multiplier).numerator}{suffix}")]
            return [self.emit(value), self.emit(f"{multiplier}{suffix}")]
        self.value = value // 1000 * 1000 + value % 1000 * multiplier
        return [self.emit(f"{self.value}{suffix}")]

    def percent(self, word: str, nxt: str | None) -> tuple[list[str], bool]:
        if self.value is None:
            return [self.emit(word)], False
        if word == "percent":
            return [self.emit(f"{self.value}%")], False
        if nxt == "cent":                           # "per cent"
            return [self.emit(f"{self.value}%")], True
        return [self.emit(self.value), self.emit(word)], False

    def special(self, word: str, prev: str | None, nxt: str | None,
                nxt_numeric: bool) -> tuple[list[str], bool]:
        v = self.v
        if nxt not in v.all and not nxt_numeric:   # only before a word that can be a number
            return [*self.flush(), self.emit(word)], False
        if word == "and":
            if prev in v.scales:                   # "two hundred and five": 205
                return [], False
            return [*self.flush(), self.emit(word)], False
        if word in ("double", "triple"):
            if nxt in v.ones or nxt in v.zeros:
                times = 2 if word == "double" else 3
                self.value = f"{self.value or ''}{str(v.ones.get(nxt, 0)) * times}"
                return [], True
            return [*self.flush(), self.emit(word)], False
        # "point": a decimal point when digits follow
        if nxt in v.decimals or nxt_numeric:
            self.value = f"{self.value or ''}."
        return [], False


_HALF = re.compile(r"\band\s+a\s+half\b")
_CENTS = re.compile(r"([€£$])([0-9]+) (?:and )?¢([0-9]{1,2})\b")
_ONLY_CENTS = re.compile(r"[€£$]0.([0-9]{1,2})\b")


class EnglishNumbers:
    """Spelled-out English numbers to digits (Whisper's rules; see the module docstring)."""

    def __init__(self) -> None:
        self.vocab = _Vocabulary()

    def _halves(self, text: str) -> str:
        # "<number> and a half" -> "<number> point five"
        parts = _HALF.split(text)
        out = []
        for i, part in enumerate(parts):
            if not part.strip():
                continue
            out.append(part)
            if i < len(parts) - 1:
                last = part.rsplit(maxsplit=2)[-1]
                numeric = last in self.vocab.decimals or last in self.vocab.scales
                out.append("point five" if numeric else "and a half")
        return " ".join(out)

    def __call__(self, text: str) -> str:
        text = self._halves(text)
        text = re.sub(r"([a-z])([0-9])", r"\1 \2", text)     # split 5km, km5
        text = re.sub(r"([0-9])([a-z])", r"\1 \2", text)
        text = re.sub(r"([0-9])\s+(st|nd|rd|th|s)\b", r"\1\2", text)   # keep 21st, 1960s
        text = " ".join(_NumberReader(self.vocab, text.split()).run())

        def cents(m: re.Match) -> str:
            return f"{m.group(1)}{m.group(2)}.{int(m.group(3)):02d}"

        text = _CENTS.sub(cents, text)                         # "$2 and ¢7" -> "$2.07"
        text = _ONLY_CENTS.sub(lambda m: f"¢{int(m.group(1))}", text)
        return re.sub(r"\b1(s?)\b", r"one\1", text)          # "one(s)" reads better than "1(s)"


# ---------------------------------------------------------------------------- English text
_FILLERS = re.compile(r"\b(hmm|mm|mhm|mmm|uh|um)\b")
_TITLES = {"mr": "mister", "mrs": "missus", "st": "saint", "dr": "doctor", "prof": "professor",
           "capt": "captain", "gov": "governor", "ald": "alderman", "gen": "general",
           "sen": "senator", "rep": "representative", "pres": "president", "rev": "reverend",
           "hon": "honorable", "asst": "assistant", "assoc": "associate", "lt": "lieutenant",
           "col": "colonel", "jr": "junior", "sr": "senior", "esq": "esquire"}
# Applied in this order: whole-word contractions, titles, perfect tenses, then word endings.
_EXPANSIONS: list[tuple[str, str]] = [
    *((rf"\b{a}\b", b) for a, b in (
        ("won't", "will not"), ("can't", "can not"), ("let's", "let us"), ("ain't", "aint"),
        ("y'all", "you all"), ("wanna", "want to"), ("gotta", "got to"), ("gonna", "going to"),
        ("i'ma", "i am going to"), ("imma", "i am going to"), ("woulda", "would have"),
        ("coulda", "could have"), ("shoulda", "should have"), ("ma'am", "madam"))),
    *((rf"\b{a}\b", f"{b} ") for a, b in _TITLES.items()),
    *((rf"'{a}\b", f" {b}") for a, b in (
        ("d been", "had been"), ("s been", "has been"), ("d gone", "had gone"),
        ("s gone", "has gone"), ("d done", "had done"), ("s got", "has got"))),
    (r"n't\b", " not"), (r"'re\b", " are"), (r"'s\b", " is"), (r"'d\b", " would"),
    (r"'ll\b", " will"), (r"'t\b", " not"), (r"'ve\b", " have"), (r"'m\b", " am"),
]
_EXPANSION_RES = [(re.compile(a), b) for a, b in _EXPANSIONS]


@cache
def english_spelling() -> dict[str, str]:
    """Whisper's British -> American spelling map (``english.json``), shipped as package data."""
    text = resources.files("mmtf.text").joinpath(SPELLING_FILE).read_text(encoding="utf-8")
    return json.loads(text)


class EnglishNormalizer:
    """Whisper's English normalisation (see the module docstring).

    Args:
        spelling: British -> American word map; default Whisper's (:func:`english_spelling`).
    """

    def __init__(self, spelling: dict[str, str] | None = None) -> None:
        self.spelling = english_spelling() if spelling is None else spelling
        self.numbers = EnglishNumbers()

    def __call__(self, text: str) -> str:
        text = _FILLERS.sub("", _drop_spans(text.lower()))
        text = re.sub(r"\s+'", "'", text)                    # "don 't" -> "don't"
        for pattern, replacement in _EXPANSION_RES:
            text = pattern.sub(replacement, text)
        text = re.sub(r"(\d),(\d)", r"\1\2", text)            # 1,000 -> 1000
        text = re.sub(r"\.([^0-9]|$)", r" \1", text)          # periods not in a number
        text = strip_symbols(text, diacritics=True, keep=".%$¢€£")
        text = self.numbers(text)
        text = " ".join(self.spelling.get(w, w) for w in text.split())
        text = re.sub(r"[.$¢€£]([^0-9])", r" \1", text)       # symbols left without a number
        text = re.sub(r"([^0-9])%", r"\1 ", text)
        return _SPACES.sub(" ", text)


def _identity(text: str) -> str:
    return text


@cache
def get_normalizer(name: str) -> Callable[[str], str]:
    """The normalizer called ``name`` (one of :data:`NORMALIZERS`).

    Raises:
        ConfigError: an unknown name; the message lists the choices.
    """
    if name == "whisper_english":
        return EnglishNormalizer()
    if name == "whisper_basic":
        return basic_normalize
    if name == "none":
        return _identity
    raise ConfigError(f"model.wer_normalizer ({name!r}) must be one of {list(NORMALIZERS)}: "
                      f"whisper_english (English: numbers, spellings, contractions), "
                      f"whisper_basic (any language: symbols removed) or none.")
