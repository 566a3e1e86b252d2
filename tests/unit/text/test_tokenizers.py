"""Tokenizers: fixed specials, round trips, unknowns, truncation, save/load, error messages."""

from __future__ import annotations

import json
import pickle
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from mmtf.errors import UserError
from mmtf.text import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer

WORDS = [
    "a", "dog", "barks", "at", "the", "cat", "while", "rain", "falls", "on", "tin", "roof",
    "near", "busy", "road", "birds", "sing", "in", "tall", "trees", "and", "people", "talk",
]
CORPUS = [
    "A dog barks loudly at the cat.",
    "Rain falls on a tin roof, steadily.",
    "Birds sing in the tall trees!",
    "People talk quietly near the busy road.",
    "a car passes by; then a horn honks",
    "Water drips into a metal bucket?",
    "the wind blows through the leaves",
    "Someone's footsteps on a wooden floor",
] * 5
SPECIALS = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}


def random_captions(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.choices(WORDS, k=rng.randint(0, 12))
        text = " ".join(words)
        if rng.random() < 0.5 and text:
            text = text[0].upper() + text[1:] + rng.choice(".!?,")
        if rng.random() < 0.2:
            text += " ☃é\u00a0  Zq"  # unseen chars, a non-breaking space, odd spacing
        out.append(text)
    return out


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=120)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return CharTokenizer.train(CORPUS)


@pytest.fixture(params=["bpe", "char"])
def tok(request, bpe, char) -> Tokenizer:
    return {"bpe": bpe, "char": char}[request.param]


# ---------------------------------------------------------------- specials
def test_special_ids_fixed(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    for token, idx in SPECIALS.items():
        assert tok.token_to_id(token) == idx
        assert tok.id_to_token(idx) == token
    assert isinstance(tok.vocab_size, int) and len(tok) == tok.vocab_size


@pytest.mark.parametrize("corpus", [["zzz"], CORPUS, ["<pad> <unk> x"] * 3])
def test_bpe_specials_fixed_for_any_corpus(corpus):
    tok = BPETokenizer.train(corpus, vocab_size=30, min_frequency=1)
    assert [tok.id_to_token(i) for i in range(4)] == list(SPECIALS)


def test_special_text_in_input_is_not_a_special(tok):
    """Typing "<eos>" in a caption must not inject an end-of-sequence id."""
    ids = tok.encode("a <eos> b", add_special=False)
    assert tok.eos_id not in ids


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("text", [
    "a dog barks loudly at the cat.",
    "rain falls on a tin roof, steadily.",
    "birds sing; the wind blows!",
    "someone's footsteps on a wooden floor?",
    "the cat",
])
def test_round_trip_lowercase_with_punctuation(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == text


def test_round_trip_normalizes_case_and_whitespace(tok):
    assert tok.decode(tok.encode("  A Dog\tBarks \n LOUDLY.  ")) == "a dog barks loudly."
    assert tok.normalize("  A Dog\tBarks \n LOUDLY.  ") == "a dog barks loudly."


ALPHABET = sorted(set("".join(CORPUS).lower()))
_BPE = BPETokenizer.train(CORPUS, vocab_size=120)
_CHAR = CharTokenizer.train(CORPUS)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=ALPHABET + ["\t", "\n", "A", "B"], max_size=40))
def test_round_trip_property(text):
    """Any text over the training characters comes back as its normal form."""
    for tok in (_BPE, _CHAR):
        ids = tok.encode(text)
        assert tok.unk_id not in ids
        assert tok.decode(ids) == tok.normalize(text)


def test_lowercase_false_keeps_case():
    tok = BPETokenizer.train(CORPUS, vocab_size=120, lowercase=False)
    assert tok.decode(tok.encode("A dog barks.")) == "A dog barks."
    assert tok.encode("A dog") != tok.encode("a dog")
    ctok = CharTokenizer.train(CORPUS, lowercase=False)
    assert ctok.decode(ctok.encode("A dog")) == "A dog"


def test_bpe_punctuation_is_its_own_token(bpe):
    tokens = [bpe.id_to_token(i) for i in bpe.encode("the cat.", add_special=False)]
    assert tokens[-1] == "."
    assert all("." not in t for t in tokens[:-1])


def test_bpe_strip_punctuation():
    tok = BPETokenizer.train(CORPUS, vocab_size=120, strip_punctuation=True)
    assert tok.encode("a dog, barks! at the cat...") == tok.encode("a dog barks at the cat")
    assert tok.decode(tok.encode("Someone's roof, (steadily).")) == "someones roof steadily"
    assert all(c not in tok.id_to_token(i) for i in range(4, tok.vocab_size) for c in ".,!?;'")


def test_bpe_learns_frequent_words(bpe):
    # "the" occurs often enough to become one token, so BPE is shorter than characters.
    assert bpe.encode("the", add_special=False) == [bpe.token_to_id("▁the")]
    text = "the dog barks at the cat"
    assert len(bpe.encode(text)) < len(CharTokenizer.train(CORPUS).encode(text))


def test_encode_batch_matches_encode(tok):
    texts = random_captions(40)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, max_len=5) == [tok.encode(t, max_len=5) for t in texts]
    assert tok.decode_batch(tok.encode_batch(texts)) == [tok.decode(tok.encode(t)) for t in texts]


# ---------------------------------------------------------------- unknown characters
def test_char_unknown_maps_to_unk(char):
    ids = char.encode("a☃b", add_special=False)
    assert ids == [char.token_to_id("a"), 3, char.token_to_id("b")]
    assert char.decode(ids) == "ab"  # unk dropped when skipping specials
    assert char.decode(ids, skip_special=False) == "a<unk>b"


def test_bpe_unknown_maps_to_unk_per_character(bpe):
    """BPE with no byte fallback: an unseen character is one <unk>; decode drops it."""
    ids = bpe.encode("a ☃☃ dog", add_special=False)
    assert ids.count(bpe.unk_id) == 2
    assert bpe.decode(ids) == "a dog"  # unk dropped, the space it leaves collapsed
    assert "<unk>" in bpe.decode(ids, skip_special=False)


# ---------------------------------------------------------------- empty strings
def test_empty_strings(tok):
    assert tok.encode("") == [tok.bos_id, tok.eos_id]
    assert tok.encode("   \n") == [tok.bos_id, tok.eos_id]
    assert tok.encode("", add_special=False) == []
    assert tok.decode([]) == ""
    assert tok.decode([tok.bos_id, tok.eos_id]) == ""
    assert tok.encode_batch([]) == []
    assert tok.decode_batch([]) == []


# ---------------------------------------------------------------- truncation
@pytest.mark.parametrize("max_len", [2, 3, 5, 8])
def test_truncation_keeps_eos(tok, max_len):
    text = "a dog barks loudly at the cat while rain falls on a tin roof"
    full = tok.encode(text)
    ids = tok.encode(text, max_len=max_len)
    assert len(ids) == max_len < len(full)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert ids[:-1] == full[: max_len - 1]


def test_truncation_noop_when_short_and_without_specials(tok):
    assert tok.encode("the cat", max_len=100) == tok.encode("the cat")
    body = tok.encode("the cat barks", add_special=False)
    assert tok.encode("the cat barks", add_special=False, max_len=2) == body[:2]
    assert tok.encode("the cat", add_special=False, max_len=0) == []


@pytest.mark.parametrize("max_len", [1, 0, -3])
def test_max_len_too_small(tok, max_len):
    with pytest.raises(UserError, match=rf"max_len \({max_len}\) must be >= 2"):
        tok.encode("a dog", max_len=max_len)


# ---------------------------------------------------------------- decoding
def test_decode_stops_at_first_eos(tok):
    a, b = tok.encode("the dog", add_special=False), tok.encode("the cat", add_special=False)
    ids = [tok.bos_id, *a, tok.eos_id, *b, tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(ids) == "the dog"
    shown = tok.decode(ids, skip_special=False)
    assert shown.startswith("<bos>") and shown.endswith("<eos><pad><pad>") and "cat" in shown


def test_decode_accepts_tensors(tok):
    ids = tok.encode_batch(["the dog", "a cat barks"], max_len=4)
    batch = torch.tensor(ids)  # (b, n)
    assert tok.decode_batch(batch) == [tok.decode(r) for r in ids]
    assert tok.decode(batch[0]) == tok.decode(ids[0])


@pytest.mark.parametrize("bad", [-100, 10_000])
def test_decode_out_of_range(tok, bad):
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, {tok.vocab_size - 1}\].*{bad}"):
        tok.decode([1, 5, bad])


def test_encode_rejects_non_strings(tok):
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        tok.encode_batch(["ok", 3])


# ---------------------------------------------------------------- save / load
def test_save_load_identical_ids(tok, tmp_path):
    path = tok.save(tmp_path / "sub" / "tok.json")
    loaded = load_tokenizer(path)
    assert type(loaded) is type(tok) and loaded == tok
    texts = random_captions(300, seed=1)
    assert loaded.encode_batch(texts) == tok.encode_batch(texts)
    assert [loaded.encode(t, max_len=6) for t in texts] == [tok.encode(t, max_len=6) for t in texts]
    assert loaded.decode_batch(tok.encode_batch(texts)) == tok.decode_batch(tok.encode_batch(texts))
    assert loaded.vocab_size == tok.vocab_size


def test_json_str_round_trip(tok):
    s = tok.to_json_str()
    assert json.loads(s)["kind"] == tok.kind
    again = Tokenizer.from_json_str(s)
    assert again.to_json_str() == s
    assert type(tok).from_json_str(s) == tok


def test_pickle_round_trip(tok):
    """DataLoader workers (spawn) pickle the tokenizer."""
    clone = pickle.loads(pickle.dumps(tok))
    texts = random_captions(50, seed=2)
    assert clone.encode_batch(texts) == tok.encode_batch(texts)


def test_bpe_training_is_deterministic():
    a = BPETokenizer.train(CORPUS, vocab_size=80)
    b = BPETokenizer.train(iter(CORPUS), vocab_size=80)  # a one-shot iterator works too
    assert a.to_json_str() == b.to_json_str()


def test_bpe_json_is_a_plain_tokenizers_file(bpe):
    """The embedded document loads in `tokenizers` alone and adds <bos>/<eos> itself."""
    hf = HFTokenizer.from_str(json.dumps(json.loads(bpe.to_json_str())["tokenizer"]))
    for text in random_captions(30, seed=3):
        assert hf.encode(text).ids == bpe.encode(text)


# ---------------------------------------------------------------- vocabulary size
def test_bpe_vocab_size_reached_on_large_corpus():
    tok = BPETokenizer.train(random_captions(500, seed=4) + CORPUS, vocab_size=60)
    assert tok.vocab_size == 60


def test_bpe_small_corpus_learns_fewer():
    tok = BPETokenizer.train(["ab ab", "cd"], vocab_size=1000)
    assert 4 < tok.vocab_size < 1000
    # characters a b c d and "▁" plus a few merges seen twice
    assert tok.vocab_size == len({tok.id_to_token(i) for i in range(tok.vocab_size)})


def test_bpe_vocab_size_bounds_the_alphabet():
    """With fewer slots than characters, the rarest characters become <unk>."""
    tok = BPETokenizer.train(["aaaa bbb cc d"], vocab_size=7, min_frequency=1)
    assert tok.vocab_size <= 7
    assert tok.unk_id in tok.encode("d", add_special=False)


def test_char_vocab_is_sorted_characters(char):
    chars = sorted(set(" ".join(c.lower() for c in CORPUS)) | {" "})
    assert [char.id_to_token(i) for i in range(4, char.vocab_size)] == chars


# ---------------------------------------------------------------- error messages
@pytest.mark.parametrize("vocab_size", [0, 3, 4])
def test_bpe_vocab_size_too_small(vocab_size):
    with pytest.raises(UserError, match=rf"vocab_size \({vocab_size}\) must be an int > 4"):
        BPETokenizer.train(CORPUS, vocab_size=vocab_size)


def test_bpe_min_frequency_invalid():
    with pytest.raises(UserError, match=r"min_frequency \(0\) must be an int >= 1"):
        BPETokenizer.train(CORPUS, vocab_size=50, min_frequency=0)


@pytest.mark.parametrize("cls", [BPETokenizer, CharTokenizer])
@pytest.mark.parametrize("corpus", [[], ["", "   "]])
def test_empty_corpus(cls, corpus):
    kwargs = {"vocab_size": 50} if cls is BPETokenizer else {}
    with pytest.raises(UserError, match=r"texts has no characters"):
        cls.train(corpus, **kwargs)


@pytest.mark.parametrize("cls", [BPETokenizer, CharTokenizer])
def test_train_rejects_a_single_string(cls):
    kwargs = {"vocab_size": 50} if cls is BPETokenizer else {}
    with pytest.raises(TypeError, match=r"texts must be an iterable of strings, not one str"):
        cls.train("a dog barks", **kwargs)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got NoneType"):
        cls.train(["a dog", None], **kwargs)


def test_unknown_kind(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kind": "wordpiece", "version": 1}))
    with pytest.raises(UserError, match=r"t\.json.*unknown kind \('wordpiece'\).*'bpe', 'char'"):
        load_tokenizer(path)


@pytest.mark.parametrize("doc, match", [
    ("not json", r"not valid JSON"),
    ('["a"]', r"expected a JSON object with a 'kind' field"),
    ('{"kind": "char", "version": 99, "vocab": [], "lowercase": true}', r"version \(99\)"),
    ('{"kind": "char", "version": 1}', r"missing the field 'vocab'"),
    ('{"kind": "char", "version": 1, "lowercase": true, "vocab": ["<bos>", "<pad>", "<eos>", '
     '"<unk>"]}', r"vocab must start with \['<pad>', '<bos>', '<eos>', '<unk>'\]"),
    ('{"kind": "bpe", "version": 1, "lowercase": true, "strip_punctuation": false, '
     '"tokenizer": {"x": 1}}', r"not a valid tokenizers JSON"),
])
def test_bad_json(doc, match):
    with pytest.raises(UserError, match=match):
        Tokenizer.from_json_str(doc)


def test_subclass_from_json_str_checks_kind(char):
    with pytest.raises(UserError, match=r"holds kind='char', not 'bpe'"):
        BPETokenizer.from_json_str(char.to_json_str())


def test_load_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"tokenizer file .*nope\.json does not exist; pass the "
                                        r"tokenizer\.json"):
        load_tokenizer(tmp_path / "nope.json")


# ---------------------------------------------------------------- extra specials and prompt
def test_bpe_extra_special_tokens_follow_the_four_and_can_end_the_prompt():
    tok = BPETokenizer.train(CORPUS, vocab_size=120, special_tokens=["<|clotho|>", "<|ac|>"],
                             prompt=["<bos>", "<|ac|>"])
    assert [tok.token_to_id(t) for t in ("<|clotho|>", "<|ac|>")] == [4, 5]
    assert tok.prompt_ids == [1, 5] and tok.special_ids == frozenset(range(6))
    ids = tok.encode("a dog barks")
    assert ids[:2] == [1, 5] and tok.decode(ids) == "a dog barks"
    assert 4 not in tok.encode("a <|clotho|> dog")         # caption text never becomes one
    assert tok.decode([1, 4, *ids[2:]]) == "a dog barks"     # another source's prompt: dropped
    again = Tokenizer.from_json_str(tok.to_json_str())
    assert again == tok and again.prompt_ids == [1, 5] and again.special_ids == tok.special_ids


def test_bpe_without_extra_specials_keeps_its_json():
    tok = BPETokenizer.train(CORPUS, vocab_size=120)
    payload = json.loads(tok.to_json_str())
    assert "prompt" not in payload and tok.prompt_ids == [1]   # old checkpoints compare equal
    assert Tokenizer.from_json_str(tok.to_json_str()) == tok


def test_bpe_bad_special_tokens_or_prompt_name_the_fix():
    with pytest.raises(UserError, match=r"special_tokens \['<\|a\|>', '<\|a\|>'\] must be "
                                        r"distinct.*\['<\|a\|>'\] are not"):
        BPETokenizer.train(CORPUS, vocab_size=120, special_tokens=["<|a|>", "<|a|>"])
    with pytest.raises(UserError, match=r"\['<eos>'\] are not"):
        BPETokenizer.train(CORPUS, vocab_size=120, special_tokens=["<eos>"])
    with pytest.raises(UserError, match=r"prompt \['<bos>', 'dog'\] must be a non-empty list "
                                        r"of the vocabulary's special tokens.*\['dog'\] are not"):
        BPETokenizer.train(CORPUS, vocab_size=120, prompt=["<bos>", "dog"])
    with pytest.raises(UserError, match=r"vocab_size \(6\) must exceed the 6 special tokens"):
        BPETokenizer.train(CORPUS, vocab_size=6, special_tokens=["<|a|>", "<|b|>"])
