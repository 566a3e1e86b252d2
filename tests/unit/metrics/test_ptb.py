"""ptb_words: hand-written expectations, and agreement with the Java PTBTokenizer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pycocoevalcap.tokenizer import ptbtokenizer

from mmtf.metrics import ptb_words
from tests.unit.metrics.fixtures import CANDIDATES, REFERENCES


@pytest.mark.parametrize("text, tokens", [
    ("A dog barks loudly.", "a dog barks loudly"),
    ("", ""),
    ("  ...  ", ""),
    ("A dog's bone, and the cat's toy!", "a dog 's bone and the cat 's toy"),
    ("Don't stop; it isn't over?", "do n't stop it is n't over"),
    ("I cannot go, we're gonna win", "i can not go we 're gon na win"),
    ("A man (wearing a hat) rides -- fast", "a man wearing a hat rides fast"),
    ('"Quoted" and \u201ccurly\u201d quotes \u2026 the dog\u2019s', "quoted and curly quotes the dog 's"),
    ("A black-and-white photo, 1,000 boats at 3.5 mph at 10:30",
     "a black-and-white photo 1,000 boats at 3.5 mph at 10:30"),
    ("U.S. soldiers at 5 p.m. with Mr. Smith", "u.s. soldiers at 5 p.m. with mr. smith"),
    ("Tom & Jerry paid $5 for 50% off", "tom & jerry paid $ 5 for 50 % off"),
    ("line one\nline two", "line one line two"),
    ("Caf\u00e9 na\u00efve o'clock and/or", "caf\u00e9 na\u00efve o'clock and/or"),
])
def test_hand_cases(text, tokens):
    assert ptb_words(text) == tokens.split()


PTB_JAR = Path(ptbtokenizer.__file__).with_name(ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
EXTRA = [
    "A dog's bone, and the cat's toy.", "Don't stop; it isn't over!",
    "\"Quoted\" text and 'single' quotes -- dash - hyphen", "people   playing  soccer",
    "It's a dog's life, can't won't shouldn't", "the dog\u2019s \u201ccurly\u201d \u2018quotes\u2019",
    "I cannot go, gonna wanna gotta", "A black-and-white photo of 1,000 boats at 3.5 mph.",
    "a u.s. flag.", "walking at 5 p.m. today", "Tom & Jerry paid $5 for 50% off",
]


@pytest.mark.skipif(shutil.which("java") is None or not PTB_JAR.is_file(),
                    reason="the Java reference tokenizer needs `java` and pycocoevalcap's jar")
def test_matches_java_ptb_tokenizer(tmp_path):
    """Same tokens as pycocoevalcap's PTBTokenizer step (Java, then its punctuation filter)."""
    captions = CANDIDATES + [r for refs in REFERENCES for r in refs] + EXTRA
    src = tmp_path / "captions.txt"
    src.write_text("\n".join(c.replace("\n", " ") for c in captions), encoding="utf-8")
    cmd = [shutil.which("java"), "-cp", str(PTB_JAR), "edu.stanford.nlp.process.PTBTokenizer",
           "-preserveLines", "-lowerCase", str(src)]
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=120).stdout.decode("utf-8")
    lines = out.split("\n")
    assert len(lines) >= len(captions)
    for caption, line in zip(captions, lines):
        expected = [w for w in line.rstrip().split(" ") if w and w not in ptbtokenizer.PUNCTUATIONS]
        assert ptb_words(caption) == expected, caption
