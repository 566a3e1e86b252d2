"""The words the COCO-style metrics compare: a pure-Python stand-in for pycocoevalcap's Java
``PTBTokenizer -preserveLines -lowerCase`` plus its punctuation filter (the model's tokenizers
are :mod:`mmtf.text`).

:func:`ptb_words` lower-cases, maps curly quotes to ASCII, splits clitics as PTB does (``dog 's``,
``do n't``, ``can not``, ``gon na``), keeps inner hyphens, dots, apostrophes, slashes and the
final dot of acronyms and ``_ABBREVIATIONS``, makes every other character a token and drops
punctuation-only tokens (symbols such as ``& $ %`` stay).

Known differences from Java (none in plain lower-case captions): brackets are dropped (PTB's
``-lrb-`` survives pycocoevalcap's filter); ``?``/``!`` inside a word splits it; PTB's full
abbreviation list, rare clitics (``'tis``) and a leading minus are not reproduced. A test
compares both tokenizers when Java is installed."""

from __future__ import annotations

import re

_ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "inc", "ltd", "co",
                  "mt", "ft")
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\n": " "})
_SPLIT_WORDS = re.compile(r"\b(?:(can)(not)|(gon|wan)(na)|(got)(ta)|(lem|gim)(me))\b")
_CLITIC = re.compile(r"(\w)('s|'re|'ve|'ll|'d|'m|n't)\b")
_TOKEN = re.compile(
    r"""
      n't | '(?:s|re|ve|ll|d|m)\b                       # clitics, split off beforehand
    | \b[^\W\d_](?:\.[^\W\d_])+\.                       # acronyms keep the final dot: u.s.
    | \b(?:""" + "|".join(_ABBREVIATIONS) + r""")\.(?!\w)  # abbreviations: mr. st.
    | \d+(?:[.,:/]\d+)+                                 # numbers: 3.5 1,000 10:30 3/4
    | [#@]?\w+(?:[-'./]\w+)*                            # words with inner - ' . /
    | \S                                                # anything else, one character
    """,
    re.VERBOSE,
)
PUNCTUATION_CHARS = frozenset(".,?!:;-'\"`()[]{}\u2026\u2013\u2014\u00ab\u00bb")


def ptb_words(text: str) -> list[str]:
    """Tokens of one caption, as the COCO evaluation's PTB step would give them: lower-cased,
    without punctuation (``"A dog's bone."`` -> ``["a", "dog", "'s", "bone"]``)."""
    text = text.lower().translate(_QUOTES)
    text = _SPLIT_WORDS.sub(lambda m: " ".join(g for g in m.groups() if g), text)
    text = _CLITIC.sub(r"\1 \2", text)
    return [t for t in _TOKEN.findall(text) if not set(t) <= PUNCTUATION_CHARS]
