"""Whisper's normalizers: Whisper's own test cases, and equality with transformers' copies on
those and on a corpus of tricky strings (plus random number-word sequences)."""

from __future__ import annotations

import json
import random

import pytest
from whisper_normalizer.basic import BasicTextNormalizer
from whisper_normalizer.english import EnglishNumberNormalizer as EnglishNumbers
from whisper_normalizer.english import EnglishSpellingNormalizer

from mmtf.errors import ConfigError
from mmtf.text.normalize import NORMALIZERS, get_normalizer

whisper_hf = pytest.importorskip("transformers.models.whisper.english_normalizer")

# Whisper's tests/test_normalizer.py (openai/whisper): input -> expected.
NUMBERS = {
    "two": "2", "thirty one": "31", "five twenty four": "524", "nineteen ninety nine": "1999",
    "twenty nineteen": "2019", "two point five million": "2500000",
    "four point two billions": "4200000000s", "200 thousand": "200000",
    "200 thousand dollars": "$200000", "$20 million": "$20000000", "€52.4 million": "€52400000",
    "£77 thousands": "£77000s", "two double o eight": "2008",
    "three thousand twenty nine": "3029", "forty three thousand two hundred sixty": "43260",
    "forty three thousand two hundred and sixty": "43260", "nineteen fifties": "1950s",
    "thirty first": "31st", "thirty three thousand and three hundred and thirty third": "33333rd",
    "three billion": "3000000000", "millions": "1000000s",
    "july third twenty twenty": "july 3rd 2020",
    "august twenty sixth twenty twenty one": "august 26th 2021", "3 14": "3 14",
    "3.14": "3.14", "3 point 2": "3.2", "3 point 14": "3.14", "fourteen point 4": "14.4",
    "two point two five dollars": "$2.25", "two hundred million dollars": "$200000000",
    "$20.1 million": "$20100000", "ninety percent": "90%", "seventy six per cent": "76%",
    "double oh seven": "007", "double zero seven": "007", "nine one one": "911",
    "nine double one": "911", "one triple oh one": "10001", "two thousandth": "2000th",
    "thirty two thousandth": "32000th", "minus 500": "-500",
    "positive twenty thousand": "+20000", "two dollars and seventy cents": "$2.70",
    "3 cents": "¢3", "$0.36": "¢36", "three euros and sixty five cents": "€3.65",
    "three and a half million": "3500000", "forty eight and a half dollars": "$48.5",
    "b747": "b 747", "10 th": "10th", "10th": "10th",
}
TEXT = {
    "Let's": "let us", "he's like": "he is like", "she's been like": "she has been like",
    "10km": "10 km", "10mm": "10 mm", "RC232": "rc 232",
    "Mr. Park visited Assoc. Prof. Kim Jr.": "mister park visited associate professor kim junior",
    "mobilisation": "mobilization", "cancelation": "cancellation",
}
# Numbers, currencies, British spellings, contractions, ordinals, fractions, hyphens, unicode.
TRICKY = [
    "I won't pay $1,000,000.50 for that!", "It's 3:45 p.m. on the 21st of June, 1999.",
    "The colour of the theatre's centre was grey-ish.", "We'll've gone; they'd done it; you're OK.",
    "one hundred and one dalmatians", "nineteen eighty-four", "twenty-first century",
    "half past two and a half", "1/2 cup or 3/4 of it", "Two-thirds of £5.5 billion",
    "Ms. Smith, Dr. Who & St. John's Wood", "ain't y'all gonna wanna", "I'ma go, imma stay",
    "[MUSIC] (laughs) <unk> hello", "uh um hmm mhm so", "naïve café résumé Ærøskøbing straße",
    "Ünïcödé “quotes” — dashes… and ½ ¼", "the 1960s and the '70s", "5km/h, 10°C, 50%",
    "point five", "and a half", "oh oh seven", "double", "triple one two", "minus", "plus five",
    "per cent", "zero point zero one", "a million and one", "thousands of thousands",
    "first second third fourth fifth ninth twelfth twentieth hundredth", "ones and twos",
    "one", "sixes and sevens", "192.168.0.1", "192 point 168 point 0 point 1",
    "$5 and 7 cents", "five dollars seven", "€ 20", "20 €", "it costs 3$", "£0.5",
    "I'd been there; she's got it; he's gone", "can't won't shouldn't ma'am",
    "Gen. Lt. Col. Sr. Esq. Hon. Rev.", "mr mrs st", "tonnes of colour",
    "", "   ", "...", "a.b.c.", "e.g. i.e.", "x-ray T-shirt", "non-stop 24/7",
    "twenty twenty-one", "nineteen hundred", "two thousand and twenty two",
    "eleven hundred", "ninety nine point nine nine percent", "negative zero",
    "100th anniversary", "3rd 2nd 1st", "1st of", "7 8 9", "seven eight nine", "ten ten",
    "fifty fifty", "the twenties", "the nineteen twenties", "hundreds of millions",
    "one oh one", "o", "oh no", "zero", "a 2 b", "C3PO and R2D2", "MP3 MP4 H264",
]


def english_spelling() -> dict[str, str]:
    return EnglishSpellingNormalizer().mapping


def basic_normalize(text: str, *, remove_diacritics: bool = False) -> str:
    return (get_normalizer("whisper_basic")(text) if not remove_diacritics
            else BasicTextNormalizer(remove_diacritics=True)(text))


def hf_english():
    return whisper_hf.EnglishTextNormalizer(english_spelling())


@pytest.mark.parametrize(("text", "expected"), NUMBERS.items())
def test_numbers_as_whisper_tests(text, expected):
    assert EnglishNumbers()(text) == expected
    assert get_normalizer("whisper_english")(text) == expected


@pytest.mark.parametrize(("text", "expected"), TEXT.items())
def test_english_text_as_whisper_tests(text, expected):
    assert get_normalizer("whisper_english")(text) == expected


@pytest.mark.parametrize("text", [*NUMBERS, *TEXT, *TRICKY])
def test_english_equals_transformers(text):
    assert get_normalizer("whisper_english")(text) == hf_english()(text)
    assert EnglishNumbers()(text.lower()) == whisper_hf.EnglishNumberNormalizer()(text.lower())


@pytest.mark.parametrize("text", [*NUMBERS, *TEXT, *TRICKY])
def test_basic_equals_transformers(text):
    assert basic_normalize(text) == whisper_hf.BasicTextNormalizer()(text)
    assert (basic_normalize(text, remove_diacritics=True)
            == whisper_hf.BasicTextNormalizer(remove_diacritics=True)(text))


def test_random_number_word_sequences_equal_transformers():
    # The number reader is a state machine; random sequences of its words (and a few digits
    # and plain words) reach the branches the hand-written cases miss.
    vocab = sorted(EnglishNumbers().words) + ["5", "1.5", "$3", "-2", "20.", "cat", "a"]
    rng = random.Random(0)
    ours, theirs = get_normalizer("whisper_english"), hf_english()
    for _ in range(1000):
        text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 7)))
        assert ours(text) == theirs(text), text


def test_spelling_map_is_whispers():
    spelling = english_spelling()
    assert len(spelling) == 1739            # whisper/normalizers/english.json
    assert spelling["colour"] == "color" and spelling["mmm"] == "hmm"
    assert json.dumps(spelling)             # plain str -> str


def test_none_is_identity_and_unknown_name_is_named():
    assert get_normalizer("none")("Hello, World!") == "Hello, World!"
    assert set(NORMALIZERS) == {"whisper_english", "whisper_basic", "none"}
    with pytest.raises(ConfigError, match=r"wer_normalizer \('english'\).*whisper_english"):
        get_normalizer("english")
