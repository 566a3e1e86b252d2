"""Contrastive retrieval through ``mmtf.train`` (conf/model/contrastive.yaml and the retrieval
experiments) at dim 32: trains, resumes, scores retrieval with the built-in relevance and its
chance level, classifies zero-shot from the checkpoint, takes a BERT-family tower's tokenizer,
and refuses a batch of one in one line."""

from __future__ import annotations

import json

import pytest

from mmtf.checkpoint_io import load_checkpoint
from mmtf.errors import ConfigError
from mmtf.tasks.resolve import stored_tokenizer
from mmtf.text import BPETokenizer, PretrainedTokenizer
from mmtf.train import train

from .conftest import cli_in_process, compose_train, tiny_overrides

pytestmark = pytest.mark.timeout(300)

LABELS = ["data.synthetic.num_clips=18", "data.synthetic.min_seconds=1.0",
          "data.synthetic.max_seconds=1.5", "data.synthetic.num_workers=0",
          "data.loader.num_workers=0", "data.loader.persistent_workers=false"]


def test_audio_text_retrieval_trains_resumes_and_classifies_zero_shot(data_dir, tmp_path,
                                                                     monkeypatch):
    run = tmp_path / "run"
    train(compose_train(tiny_overrides("audio_text_retrieval", data_dir,
                                       "trainer.max_epochs=2"), run))
    metrics = json.loads((run / "metrics.json").read_text())
    for direction in ("text_to_audio", "audio_to_text"):
        for name in ("R@1", "R@10", "mAP@10", "mAP@16"):
            assert 0.0 <= metrics[f"test/{direction}/{name}"] <= 1.0
            assert 0.0 < metrics[f"test/{direction}/chance/{name}"] <= 1.0
    assert metrics["train_flops"] > 0 and metrics["train_samples"] == 2 * 12
    last = run / "checkpoints" / "last.ckpt"
    state = load_checkpoint(last)
    assert state["global_step"] == 2 * 3                       # 12 clips in batches of 4
    assert isinstance(stored_tokenizer(state), BPETokenizer)   # the run's own, trained
    stored = state["mmtf"]["config"]
    assert stored["model"]["_target_"] == "mmtf.tasks.ContrastiveTask"
    assert stored["model"]["text_encoder"]["vocab_size"] == 128     # tokenizer.vocab_size
    assert stored["data"]["captions_per_item"] == 5

    train(compose_train(tiny_overrides("audio_text_retrieval", data_dir, "ckpt_path=last",
                                       "trainer.max_epochs=3", "test=false"), run))
    assert load_checkpoint(last)["global_step"] == 3 * 3

    # Both towers reused through pretrained=: the text tower's export carries its BPE, which
    # the next run takes instead of training one.
    for part in ("encoder", "text_encoder"):
        out = cli_in_process("mmtf.export", [f"ckpt_path={last}", f"part={part}",
                                             f"out={tmp_path / part}",
                                             f"hydra.run.dir={tmp_path / ('x' + part)}"],
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
    reuse = tmp_path / "reuse"
    monkeypatch.setattr(BPETokenizer, "train", classmethod(
        lambda cls, *a, **k: pytest.fail("the reuse run trained a tokenizer")))
    train(compose_train(tiny_overrides("audio_text_retrieval", data_dir, "trainer.max_epochs=1",
                                       "test=false", f"model.encoder.pretrained={tmp_path}/encoder",
                                       f"model.text_encoder.pretrained={tmp_path}/text_encoder"),
                        reuse))
    assert stored_tokenizer(load_checkpoint(reuse / "checkpoints" / "last.ckpt")) \
        == stored_tokenizer(state)

    out = cli_in_process("mmtf.zero_shot", [f"ckpt_path={last}", f"paths.data_dir={data_dir}",
                                            *LABELS, "accelerator=cpu",
                                            f"hydra.run.dir={tmp_path / 'zs'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads((tmp_path / "zs" / "metrics.json").read_text())
    # fold 5 of 18 clips (clip i in fold i % 5 + 1): clips 4, 9, 14, classes 4, 0, 5
    assert got["test/zero_shot/count"] == 3
    assert got["test/zero_shot/chance"] == pytest.approx(1 / 3)
    assert got["prompts"][0] == "the sound of a low tone"
    assert got["test/zero_shot/accuracy"] in (0.0, 1 / 3, 2 / 3, 1.0)


def test_image_text_retrieval_reports_image_metrics(data_dir, tmp_path):
    train(compose_train(tiny_overrides("image_text_retrieval", data_dir,
                                       "trainer.max_epochs=1"), tmp_path))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert 0.0 <= metrics["test/text_to_image/mAP@10"] <= 1.0
    assert metrics["test/text_to_image/chance/R@1"] > 0.0


def test_a_batch_of_one_is_one_line_with_the_fix(data_dir, tmp_path):
    args = [*tiny_overrides("audio_text_retrieval", data_dir, "data.batches.batch_size=1"),
            f"hydra.run.dir={tmp_path / 'run'}"]
    out = cli_in_process("mmtf.train", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert out.returncode == 2, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("mmtf: error: ConfigError: data.batches.batch_size=1 on 1 rank(s): "
                           "a global batch of one item has no negative"), line
    assert "set data.batches.batch_size >= 2" in line


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.unit.pretrained.tiny_hf import write_bert

    folder = tmp_path_factory.mktemp("bert")
    write_bert(folder)                       # dim 32, 2 layers, 40 positions, WordPiece
    return folder


BERT_SIZES = [f"model.text_encoder.{k}=null"
              for k in ("vocab_size", "dim", "depth", "num_heads", "mlp_hidden", "max_len")]


def test_a_bert_tower_brings_its_tokenizer_and_a_different_one_is_refused(data_dir, tmp_path,
                                                                            bert_folder):
    bert = ["model/text_encoder=bert", f"model.text_encoder.pretrained={bert_folder}",
            *BERT_SIZES, "data.max_caption_tokens=40"]
    run = tmp_path / "run"
    train(compose_train(tiny_overrides("audio_text_retrieval", data_dir, *bert,
                                       "trainer.max_epochs=1", "test=false"), run))
    stored = stored_tokenizer(load_checkpoint(run / "checkpoints" / "last.ckpt"))
    # the folder's WordPiece (120 tokens), not a BPE trained on the captions
    assert isinstance(stored, PretrainedTokenizer)
    assert stored == PretrainedTokenizer.from_folder(bert_folder)
    # another tokenizer read from a file: refused, naming both and the fix
    other = tmp_path / "bpe.json"
    BPETokenizer.train(["a low tone", "a rising chirp"], vocab_size=64).save(other)
    cfg = compose_train(tiny_overrides("audio_text_retrieval", data_dir, *bert, "tokenizer=saved",
                                       f"tokenizer.path={other}"), tmp_path / "bad")
    with pytest.raises(ConfigError, match=rf"tokenizer \(kind: saved, path: {other}\) differs "
                                          rf"from the tokenizer of model.text_encoder.pretrained"
                                          rf" \({bert_folder}\).*tokenizer=pretrained"):
        train(cfg)

