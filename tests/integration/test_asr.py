"""Speech recognition end to end: a random-weight tiny Whisper (saved locally, never
downloaded) fine-tuned on a LibriSpeech-layout set written here, monitored by val/wer; evaluate
writes the per-utterance errors table, the run report shows it; bad input is one line, exit 2."""

from __future__ import annotations

import csv
import json

import jiwer
import pytest
import torch

from mmtf.checkpoint_io import load_checkpoint
from mmtf.evaluate import build_datamodule
from mmtf.report.summary import error_tables
from mmtf.tasks import build_task
from mmtf.text.normalize import get_normalizer
from mmtf.text.prompt import WhisperPrompt
from mmtf.train import train
from tests.unit.data.speech_sets import write_common_voice, write_librispeech

from .conftest import COMMON, cli_in_process, compose_train, evaluate_in_process

pytest.importorskip("transformers")

# The tiny Whisper's decoder has 48 positions: short targets and generations.
TINY = ["model.generation.max_new_tokens=8", "data.max_caption_tokens=44", "data.batches.batch_size=4",
        "model.warmup_steps=1"]


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    from tests.unit.pretrained.tiny_hf import write_whisper

    folder = tmp_path_factory.mktemp("tiny_whisper")
    write_whisper(folder, d_model=32, layers=1)
    return folder


@pytest.fixture(scope="module")
def librispeech(tmp_path_factory):
    return write_librispeech(tmp_path_factory.mktemp("librispeech"),
                             {"train-clean-100": 8, "dev-clean": 4, "test-clean": 4})


@pytest.mark.slow
def test_librispeech_finetune_monitored_by_wer(tiny_whisper, librispeech, tmp_path):
    run = tmp_path / "run"
    cfg = compose_train(["experiment=asr_librispeech", f"pretrained={tiny_whisper}",
                         f"data.root={librispeech}", *COMMON, *TINY, "test=false"], run)
    assert (cfg.optimized_metric, cfg.optimized_mode) == ("val/wer", "min")
    train(cfg)                                         # the test split: by evaluate below
    best = sorted((run / "checkpoints").glob("epoch*.ckpt"))
    callbacks = load_checkpoint(best[0])["callbacks"]
    monitors = {v["monitor"]: v["best_model_score"] for k, v in callbacks.items()
                if k.startswith("ModelCheckpoint")}
    assert list(monitors) == ["val/wer"] and 0 <= float(monitors["val/wer"]) < 10, monitors

    # evaluate: metrics, predictions with the alignment counts, errors.csv; WER equals jiwer's
    out = tmp_path / "eval"
    scores = evaluate_in_process(best[0], out)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    norm = get_normalizer("whisper_english")
    refs = [" ".join(norm(r["references"][0]).split()) for r in rows]
    hyps = [" ".join(norm(r["prediction"]).split()) for r in rows]
    assert scores["test/wer"] == pytest.approx(jiwer.wer(refs, hyps))
    assert all({"substitutions", "deletions", "insertions", "hits"} <= set(r) for r in rows)
    with open(out / "errors.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and {r["reference"] for r in table} == set(refs)
    errors = sum(int(r["substitutions"]) + int(r["deletions"]) + int(r["insertions"])
                 for r in table)
    assert scores["test/wer"] == pytest.approx(errors / sum(len(r.split()) for r in refs))

    # the run report: the newest per-utterance errors table of each split
    report = "\n".join(error_tables(run))     # the section RunSummary.to_markdown adds
    assert "## Per-utterance errors, val" in report and "| id | WER | S | D | I |" in report
    assert {"test/wer", "test/cer"} <= set(scores)
    samples = sorted((run / "samples").glob("val_*.md"))[-1].read_text()
    assert "| S | D | I | WER |" in samples


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:You are trying to `self.log")
def test_common_voice_mp3_trains_with_each_clips_language(tiny_whisper, tmp_path):
    root = write_common_voice(tmp_path / "cv", {"train": 4, "dev": 2, "test": 2}, locale="fr")
    cfg = compose_train(["experiment=asr_common_voice", f"pretrained={tiny_whisper}",
                         f"data.root={root}", *COMMON, *TINY, "trainer.fast_dev_run=true"],
                        tmp_path / "run")
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "test/wer" in metrics

    # Every clip trains and generates with its own prompt: <|fr|> from the TSV's locale.
    ckpt = sorted((tmp_path / "run" / "checkpoints").glob("*.ckpt"))[0]
    task, stored = build_task(load_checkpoint(ckpt), ckpt)
    datamodule = build_datamodule(stored, None)
    datamodule.setup("test")
    datamodule.connect(task.tokenizer)
    batch = next(iter(datamodule.test_dataloader()))
    french = WhisperPrompt(task.tokenizer).build("fr", "transcribe")
    assert batch["tokens"][:, :4].tolist() == [french] * len(batch["ids"])
    seen = []
    generate = task.model.generate

    def recording(*args, **kwargs):
        seen.append(kwargs["prompt_ids"].tolist())
        return generate(*args, **kwargs)

    task.model.generate = recording
    task.eval()
    with torch.no_grad():
        task.test_step(batch, 0)                       # generates and accumulates the scores
    assert seen == [[french] * len(batch["ids"])]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["missing_flac", "unknown_language"])
def test_bad_speech_input_is_one_line_exit_2(case, tiny_whisper, tmp_path):
    if case == "missing_flac":
        experiment = "asr_librispeech"
        root = write_librispeech(tmp_path / "ls", {"train-clean-100": 4, "dev-clean": 2,
                                                   "test-clean": 2})
        gone = sorted((root / "train-clean-100").rglob("*.flac"))[0]
        gone.unlink()
        extra, pattern = [], rf"the transcript line of utterance {gone.stem} has no audio file"
    else:                # a Common Voice folder without a locale column: data.language names it
        experiment = "asr_common_voice"
        root = write_common_voice(tmp_path / "cv", {"train": 2, "dev": 1, "test": 1},
                                  locale=None)
        extra, pattern = ["data.language=xx"], r"unknown language code 'xx'; the model's " \
                                                r"languages are \['en', 'fr'\]"
    args = [f"experiment={experiment}", f"pretrained={tiny_whisper}", f"data.root={root}",
            *COMMON, *TINY, *extra, f"hydra.run.dir={tmp_path / 'run'}"]
    out = cli_in_process("mmtf.train", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("mmtf: error:")]
    assert len(errors) == 1 and __import__("re").search(pattern, errors[0]), out.stderr[-3000:]
