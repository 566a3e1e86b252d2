"""The prefix LM trained from scratch and scored by generation: the from-scratch Llama-shaped
decoder, mmtf's BPE with the chat tokens and the built-in ChatML template built from the Hydra
config; batched left-padded generation against an uncached one-item loop; caption metrics and
shuffle-robust question accuracy of generated replies against hand-worked values; a saved
checkpoint predicting through ``mmtf.load``; the bad inputs, one line each."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

import mmtf
from mmtf.decoders.generation import GenerationOutput
from mmtf.errors import UserError
from mmtf.metrics.aqa import rotate_item
from mmtf.metrics.caption import caption_metrics
from mmtf.text import build_tokenizer
from mmtf.text.chat import encode_conversation

CONF = Path(__file__).resolve().parents[3] / "conf"
# Captions of the built-in grammar (mmtf.synthetic.audio): each parses into an event sequence.
CAPTIONS = ["Quick clicking, then a mid-pitched beep.",
            "Fast clicks, and after that a faint mid-pitched beep.",
            "A faint low tone.", "A hiss of white noise, then a falling chirp."]
TEXTS = [*CAPTIONS, "Describe the sound.", "user assistant", "(A) (B) (C) (D) yes no one two"]
SAMPLES = [3200, 2400]


TINY_LLM = ["model/decoder=llm_tiny", "tokenizer=bpe_chat", "tokenizer.vocab_size=160",
            "model.decoder.dim=32", "model.decoder.depth=1", "model.decoder.mlp_hidden=64",
            "model.decoder.max_len=96"]


def composed(*overrides: str, llm: list[str] = TINY_LLM):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=[
            "model=prefix_lm", "model/encoder=audio_tiny", *llm, "model.projector.k=4",
            "model.finetuning.freeze_decoder=false", "model.generation.max_new_tokens=12",
            *overrides])


def build(*overrides: str, seed: int = 0):
    """The task and its tokenizer as mmtf.train builds them (model, then the BPE trained on the
    run's text, handed over)."""
    cfg = composed(*overrides)
    torch.manual_seed(seed)
    task = instantiate(cfg.model)
    tokenizer = build_tokenizer(OmegaConf.to_container(cfg.tokenizer, resolve=True),
                                lambda: TEXTS * 2)
    task.use_tokenizer(tokenizer)
    task.run_config = OmegaConf.to_container(cfg, resolve=True)
    return task, tokenizer


def media(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(SAMPLES)
    mask = torch.arange(max(SAMPLES))[None] < lengths[:, None]                # (b, samples)
    return torch.randn(len(SAMPLES), max(SAMPLES), generator=g) * mask, mask


def caption_batch(task, tokenizer, answers: list[str], references: list[list[str]]):
    """A batch of the instruct collate's contract: right-padded training ids and labels, the
    left-padded prompts, the references."""
    items = [encode_conversation(task.chat_template, tokenizer, [
        {"role": "user", "content": "<|audio|>\nDescribe the sound."},
        {"role": "assistant", "content": a}], media_token="<|audio|>") for a in answers]
    width = max(len(it.input_ids) for it in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    labels = torch.full((len(items), width), -100)
    mask = torch.zeros(len(items), width, dtype=torch.bool)
    for i, it in enumerate(items):
        n = len(it.input_ids)
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(it.input_ids), \
            torch.tensor(it.labels), True
    prompt_ids, prompt_mask = task.encode_prompts(["<|audio|>\nDescribe the sound."] * len(items))
    x, x_mask = media()
    return {"media": x[:len(items)], "media_mask": x_mask[:len(items)], "input_ids": ids,
            "attention_mask": mask, "labels": labels, "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask, "references": references,
            "ids": [f"clip{i}" for i in range(len(items))]}


def replies_as(task, tokenizer, texts: list[str]):
    """Make the model's generation return ``texts`` (then the end of turn, then noise that the
    decoding must cut), so that the scoring is checked on known strings."""
    stop = tokenizer.token_to_id("<|im_end|>")
    noise = tokenizer.encode("a bell", add_special=False)
    rows = [tokenizer.encode(t, add_special=False) + [stop] + noise for t in texts]
    width = max(map(len, rows))
    tokens = torch.tensor([r + [stop] * (width - len(r)) for r in rows])

    def generate(*args, **kwargs):
        assert kwargs["eos_id"] == stop             # generation stops at the end of the turn
        return GenerationOutput(tokens, torch.zeros(len(rows)), torch.full((len(rows),), width))

    task.model.generate = generate


def validate(task, batch, root: Path) -> dict[str, float]:
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(root))          # the sample tables go there
    trainer.validate(task, dataloaders=DataLoader([batch], batch_size=None), verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_from_scratch_llm_tokenizer_and_template_build_from_the_config():
    task, tokenizer = build()
    lm = task.model.decoder
    attn, block = lm.stack.blocks[0].self_attn, lm.stack.blocks[0]
    assert (attn.num_heads, attn.num_kv_heads) == (4, 2)                      # GQA
    assert lm.lm_head.weight is lm.embed.weight                               # tied
    assert isinstance(block.norm_self, torch.nn.RMSNorm) and block.mlp.kind == "swiglu"
    assert lm.stack.rope is not None and lm.vocab_size == 160
    # The placeholders and chat markers are single tokens at the ids the config lists them in.
    assert [tokenizer.token_to_id(t) for t in
            ("<|im_start|>", "<|im_end|>", "<|audio|>", "<|image|>")] == [4, 5, 6, 7]
    assert task.model.media_token_id == 6                        # resolved, not set by hand
    assert task.stop_id == 5                                     # <|im_end|> ends a turn
    assert task.chat_template.render([{"role": "user", "content": "hi"}],
                                     add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert task.text_context() == {"chat_template": task.chat_template,
                                   "media_token": "<|audio|>"}


def test_batched_left_padded_generation_equals_an_uncached_loop_per_item():
    task, tokenizer = build()
    task.eval()
    x, x_mask = media()
    texts = ["<|audio|>\nDescribe the sound.", "Say it: <|audio|>"]      # prompts of 2 lengths
    ids, mask = task.encode_prompts(texts)
    got = task.generate(
        {"media": x, "media_mask": x_mask, "input_ids": ids, "attention_mask": mask},
        max_new_tokens=6, min_new_tokens=6).tokens
    lm, model = task.model.decoder, task.model
    for i, text in enumerate(texts):
        with torch.no_grad():
            row = ids[i][mask[i]]
            at = int((row == 6).nonzero())
            m = x_mask[i:i + 1]
            projected = model.encode(x[i:i + 1, :int(m.sum())])     # the clip alone, unpadded
            embeds = torch.cat([lm.embed(row[:at]), projected.embeds[0],
                                lm.embed(row[at + 1:])])[None]      # (1, w, c)
            expected = []
            for _ in range(6):
                logits = lm(inputs_embeds=embeds)[0, -1].clone()    # no cache, no padding
                logits[[6, *range(tokenizer.vocab_size, lm.vocab_size)]] = -torch.inf
                if len(expected) < 6:
                    logits[5] = -torch.inf                           # min_new_tokens
                token = int(logits.argmax())
                expected.append(token)
                embeds = torch.cat([embeds, lm.embed(torch.tensor([[token]]))], dim=1)
        assert got[i].tolist() == expected, text


def test_caption_metrics_of_generated_replies_equal_an_independent_computation(tmp_path):
    task, tokenizer = build()
    replies = ["Quick clicking, then a mid-pitched beep.", "A faint low tone."]
    references = [["Fast clicks, and after that a faint mid-pitched beep."],
                  ["A hiss of white noise, then a falling chirp."]]
    batch = caption_batch(task, tokenizer, [r[0] for r in references], references)
    replies_as(task, tokenizer, replies)
    metrics = validate(task, batch, tmp_path)
    # The decoded replies: mmtf's BPE lower-cases; the end of turn cut what followed.
    decoded = [row["prediction"] for row in task.last_predictions["val"]]
    assert decoded == ["quick clicking, then a mid-pitched beep.", "a faint low tone."]
    # Item 0 names the reference's events (clicks fast, tone middle), item 1 does not.
    assert metrics["val/event_accuracy"] == 0.5
    expected = caption_metrics(decoded, references, metrics=["bleu", "rouge_l", "cider_d"])
    for name in ("bleu_4", "rouge_l", "cider_d"):
        assert metrics[f"val/{name}"] == pytest.approx(expected[name]), name
    assert "val/loss" in metrics


def test_question_accuracy_over_rotations_through_the_task(tmp_path):
    task, tokenizer = build()
    items = [{"id": "q0", "question_type": "presence", "question": "Is there a beep?",
              "choices": ["yes", "no", "one", "two"], "answer": "yes"},        # (A) as written
             {"id": "q1", "question_type": "count", "question": "How many events?",
              "choices": ["yes", "no", "one", "two"], "answer": "two"}]        # (D) as written
    variants = [rotate_item(it, r) for it in items for r in range(4)]
    b = len(variants)
    x, x_mask = media()
    prompt_ids, prompt_mask = task.encode_prompts([v["messages"][0]["content"] for v in variants])
    ids = prompt_ids.clone()
    batch = {"media": x[[0] * b], "media_mask": x_mask[[0] * b], "input_ids": ids,
             "attention_mask": prompt_mask, "labels": torch.full_like(ids, -100),
             "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
             "choices": [v["choices"] for v in variants], "answer": [v["answer"] for v in variants],
             "question_type": [v["question_type"] for v in variants],
             "rotation": [v["rotation"] for v in variants], "ids": [v["id"] for v in variants],
             # The chat collate gives every row its references too (here each variant's own
             # answer): a question must still be scored by its choices, not as a caption.
             "references": [[v["messages"][-1]["content"]] for v in variants]}
    replies_as(task, tokenizer, ["(A)"] * b)          # a model that always answers A
    metrics = validate(task, batch, tmp_path)
    # Rotation r moves the answer from letter a to (a + r) % 4: "A" is right under exactly one
    # rotation of each item (q0: r=0, q1: r=1), so 2 of 8 replies are right; as written only
    # q0 is; no item is right under all four rotations.
    assert metrics["val/mean_accuracy"] == 0.25
    assert metrics["val/accuracy"] == 0.5
    assert metrics["val/strict_accuracy"] == 0.0
    assert metrics["val/presence/accuracy"] == 1.0 and metrics["val/count/accuracy"] == 0.0
    assert metrics["val/unparsed"] == 0.0 and metrics["val/items"] == 2.0
    confusion = task.last_qa_scores["val"]["confusion"]["all"]
    # right letter (rows) x chosen (columns A..D, none): every reply chose A; the right letters
    # are q0's A, B, C, D and q1's D, A, B, C.
    assert confusion[:, 0].tolist() == [2, 2, 2, 2] and int(confusion.sum()) == 8


def test_a_batch_of_captions_and_questions_scores_each_row_by_its_kind(tmp_path):
    """A mixture's batch: the chat collate gives the question keys to every row (None on the
    caption rows) and references to every row."""
    task, tokenizer = build()
    batch = caption_batch(task, tokenizer, CAPTIONS[:2],
                          [[CAPTIONS[1]], ["(A) yes"]])            # row 1: a question
    batch.update(choices=[None, ["yes", "no", "one", "two"]], answer=[None, "yes"],
                 question_type=[None, "presence"], rotation=[None, 0])
    replies_as(task, tokenizer, [CAPTIONS[0], "(A)"])
    metrics = validate(task, batch, tmp_path)
    # Row 0 names its reference's events (fast clicks, a middle beep): right; row 1 chose its
    # answer's letter: right. Scored as a caption too, row 1 ("(a)") would halve the event
    # accuracy.
    assert metrics["val/event_accuracy"] == 1.0
    assert metrics["val/accuracy"] == 1.0 and metrics["val/items"] == 1.0


def test_the_frozen_encoder_and_llm_stay_bit_identical_after_a_training_step():
    task, tokenizer = build("model.encoder.freeze=true", "model.finetuning.freeze_decoder=true")
    batch = caption_batch(task, tokenizer, CAPTIONS[:2], [[c] for c in CAPTIONS[:2]])
    before = {k: v.clone() for k, v in task.state_dict().items()}
    task.hparams.warmup_steps = 1
    L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
              ).fit(task, train_dataloaders=DataLoader([batch], batch_size=None))
    after = task.state_dict()
    moved = {k for k, v in before.items() if not torch.equal(after[k], v)}
    assert moved and all(k.startswith("model.projector.") for k in moved), sorted(moved)[:3]


def test_predict_on_a_saved_checkpoint(tmp_path):
    task, tokenizer = build()
    batch = caption_batch(task, tokenizer, CAPTIONS[:2], [[c] for c in CAPTIONS[:2]])
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(task, train_dataloaders=DataLoader([batch], batch_size=None))
    path = tmp_path / "prefix.ckpt"
    trainer.save_checkpoint(path, weights_only=True)
    wave = np.random.default_rng(0).standard_normal(2400).astype(np.float32)
    task.eval()
    expected = task.generate_captions(torch.from_numpy(wave)[None], torch.tensor([2400]))
    model, loaded_tokenizer = mmtf.load(path)
    assert loaded_tokenizer == tokenizer and model.chat_template == task.chat_template
    assert model.caption([wave]) == expected
    answers = model.answer([wave, wave], ["<|audio|>\nHow many events?", "Is it loud? <|audio|>"])
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    with pytest.raises(UserError, match=r"prompt 0 \('How many events\?'\) has no media "
                                        r"placeholder <\|audio\|>") as err:
        model.answer([wave], ["How many events?"])
    assert "\n" not in str(err.value)


def test_a_prefix_longer_than_the_llm_positions_is_one_line():
    task, _ = build("model.decoder.max_len=24", "model.generation.max_new_tokens=1")
    wave = torch.randn(1, 48000)           # 3 s: 75 encoder frames of 40 ms -> 19 positions
    with pytest.raises(UserError, match=r"item 0 is 2\d positions once spliced \(\d+ text tokens "
                                        r"\+ 19 media positions\), more than the LLM's 24 "
                                        r"\(max_position_embeddings\)") as err:
        task.generate_captions(wave, torch.tensor([48000]))
    assert "\n" not in str(err.value)


def llm_folder_task(folder: Path, *overrides: str):
    """A prefix task on a random-weight Llama folder saved by transformers (its tokenizer.json,
    ChatML template, <|endoftext|> eos), composed as the README's recipe."""
    from tests.unit.pretrained.tiny_hf import write_llm

    write_llm(folder, hidden=32, layers=1, max_positions=128)
    cfg = composed("model.grow_vocab=true", *overrides, llm=[
        "model/decoder=llm", f"model.decoder.pretrained={folder}", "tokenizer=pretrained",
        f"tokenizer.path={folder}"])
    task = instantiate(cfg.model)
    tokenizer = build_tokenizer(OmegaConf.to_container(cfg.tokenizer, resolve=True))
    return task, tokenizer


def test_a_pretrained_llm_folder_brings_its_tokenizer_and_template(tmp_path):
    task, tokenizer = llm_folder_task(tmp_path)
    vocab = task.model.decoder.vocab_size
    task.use_tokenizer(tokenizer)
    # <|audio|> was no token of the folder: added as one, past the vocabulary, and the LLM
    # grew by that one row (model.grow_vocab=true).
    assert tokenizer.token_to_id("<|audio|>") == vocab == task.model.media_token_id
    assert task.model.decoder.vocab_size == vocab + 1
    assert task.chat_template.render([{"role": "user", "content": "x"}],
                                     add_generation_prompt=True) == \
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert task.stop_id == tokenizer.token_to_id("<|im_end|>")
    x, x_mask = media()
    replies = task.generate_texts(x, x_mask, *task.encode_prompts(["<|audio|> hi"] * 2))
    assert len(replies) == 2 and all(isinstance(r, str) for r in replies)


def test_a_missing_chat_template_is_one_line(tmp_path):
    task, tokenizer = llm_folder_task(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"chat_template"', '"no_template"'))
    task.use_tokenizer(tokenizer)
    with pytest.raises(UserError, match=r"has none \(no chat_template.jinja and no "
                                        r"'chat_template' in tokenizer_config.json\)") as err:
        task.text_context()
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"chat template 'vicuna' is not built in"):
        build("model.chat_template=vicuna")[0].text_context()
