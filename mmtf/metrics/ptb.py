"""The words the COCO-style metrics compare: a pure-Python stand-in for the PTB step (text
normalisation for scoring; the model's tokenizers are :mod:`mmtf.text`).

The COCO caption evaluation (pycocoevalcap) runs every caption through Stanford's Java
``PTBTokenizer -preserveLines -lowerCase`` and then drops the punctuation tokens
``'' ' `` ` . ? ! , : - -- ... ;``. :func:`ptb_words` reproduces that effect in Python:

* lower-case; curly quotes/apostrophes as their ASCII forms;
* clitics split off as PTB does: ``dog's -> dog 's``, ``don't -> do n't``, ``we'll -> we 'll``,
  and ``cannot gonna wanna gotta lemme gimme -> can not, gon na, ...``;
* words keep inner hyphens, dots, apostrophes and slashes (``black-and-white``, ``o'clock``,
  ``and/or``, ``3.5``, ``1,000``, ``10:30``); acronyms and common abbreviations keep their final
  dot (``u.s.``, ``p.m.``, ``mr.``, ``st.``);
* every other non-space character is its own token, and tokens made only of punctuation
  (``. , ? ! : ; - -- ... ' " `` ( ) [ ] { }`` and Unicode quotes, dashes and ellipses) are dropped.
  Symbols such as ``& $ % * #`` are kept as tokens, as PTB keeps them.

Known differences from the Java tokenizer (none arises in plain lower-case captions):

* brackets: PTB turns ``(`` into ``-lrb-``, which pycocoevalcap then *keeps* (its punctuation
  list is upper-case ``-LRB-`` but the tokens were lower-cased); here brackets are dropped;
* a ``?`` or ``!`` inside a word (``start?end``) splits the word here, PTB keeps one token;
* PTB's full abbreviation list is not reproduced; only acronyms (``e.g.``) and the list in
  ``_ABBREVIATIONS`` keep their dot, so e.g. ``no. 5`` gives ``no 5`` here, ``no. 5`` in PTB;
* ``'tis``, ``rock'n'roll`` and other rare clitics are not split here; leading-minus numbers
  (``-5``) lose their sign.
The test suite compares this tokenizer with the Java one on realistic captions when Java is
installed.
"""

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
    """Tokens of one caption, as the COCO evaluation's PTB step would give them.

    Args:
        text: a raw caption.

    Returns:
        Lower-cased tokens without punctuation, e.g. ``"A dog's bone."`` -> ``["a", "dog",
        "'s", "bone"]``.
    """
    text = text.lower().translate(_QUOTES)
    text = _SPLIT_WORDS.sub(lambda m: " ".join(g for g in m.groups() if g), text)
    text = _CLITIC.sub(r"\1 \2", text)
    return [t for t in _TOKEN.findall(text) if not set(t) <= PUNCTUATION_CHARS]
