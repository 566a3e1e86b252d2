"""Instruction data for a prefix LLM: the JSONL reader (bad lines named by file, line and key),
caption sets with data.instruction, AQA lines as instruction items, and the prefix batches
(labels on assistant turns only, left-padded generation prompts)."""

from __future__ import annotations

import pytest
import torch

from mmtf.data import CaptionDataModule
from mmtf.data.errors import ErrorPolicy
from mmtf.data.formats import read_instruction
from mmtf.errors import ConfigError, DataError, UserError
from mmtf.metrics.aqa import format_messages
from mmtf.synthetic import SyntheticCaptionDataModule
from tests.unit.data.chat_fixtures import (
    chat,
    ids_of,
    template,
    tiny_tokenizer,
    words_of,
    write_clips,
    write_split,
)
from tests.unit.data.conftest import TINY_AUDIO

IGNORE = -100
DOG = chat("<|audio|>\nDescribe the sound.", "A dog barks.")
# Two answers, the first context only.
TWO = [{"role": "user", "content": "<|audio|>\nWhat is this?"},
       {"role": "assistant", "content": "A dog.", "train": False},
       {"role": "user", "content": "More detail."},
       {"role": "assistant", "content": "A dog barks twice far away."}]


def module(root, **kw) -> CaptionDataModule:
    kw = {"batches": {"batch_size": 2, "bucketing": False}, "loader": {"num_workers": 0}, **kw}
    return CaptionDataModule(format="instruction", modality="audio", root=str(root), **kw)


@pytest.fixture()
def chat_set(tmp_path):
    """train: the two conversations; val: the same plus a longer prompt."""
    write_clips(tmp_path, ["dog", "dog2"], [0.5, 0.25])
    write_split(tmp_path, "train", [{"audio": "audio/dog.wav", "messages": DOG, "id": "a"},
                                    {"audio": "audio/dog2.wav", "messages": TWO, "id": "b"}])
    write_split(tmp_path, "val", [{"audio": "audio/dog.wav", "messages": DOG, "id": "a"},
                                  {"audio": "audio/dog2.wav", "messages": TWO, "id": "b"}])
    return tmp_path


def first_batch(dm, split):
    loader = {"train": dm.train_dataloader, "val": dm.val_dataloader}[split]()
    return next(iter(loader))


def by_id(batch, key, item_id):
    return batch[key][batch["ids"].index(item_id)]


def test_labels_only_on_assistant_turns_and_train_false_is_context(chat_set):
    tok = tiny_tokenizer()
    dm = module(chat_set)
    dm.connect(tok, chat_template=template())
    batch = first_batch(dm, "train")
    # Hand-worked with the Whitespace-split vocabulary (newlines are no tokens):
    # <|im_start|> user <|audio|> Describe the sound . <|im_end|> <|im_start|> assistant
    #   A dog barks . <|im_end|>       -> positions 10..14 trained (answer and end marker).
    dog = ids_of(tok, ["<|im_start|>", "user", "<|audio|>", "Describe", "the", "sound", ".",
                       "<|im_end|>", "<|im_start|>", "assistant", "A", "dog", "barks", ".",
                       "<|im_end|>"])
    n = len(dog)
    assert by_id(batch, "input_ids", "a")[:n].tolist() == dog
    assert by_id(batch, "labels", "a")[:n].tolist() == [IGNORE] * 10 + dog[10:]
    # Second item: "A dog ." (train: false) stays -100; only the last answer is trained.
    two = ids_of(tok, ["<|im_start|>", "user", "<|audio|>", "What", "is", "this", "?",
                       "<|im_end|>", "<|im_start|>", "assistant", "A", "dog", ".", "<|im_end|>",
                       "<|im_start|>", "user", "More", "detail", ".", "<|im_end|>",
                       "<|im_start|>", "assistant", "A", "dog", "barks", "twice", "far", "away",
                       ".", "<|im_end|>"])
    assert by_id(batch, "input_ids", "b").tolist() == two
    assert by_id(batch, "labels", "b").tolist() == [IGNORE] * 22 + two[22:]
    # Right padding: the shorter row ends in pad ids, masked and untrained.
    row = batch["ids"].index("a")
    assert batch["attention_mask"][row].tolist() == [True] * n + [False] * (len(two) - n)
    assert batch["input_ids"][row, n:].eq(tok.pad_id).all()
    assert batch["labels"][row, n:].eq(IGNORE).all()
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.bool
    # The media: (b, samples) float, the mask True on each clip's own samples.
    assert batch["media"].dtype == torch.float32 and batch["media"].shape == (2, 8000)
    assert batch["media_mask"].sum(dim=1).tolist() == [8000 if i == "a" else 4000
                                                       for i in batch["ids"]]
    assert "prompt_ids" not in batch


def test_eval_prompts_are_left_padded_and_end_in_the_generation_prompt(chat_set):
    tok = tiny_tokenizer()
    dm = module(chat_set)
    dm.connect(tok, chat_template=template())
    batch = first_batch(dm, "val")
    prompt_a = ids_of(tok, ["<|im_start|>", "user", "<|audio|>", "Describe", "the", "sound", ".",
                            "<|im_end|>", "<|im_start|>", "assistant"])
    prompt_b = ids_of(tok, ["<|im_start|>", "user", "<|audio|>", "What", "is", "this", "?",
                            "<|im_end|>", "<|im_start|>", "assistant", "A", "dog", ".",
                            "<|im_end|>", "<|im_start|>", "user", "More", "detail", ".",
                            "<|im_end|>", "<|im_start|>", "assistant"])
    width = len(prompt_b)
    a, b = batch["ids"].index("a"), batch["ids"].index("b")
    assert batch["prompt_ids"][b].tolist() == prompt_b
    assert batch["prompt_ids"][a].tolist() == [tok.pad_id] * (width - len(prompt_a)) + prompt_a
    assert batch["prompt_mask"][a].tolist() == [False] * (width - len(prompt_a)) + \
        [True] * len(prompt_a)
    assert batch["prompt_mask"][b].all()
    assert batch["references"][a] == ["A dog barks."]
    assert batch["references"][b] == ["A dog barks twice far away."]
    assert "labels" in batch and "choices" not in batch     # the val loss; no questions here


BAD = [
    ("{not json", "is not valid JSON"),
    ("[1]", "must be a JSON object"),
    ({"messages": DOG}, "has no 'audio' path"),
    ({"image": "x.png", "messages": DOG}, "has no 'audio' path (it has 'image': set "
                                          "data.modality=image)"),
    ({"audio": "audio/dog.wav"}, "has no 'messages'"),
    ({"audio": "audio/dog.wav", "messages": []}, "'messages' must be a non-empty list"),
    ({"audio": "audio/dog.wav", "messages": [{"role": "robot", "content": "<|audio|>"}]},
     "'messages'[0].role ('robot') must be one of"),
    ({"audio": "audio/dog.wav", "messages": chat("<|audio|>", "")},
     "'messages'[1].content must be a non-empty string"),
    ({"audio": "audio/dog.wav", "messages": chat("<|audio|>", "x", train="no")},
     "'messages'[1].train ('no') must be true or false"),
    ({"audio": "audio/dog.wav", "messages": chat("Describe it.", "x")},
     "'messages' holds the media placeholder <|audio|> 0 times"),
    ({"audio": "audio/dog.wav", "messages": chat("<|audio|> <|audio|>", "x")},
     "'messages' holds the media placeholder <|audio|> 2 times"),
    ({"audio": "audio/dog.wav", "messages": chat("<|image|>", "x")},
     "'messages'[0].content holds <|image|>, the placeholder of other media"),
    ({"audio": "audio/dog.wav", "messages": chat("<|audio|>", "x <|audio|>")},
     "'messages'[1] (assistant) holds the media placeholder"),
    ({"audio": "audio/dog.wav", "messages": DOG[:1]},
     "the last of 'messages' is not an assistant turn"),
    ({"audio": "audio/dog.wav", "messages": chat("<|audio|>", "x", train=False)},
     "every assistant turn of 'messages' has train: false"),
    ({"audio": "audio/dog.wav", "messages": [{"role": "user", "content": "<|audio|>",
                                              "name": "me"}, DOG[1]]},
     "'messages'[0] has unknown key(s) ['name']"),
    ({"audio": "audio/dog.wav", "messages": DOG, "references": []}, "'references' must be"),
]


@pytest.mark.parametrize("line, message", BAD)
def test_a_bad_line_is_named_by_file_line_and_key(tmp_path, line, message):
    good = {"audio": "audio/dog.wav", "messages": DOG}
    write_split(tmp_path, "train", [good, line])
    with pytest.raises(DataError) as err:
        read_instruction(tmp_path, "train", report=ErrorPolicy("raise"))
    text = str(err.value)
    assert f"{tmp_path / 'train.jsonl'} (line 2): " in text and message in text
    assert "\n" not in text
    skip = ErrorPolicy("skip")
    items = read_instruction(tmp_path, "train", report=skip)
    assert len(items) == 1 and skip.counter.total == 1


def test_defaults_of_a_valid_line(tmp_path):
    write_split(tmp_path, "train", [{"audio": "audio/dog.wav", "messages": TWO,
                                     "references": ["a dog", "a barking dog"]}])
    (item,) = read_instruction(tmp_path, "train", report=ErrorPolicy("raise"))
    assert item.id == "audio/dog#1" and item.path == tmp_path / "audio" / "dog.wav"
    assert item.captions == ("a dog", "a barking dog") and item.messages[1]["train"] is False
    assert item.where == "train.jsonl line 1" and item.qa is None


def test_instruction_data_without_a_chat_template_says_how_to_hand_it_over(chat_set):
    dm = module(chat_set)
    dm.connect(tiny_tokenizer())
    with pytest.raises(UserError, match=r"connect\(tokenizer, chat_template=\.\.\.\)"):
        dm.train_dataloader()


def test_a_conversation_over_max_chat_tokens_is_named(chat_set):
    dm = module(chat_set, max_chat_tokens=20)
    dm.connect(tiny_tokenizer(), chat_template=template())
    with pytest.raises(UserError, match=r"train.jsonl line 2: the conversation is 30 tokens "
                                        r"once rendered, more than data.max_chat_tokens=20"):
        dm.train_dataloader()


def test_a_placeholder_the_tokenizer_lacks_is_one_clear_line(chat_set):
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    from mmtf.text.pretrained import PretrainedTokenizer

    tok = PretrainedTokenizer(tokenizer=backend, pad_id=0, bos_id=0, eos_id=0)
    dm = module(chat_set)
    dm.connect(tok, chat_template=template())
    with pytest.raises(UserError, match=r"train.jsonl line 1: the media placeholder "
                                        r"'<\|audio\|>' is not a token"):
        dm.train_dataloader()


# ---------------------------------------------------------------------------- caption sets
@pytest.fixture(scope="module")
def caption_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth") / "captions"
    return lambda **kw: SyntheticCaptionDataModule(
        format="clotho", root=str(root), synthetic={"kind": "audio_captions", **TINY_AUDIO},
        batches={"batch_size": 4, "bucketing": False}, loader={"num_workers": 0},
        instruction="Describe the sound.", **kw)


def caption_tokenizer(dm):
    texts = [c for s in ("train", "val") for item in dm.items(s) for c in item.captions]
    return tiny_tokenizer(texts)


def test_caption_items_with_an_instruction_become_chats(caption_module):
    dm = caption_module(caption_policy="all")
    tok = caption_tokenizer(dm)
    dm.connect(tok, chat_template=template())
    items = dm.items("train")
    # caption_policy=all: every (item, caption) pair is one example per epoch.
    sampler = dm.batch_sampler("train")
    assert sampler.num_examples() == sum(len(i.captions) for i in items)
    pairs = sorted(tuple(k[:2]) for b in sampler.batches(0) for k in b)
    assert pairs == sorted((i, c) for i, item in enumerate(items)
                           for c in range(len(item.captions)))
    batch = next(iter(dm.train_dataloader()))
    for row, key in zip(range(len(batch["ids"])), sampler.batches(0)[0]):
        item, caption = items[key[0]], items[key[0]].captions[key[1]]
        header = ["<|im_start|>", "user", "<|audio|>", "Describe", "the", "sound", ".",
                  "<|im_end|>", "<|im_start|>", "assistant"]
        answer = [*words_of([caption]), "<|im_end|>"]
        expect = ids_of(tok, header + answer)
        assert batch["ids"][row] == item.id
        assert batch["input_ids"][row][:len(expect)].tolist() == expect
        assert batch["labels"][row][:len(expect)].tolist() == \
            [IGNORE] * len(header) + expect[len(header):]


def test_caption_policy_random_trains_one_caption_per_item_per_epoch(caption_module):
    dm = caption_module()
    dm.connect(caption_tokenizer(dm), chat_template=template())
    sampler = dm.batch_sampler("train")
    keys = [k for b in sampler.batches(0) for k in b]
    assert sorted(k[0] for k in keys) == list(range(len(dm.items("train"))))


def test_caption_eval_batches_keep_every_reference(caption_module):
    dm = caption_module()
    tok = caption_tokenizer(dm)
    dm.connect(tok, chat_template=template())
    batch = next(iter(dm.val_dataloader()))
    items = {i.id: i for i in dm.items("val")}
    assert len(batch["ids"]) == min(4, len(items))
    prompt = ids_of(tok, ["<|im_start|>", "user", "<|audio|>", "Describe", "the", "sound", ".",
                          "<|im_end|>", "<|im_start|>", "assistant"])
    for row, item_id in enumerate(batch["ids"]):
        assert batch["references"][row] == list(items[item_id].captions)
        assert batch["prompt_ids"][row].tolist() == prompt


def test_a_caption_set_with_an_instruction_refuses_a_captioner_and_mixup(caption_module):
    dm = caption_module()
    dm.connect(caption_tokenizer(dm))
    with pytest.raises(UserError, match="data.instruction trains a prefix LLM"):
        dm.tokens("train")
    with pytest.raises(ConfigError, match="must be a non-empty string"):
        caption_module().__class__(format="clotho", root="x", synthetic={"kind": "audio_captions"},
                                   instruction=" ")
    mixed = caption_module(augment={"mixup": {"p": 0.5}})
    with pytest.raises(ConfigError, match="mixup"):
        mixed.connect(caption_tokenizer(dm), chat_template=template())
    from mmtf.text import CharTokenizer

    with pytest.raises(ConfigError, match="CharTokenizer is not one"):
        dm.connect(CharTokenizer.train(dm.train_captions()), chat_template=template())


def test_train_captions_hold_the_turns_and_the_instruction(chat_set, caption_module):
    assert module(chat_set).train_captions() == [
        "Describe the sound.", "A dog barks.", "What is this?", "A dog.", "More detail.",
        "A dog barks twice far away."]
    dm = caption_module()
    assert dm.train_captions()[-1] == "Describe the sound."


# ---------------------------------------------------------------------------- questions
CHOICES = ["low tone", "high tone", "rising chirp", "slow click train"]


@pytest.fixture()
def qa_set(tmp_path):
    write_clips(tmp_path, ["q1", "q2"], [0.5, 0.5])
    lines = [{"id": f"q{k}", "audio": f"audio/q{k}.wav", "question_type": kind,
              "question": "Which sound is heard?", "choices": CHOICES, "answer": answer,
              "messages": format_messages("Which sound is heard?", CHOICES, answer)}
             for k, kind, answer in ((1, "presence", "rising chirp"), (2, "order", "low tone"))]
    write_split(tmp_path, "train", lines)
    write_split(tmp_path, "val", lines)
    return tmp_path


def qa_tokenizer():
    return tiny_tokenizer(["Which sound is heard? Answer with the letter.", *CHOICES,
                           "(A) (B) (C) (D)"])


def test_aqa_lines_are_instruction_items_with_their_question_fields(qa_set):
    dm = module(qa_set)
    tok = qa_tokenizer()
    dm.connect(tok, chat_template=template())
    train = first_batch(dm, "train")
    row = train["ids"].index("q1")
    trained = [t for t in train["labels"][row].tolist() if t != IGNORE]
    assert trained == ids_of(tok, ["(", "C", ")", "rising", "chirp", "<|im_end|>"])
    assert train["choices"][row] == CHOICES and train["rotation"][row] == 0


def test_aqa_eval_batches_keep_choices_answer_type_and_every_rotation(qa_set):
    dm = module(qa_set, rotations=4, batches={"batch_size": 8, "bucketing": False})
    tok = qa_tokenizer()
    dm.connect(tok, chat_template=template())
    batch = first_batch(dm, "val")
    assert sorted(zip(batch["ids"], batch["rotation"])) == [
        (q, r) for q in ("q1", "q2") for r in range(4)]
    for row, (item_id, r) in enumerate(zip(batch["ids"], batch["rotation"])):
        answer = "rising chirp" if item_id == "q1" else "low tone"
        # Rotation r moves option i to (i + r) % 4 (mmtf.metrics.aqa.rotate_item).
        expect = [CHOICES[(i - r) % 4] for i in range(4)]
        assert batch["choices"][row] == expect and batch["answer"][row] == answer
        assert batch["question_type"][row] == ("presence" if item_id == "q1" else "order")
        letter = "ABCD"[expect.index(answer)]
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row]].tolist()
        options = " ".join(f"({'ABCD'[i]}) {c}" for i, c in enumerate(expect))
        assert prompt == ids_of(tok, [
            "<|im_start|>", "user", "<|audio|>",
            *words_of([f"Which sound is heard? {options} Answer with the letter."]),
            "<|im_end|>", "<|im_start|>", "assistant"])
        trained = [t for t in batch["labels"][row].tolist() if t != IGNORE]
        assert trained == ids_of(tok, ["(", letter, ")", *answer.split(), "<|im_end|>"])
        assert batch["references"][row] == [f"({letter}) {answer}"]
    # The scorer takes the module's questions and the batch as it is: the references as
    # replies are right under every rotation.
    from mmtf.metrics.aqa import AQAAccuracy

    metric = AQAAccuracy(dm.questions("val"), rotations=4)
    metric.update(batch["ids"], batch["rotation"], [r[0] for r in batch["references"]],
                  batch["answer"])
    scores = metric.compute()
    assert scores["strict_accuracy"] == 1.0 and scores["items"] == 2


def _trained_answer(tok, batch, row):
    return [t for t in batch["labels"][row].tolist() if t != IGNORE]


def test_training_rotations_move_the_right_letter_between_epochs(qa_set):
    """data.train_rotations=4: each question is trained under one rotation of its options per
    epoch (the caption slot), so over epochs its answer is trained under several letters."""
    tok = qa_tokenizer()
    dm = module(qa_set, train_rotations=4, batches={"batch_size": 2, "bucketing": False})
    dm.connect(tok, chat_template=template())
    variants = dm.tokens("train")
    assert [len(v) for v in variants] == [4, 4]
    seen: dict[str, set[str]] = {"q1": set(), "q2": set()}
    loader = dm.train_dataloader()
    for epoch in range(8):
        loader.batch_sampler.set_epoch(epoch)
        batch = next(iter(loader))
        for row, item_id in enumerate(batch["ids"]):
            answer = "rising chirp" if item_id == "q1" else "low tone"
            r = batch["rotation"][row]
            # Written by hand from rotate_item's rule: option i moves to (i + r) % 4.
            expect = [CHOICES[(i - r) % 4] for i in range(4)]
            assert batch["choices"][row] == expect
            letter = "ABCD"[expect.index(answer)]
            assert _trained_answer(tok, batch, row) == ids_of(
                tok, ["(", letter, ")", *answer.split(), "<|im_end|>"])
            seen[item_id].add(letter)
    # 8 epochs, one of 4 rotations each: each question met at least two letters.
    assert all(len(letters) >= 2 for letters in seen.values()), seen


def test_training_rotations_default_to_the_question_as_written(qa_set):
    dm = module(qa_set)
    dm.connect(qa_tokenizer(), chat_template=template())
    assert [len(v) for v in dm.tokens("train")] == [1, 1]


@pytest.mark.parametrize("value", [0, 1.5, True])
def test_a_bad_train_rotations_is_named(qa_set, value):
    with pytest.raises(ConfigError, match=r"data.train_rotations"):
        module(qa_set, train_rotations=value)


def test_more_training_rotations_than_options_is_named(qa_set):
    dm = module(qa_set, train_rotations=5)
    dm.connect(qa_tokenizer(), chat_template=template())
    with pytest.raises(UserError, match=r"train.jsonl line 1: data.train_rotations=5 but the "
                                        r"question has 4 options"):
        dm.train_dataloader()


def test_more_rotations_than_options_is_named(qa_set):
    dm = module(qa_set, rotations=5)
    dm.connect(qa_tokenizer(), chat_template=template())
    with pytest.raises(UserError, match=r"val.jsonl line 1: data.rotations=5 but the question "
                                        r"has 4 options"):
        dm.val_dataloader()


def test_the_built_in_aqa_set_reads_as_instruction_data(tmp_path):
    dm = SyntheticCaptionDataModule(
        format="instruction", modality="audio", root=str(tmp_path / "qa"),
        synthetic={"kind": "audio_qa", "num_train": 4, "num_val": 2, "num_test": 2,
                   "min_seconds": 1.0, "max_seconds": 1.5, "questions_per_clip": 2, "seed": 0,
                   "num_workers": 1},
        batches={"batch_size": 4, "bucketing": False}, loader={"num_workers": 0})
    items = dm.items("val")
    assert items and all(i.qa is not None and i.messages for i in items)
    assert all(i.captions == (i.messages[-1]["content"],) for i in items)


# ---------------------------------------------------------------------------- configs, hand-over
def _data_cfg(*overrides):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[3] / "conf"
    with initialize_config_dir(str(conf), version_base="1.3"):
        return compose("train", overrides=list(overrides)).data


def test_the_configs_compose_into_instruction_modules(chat_set):
    from hydra.utils import instantiate

    dm = instantiate(_data_cfg("data=instruction", f"data.root={chat_set}"))
    assert type(dm) is CaptionDataModule and dm.format == "instruction"
    assert [i.id for i in dm.items("train")] == ["a", "b"]
    caps = _data_cfg("data=synth_audio_captions", "data.instruction=Describe the sound.")
    assert caps.instruction == "Describe the sound." and caps.max_chat_tokens == 512
    assert _data_cfg("data=synth_image_captions").media_token is None
    qa, plain = _data_cfg("data=synth_audio_qa_instruction"), _data_cfg("data=synth_audio_qa")
    # The same generated set (root and generator settings) as data=synth_audio_qa.
    assert qa.root == plain.root and qa.synthetic == plain.synthetic
    assert qa.format == "instruction" and qa.rotations == 4 and qa.train_rotations == 4
    # The chat mixture's sources are the same generated sets as the single-set configs.
    mix = _data_cfg("data=synth_audio_instruction_mix")
    caps_plain = _data_cfg("data=synth_audio_captions")
    for name, single in (("qa", plain), ("captions", caps_plain)):
        assert mix.sources[name].root == single.root
        assert dict(mix.sources[name].synthetic) == dict(single.synthetic)
    built = instantiate(mix)
    assert [s.module.format for s in built.sources] == ["instruction", "clotho"]
    assert built.sources[1].module.instruction == "Describe the sound."
    assert built.sources[0].module.train_rotations == 4


def test_the_task_hands_its_chat_template_over_with_the_tokenizer(chat_set):
    from types import SimpleNamespace

    from mmtf.tasks.base import Task

    tok, tpl = tiny_tokenizer(), template()
    task = SimpleNamespace(tokenizer=tok, chat_template=tpl, require_tokenizer=lambda: tok)
    dm = module(chat_set)
    dm.connect(tok, chat_template=tpl, media_token="<|audio|>")
    Task.check_data_tokenizer(task, dm)                 # the same template: no error
    dm.connect(tok, chat_template=template())
    with pytest.raises(UserError, match="another chat template than the task's"):
        Task.check_data_tokenizer(task, dm)


def test_the_batches_are_what_the_prefix_task_reads(chat_set):
    """The contract with PrefixLMTask: a training batch trains exactly the answer tokens once
    spliced, and a val batch's left-padded prompts generate."""
    from mmtf.pretrained.llm import llm_decoder
    from mmtf.tasks import PrefixLMTask
    from tests.unit.tasks.conftest import ADAMW, audio_encoder

    tok = tiny_tokenizer()
    dm = module(chat_set)
    dm.connect(tok, chat_template=template())
    torch.manual_seed(0)
    decoder = llm_decoder(vocab_size=tok.vocab_size, dim=32, depth=1, num_heads=4,
                          num_kv_heads=2, mlp_hidden=48, max_len=256, eos_id=tok.eos_id,
                          pad_id=tok.pad_id)
    task = PrefixLMTask(encoder=audio_encoder(), decoder=decoder, optimizer=ADAMW,
                        projector={"kind": "linear"},
                        media_token_id=tok.token_to_id("<|audio|>"))
    train = first_batch(dm, "train")
    out = task(train)
    assert torch.isfinite(out.loss)
    # Every trained text token is still trained once spliced, and no media position is.
    assert int((out.inputs.labels != IGNORE).sum()) == int((train["labels"] != IGNORE).sum())
    assert not (out.inputs.labels[out.inputs.media_positions] != IGNORE).any()
    val = first_batch(dm, "val")
    gen = task.generate({"media": val["media"], "media_mask": val["media_mask"],
                         "input_ids": val["prompt_ids"], "attention_mask": val["prompt_mask"]},
                        max_new_tokens=3)
    assert gen.tokens.shape[0] == len(val["ids"])


def test_image_captions_with_an_instruction_hold_the_image_placeholder(tiny_image_captions):
    dm = CaptionDataModule(format="coco", root=str(tiny_image_captions),
                           instruction="Describe the image.",
                           batches={"batch_size": 2}, loader={"num_workers": 0})
    texts = [c for s in ("train", "val") for item in dm.items(s) for c in item.captions]
    tok = tiny_tokenizer([*texts, "image"])
    dm.connect(tok, chat_template=template())
    batch = first_batch(dm, "val")
    assert batch["media"].shape == (2, 3, 32, 32) and "media_mask" not in batch
    header = ids_of(tok, ["<|im_start|>", "user", "<|image|>", "Describe", "the", "image", ".",
                          "<|im_end|>", "<|im_start|>", "assistant"])
    assert batch["prompt_ids"][0].tolist()[-len(header):] == header


def test_lightning_fits_a_prefix_task_on_the_data_module(chat_set, tmp_path):
    import lightning as L

    from mmtf.pretrained.llm import llm_decoder
    from mmtf.tasks import PrefixLMTask
    from tests.unit.tasks.conftest import ADAMW, audio_encoder

    tok = tiny_tokenizer()
    dm = module(chat_set, max_seconds=10.0)
    torch.manual_seed(0)
    decoder = llm_decoder(vocab_size=tok.vocab_size, dim=32, depth=1, num_heads=4,
                          num_kv_heads=2, mlp_hidden=48, max_len=256, eos_id=tok.eos_id,
                          pad_id=tok.pad_id)
    task = PrefixLMTask(encoder=audio_encoder(), decoder=decoder, optimizer=ADAMW,
                        projector={"kind": "linear"}, warmup_steps=1,
                        media_token_id=tok.token_to_id("<|audio|>"))
    task.use_tokenizer(tok)
    dm.connect(tok, **task.text_context())             # what mmtf.train hands over
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False,
                        default_root_dir=str(tmp_path / "run"),     # its sample tables
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    assert {"train/loss", "val/loss"} <= set(trainer.callback_metrics)
    assert torch.isfinite(trainer.callback_metrics["val/loss"])


def test_the_models_placeholder_reaches_the_data_unless_data_names_another(chat_set):
    from mmtf.errors import ConfigError

    tok = tiny_tokenizer()
    dm = module(chat_set)
    dm.connect(tok, chat_template=template(), media_token="<|image|>")
    assert dm.placeholder == "<|image|>"                 # data.media_token unset: the model's
    named = module(chat_set, media_token="<|audio|>")
    with pytest.raises(ConfigError, match=r"data.media_token \('<\|audio\|>'\) is not the "
                                          r"model's placeholder \('<\|image\|>'\)"):
        named.connect(tok, chat_template=template(), media_token="<|image|>")
