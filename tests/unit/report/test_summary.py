"""Best metrics by the experiment's mode, the config diff against the experiment's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from mmtf.report import summarize

from .fixtures import csv_rows, make_run

CONF = Path(__file__).resolve().parents[3] / "conf"
BASE = {"task_name": "audio_captioning", "optimized_metric": "val/event_accuracy",
        "data": {"batch_size": 16}, "trainer": {}}


@pytest.mark.parametrize(("mode", "value", "epoch", "step"), [("max", 0.70, 1, 19),
                                                              ("min", 0.20, 0, 9)])
def test_best_optimized_metric_follows_optimized_mode(tmp_path, mode, value, epoch, step):
    run = make_run(tmp_path / "run", config={**BASE, "optimized_mode": mode}, rows=csv_rows())
    best = summarize(run).optimized
    assert (best.key, best.mode, best.value, best.epoch, best.step) == (
        "val/event_accuracy", mode, value, epoch, step)


def test_losses_are_best_lowest_and_scores_highest(tmp_path):
    run = make_run(tmp_path / "run", config={**BASE, "optimized_mode": "max"}, rows=csv_rows())
    ranked = summarize(run).best
    best = {b.key: b for b in ranked}
    loss = best["val/loss"]
    assert (loss.mode, loss.value, loss.step) == ("min", 2.5, 19)
    assert (best["val/bleu_1"].value, best["val/bleu_1"].epoch) == (pytest.approx(0.3), 2)
    assert best["val/loss"].last == 2.7
    assert ranked[0].key == "val/event_accuracy"
    assert not any(k.startswith(("test/", "train/")) for k in best)


def _composed(overrides: list[str], run_dir: Path) -> dict:
    """The run's resolved config as `python -m mmtf.train` saves it (config.yaml)."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)      # train.py sets Hydra's run dir here
    return OmegaConf.to_container(cfg, resolve=True)


def test_config_diff_lists_exactly_the_changed_keys(tmp_path):
    run_dir = tmp_path / "run"
    overrides = ["experiment=audio_captioning", "trainer.max_epochs=3",
                 "model.optimizer.lr=0.003", "callbacks.rich_progress_bar=null",
                 "+trainer.detect_anomaly=true", f"paths.data_dir={tmp_path}/data"]
    config = _composed(overrides, run_dir)
    make_run(run_dir, config=config, overrides=overrides, rows=csv_rows())
    summary = summarize(run_dir)
    changes = {c.key: (c.default, c.value) for c in summary.changes}
    # paths.*, the data root and the output dirs moved too, and are not listed.
    assert set(changes) == {"trainer.max_epochs", "model.optimizer.lr",
                            "callbacks.rich_progress_bar", "trainer.detect_anomaly"}
    # the experiment's own values, composed without the overrides (the recipe may change)
    defaults = _composed(["experiment=audio_captioning", f"paths.data_dir={tmp_path}/data"],
                         run_dir)
    assert changes["trainer.max_epochs"] == (defaults["trainer"]["max_epochs"], 3)
    assert changes["model.optimizer.lr"] == (defaults["model"]["optimizer"]["lr"], 0.003)
    assert defaults["trainer"]["max_epochs"] != 3 and defaults["model"]["optimizer"]["lr"] != 0.003
    assert changes["callbacks.rich_progress_bar"][1] is None
    markdown = summary.to_markdown()
    assert "| `trainer.detect_anomaly` | (absent) | `True` |" in markdown
    assert "## Config vs. the defaults of `experiment=audio_captioning`" in markdown


def test_markdown_names_best_metric_time_and_throughput(tmp_path):
    lines = ["[2026-11-30 10:00:00,000][mmtf.train][INFO] - start",
             "[2026-11-30 10:01:00,000][mmtf.train][INFO] - end"]
    run = make_run(tmp_path / "run", config={**BASE, "optimized_mode": "max"}, rows=csv_rows(),
                   metrics={"test/event_accuracy": 0.65}, log_lines=lines)
    (run / "samples").mkdir()
    for name in ("val_epoch000_step0000009.md", "val_epoch002_step0000029.md",
                 "val_epoch001_step0000019.md", "test_epoch003_step0000030.md"):
        (run / "samples" / name).write_text("| id | prediction | reference |\n")
    text = summarize(run).to_markdown(image="learning_curves.png")
    assert "- last val captions: `samples/val_epoch002_step0000029.md`" in text
    assert "- last test captions: `samples/test_epoch003_step0000030.md`" in text
    assert "- best `val/event_accuracy` (max): **0.7000** (epoch 1, step 19)" in text
    assert "- wall time: **1m 00s** (first to last line of audio_captioning.log)" in text
    # steps 4..29 logged (26 steps) in 60 s, 16 samples per step.
    assert "**0.43 steps/s**, ≈ 6.9 samples/s at 16 samples per step" in text
    assert "- logs read: `csv/metrics.csv`, 0 TensorBoard event file(s)" in text
    assert "| `test/event_accuracy` | 0.6500 |" in text
    assert "![learning curves](learning_curves.png)" in text


def test_an_experiment_that_no_longer_composes_skips_the_diff_and_says_so(tmp_path):
    run = make_run(tmp_path / "run", config={**BASE, "optimized_mode": "max"}, rows=csv_rows(),
                   overrides=["experiment=renamed_since"])
    summary = summarize(run)
    assert summary.changes == []
    assert summary.notes[0].startswith(
        "config diff skipped: the experiment's defaults do not compose (In 'train': Could not "
        "find 'experiment/renamed_since'")
    assert summary.optimized.value == 0.70          # the rest of the report is still there


def test_markdown_shows_the_newest_errors_table_of_each_split(tmp_path):
    from mmtf.metrics.wer import error_rates, write_errors_csv

    run = make_run(tmp_path / "run", config={**BASE, "optimized_mode": "max"}, rows=csv_rows())
    old = error_rates(["a b"], ["a b"], ids=["u0"])
    new = error_rates(["the cat sat", "a dog | barks"], ["the cat sat down", "a dog barks"],
                      normalizer="none", ids=["u1", "u2"])
    write_errors_csv(run / "errors" / "val_epoch000_step0000009.csv", old.utterances)
    write_errors_csv(run / "errors" / "val_epoch001_step0000019.csv", new.utterances)
    text = summarize(run).to_markdown()
    assert "## Per-utterance errors, val (`errors/val_epoch001_step0000019.csv`)" in text
    assert "2 utterances: 0 substitutions, 1 deletions, 1 insertions, 6 hits." in text
    rows = [line for line in text.splitlines() if line.startswith("| u")]
    assert rows[0].startswith("| u2 | 0.333 | 0 | 0 | 1 | a dog barks | a dog \\| barks |")
    assert rows[1].startswith("| u1 | 0.250 | 0 | 1 | 0 |") and len(rows) == 2
