"""caption_metrics and CaptionMetrics: keys, unavailable metrics, errors, accumulation, DDP."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mmtf.metrics import (
    ALL_METRICS,
    FAST_METRICS,
    CaptionMetrics,
    CaptionRow,
    MetricUnavailable,
    caption_metrics,
    ptb_words,
)
from mmtf.metrics import java as java_metrics
from tests.unit.metrics.fixtures import CANDIDATES, REFERENCES

FAST_KEYS = {"bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider_d"}


@pytest.fixture
def fake_spice(monkeypatch):
    """SPICE present, with a fixed score: what is tested is how SPIDEr and the unavailable
    list are composed (the real jar: test_real_spice_...)."""
    monkeypatch.setattr(java_metrics, "spice", lambda c, r, timeout_s: 0.25)


@pytest.fixture
def no_meteor(monkeypatch):
    def fail(c, r, timeout_s):
        raise MetricUnavailable("no METEOR in this test")
    monkeypatch.setattr(java_metrics, "meteor", fail)


def test_fast_keys():
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS)
    assert set(scores) == FAST_KEYS and scores.unavailable == {}


def test_all_metrics_with_spice(fake_spice, no_meteor):
    scores = caption_metrics(CANDIDATES, REFERENCES)
    unavailable = scores.unavailable
    assert set(scores) == FAST_KEYS | {"spice", "spider"}
    assert scores["spider"] == pytest.approx((scores["cider_d"] + 0.25) / 2, rel=1e-12)
    # Unavailable metrics are absent, not zero, and each has a reason.
    assert set(unavailable) == {"meteor", "spider_fl"} and unavailable is not None
    assert unavailable["meteor"] == "no METEOR in this test"
    assert "FENSE" in unavailable["spider_fl"]


def test_spider_alone_does_not_report_its_ingredients(fake_spice):
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=["spider"])
    assert list(scores) == ["spider"]


def test_spice_jars_missing_is_unavailable_with_reason(monkeypatch, tmp_path, no_meteor):
    """Detection, not download: a pycocoevalcap dir without the CoreNLP jars."""
    (tmp_path / "spice" / "lib").mkdir(parents=True)
    (tmp_path / "spice" / "spice-1.0.jar").write_bytes(b"")
    monkeypatch.setattr(java_metrics, "_pycocoevalcap_dir", lambda: tmp_path)
    monkeypatch.setattr(java_metrics.shutil, "which", lambda name: "/usr/bin/java")
    scores = caption_metrics(CANDIDATES, REFERENCES)
    assert not {"spice", "spider", "spider_fl", "meteor"} & set(scores)
    reason = scores.unavailable["spice"]
    assert "stanford-corenlp-3.6.0.jar" in reason and "stanford-corenlp-3.6.0-models.jar" in reason
    assert "never downloads" in reason
    assert scores.unavailable["spider"].startswith("SPIDEr = (CIDEr-D + SPICE) / 2 needs SPICE")


def _spice_or_skip() -> None:
    try:
        java_metrics.spice_command()
    except MetricUnavailable as why:
        pytest.skip(f"real SPICE not runnable here: {why}")


@pytest.mark.slow
def test_real_spice_scores_in_the_unit_range_and_ranks_a_perfect_caption_first():
    """The real jar (java + spice-1.0.jar + CoreNLP jars) where present; skipped otherwise."""
    _spice_or_skip()
    refs = [["a dog barks at a cat"], ["two birds sing in a tree"]]
    perfect = caption_metrics(["a dog barks at a cat", "two birds sing in a tree"], refs,
                              metrics=["spice", "spider"], java_timeout_s=600)
    wrong = caption_metrics(["a red car", "a man eats soup"], refs, metrics=["spice"],
                            java_timeout_s=600)
    assert perfect.unavailable == {} and 0.0 <= wrong["spice"] < perfect["spice"] <= 1.0
    assert perfect["spice"] == pytest.approx(1.0)
    cider = caption_metrics(["a dog barks at a cat", "two birds sing in a tree"], refs,
                            metrics=["cider_d"])["cider_d"]
    assert perfect["spider"] == pytest.approx((cider + perfect["spice"]) / 2, rel=1e-12)


def test_no_java_is_unavailable_with_reason(monkeypatch):
    monkeypatch.setattr(java_metrics.shutil, "which", lambda name: None)
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=["cider_d", "meteor", "spice"])
    assert set(scores) == {"cider_d"}
    assert "no `java` on PATH" in scores.unavailable["meteor"]
    assert "no `java` on PATH" in scores.unavailable["spice"]


def test_meteor_jar_missing(monkeypatch, tmp_path):
    (tmp_path / "meteor").mkdir()
    monkeypatch.setattr(java_metrics, "_pycocoevalcap_dir", lambda: tmp_path)
    monkeypatch.setattr(java_metrics.shutil, "which", lambda name: "/usr/bin/java")
    scores = caption_metrics(["a dog"], [["a dog"]], metrics=["meteor"])
    assert scores == {} and "meteor-1.5.jar is missing" in scores.unavailable["meteor"]


FAKE_METEOR = """#!{python}
# Speaks METEOR's -stdio protocol: a SCORE line gets "stats" (here: the hypothesis and the
# reference count), an EVAL line gets one score per item and then the corpus score.
import sys, time
mode = {mode!r}
if mode == "die":
    sys.exit(1)
if mode == "hang":
    time.sleep(60)
for line in sys.stdin:
    fields = line.rstrip("\\n").split(" ||| ")
    if fields[0] == "SCORE":
        print(f"{{len(fields[-1].split())}} {{len(fields) - 2}}", flush=True)
    elif fields[0] == "EVAL":
        stats = [s.split() for s in fields[1:]]
        for words, refs in stats:
            print(float(words) / float(refs), flush=True)
        print(sum(float(w) for w, _ in stats), flush=True)
"""


@pytest.fixture
def fake_meteor(monkeypatch, tmp_path):
    """A pycocoevalcap dir with placeholder METEOR files and a fake `java` executable."""
    (tmp_path / "meteor" / "data").mkdir(parents=True)
    (tmp_path / "meteor" / "meteor-1.5.jar").write_bytes(b"")
    (tmp_path / "meteor" / "data" / "paraphrase-en.gz").write_bytes(b"")
    monkeypatch.setattr(java_metrics, "_pycocoevalcap_dir", lambda: tmp_path)

    def install(mode: str) -> None:
        exe = tmp_path / f"java-{mode}"
        exe.write_text(FAKE_METEOR.format(python=sys.executable, mode=mode))
        exe.chmod(0o755)
        monkeypatch.setattr(java_metrics.shutil, "which", lambda name: str(exe))
    return install


def test_meteor_protocol(fake_meteor):
    """One SCORE line per item ('|||' removed, it separates fields), then EVAL; the corpus
    score is METEOR's last line (here: the sum of the hypothesis word counts)."""
    fake_meteor("ok")
    cands = ["A dog|||barks.", "", "a cat"]
    refs = [["a dog barks", "x"], ["y"], ["a cat", "b", "c"]]
    scores = caption_metrics(cands, refs, metrics=["meteor"], tokenize=False)
    assert scores.unavailable == {}
    assert scores["meteor"] == 3 + 0 + 2


@pytest.mark.parametrize("mode, match", [("die", r"METEOR closed its output early"),
                                          ("hang", r"killed after timeout_s")])
def test_meteor_failure_is_unavailable(fake_meteor, mode, match):
    fake_meteor(mode)
    scores = caption_metrics(["a dog"], [["a dog"]], metrics=["meteor", "bleu_1"],
                             java_timeout_s=2.0)
    assert list(scores) == ["bleu_1"]
    assert re.search(match, scores.unavailable["meteor"])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="METEOR needs a Java runtime")
def test_meteor_matches_pycocoevalcap():
    """Runs the real jar twice, ours and pycocoevalcap's wrapper, side by side (~20-50 s)."""
    from pycocoevalcap.meteor.meteor import Meteor

    cands, refs = CANDIDATES[:10], REFERENCES[:10]
    gts = {i: [" ".join(ptb_words(r)) for r in rs] for i, rs in enumerate(refs)}
    res = {i: [" ".join(ptb_words(c))] for i, c in enumerate(cands)}
    scorer = Meteor()  # starts its JVM now; it loads the paraphrase table while ours runs
    try:
        ours = caption_metrics(cands, refs, metrics=["meteor"])
        expected, _ = scorer.compute_score(gts, res)
    finally:
        del scorer
    assert ours.unavailable == {}
    assert ours["meteor"] == pytest.approx(expected, abs=1e-6)
    assert 0.1 < ours["meteor"] < 0.9


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("cands, refs, exc, match", [
    (["a"], [["a"], ["b"]], ValueError, r"len\(candidates\) \(1\) != len\(references\) \(2\)"),
    ([], [], ValueError, r"candidates is empty"),
    (["a", "b"], [["a"], "b"], TypeError, r"references\[1\] must be a list of strings, got a str"),
    (["a", "b"], [["a"], []], ValueError, r"references\[1\] is empty"),
    (["a", None], [["a"], ["b"]], TypeError, r"candidates\[1\] must be a str, got NoneType"),
    (["a"], [["a", 3]], TypeError, r"references\[0\]\[1\] must be a str, got int"),
    ("a dog", [["a dog"]], TypeError, r"must be lists, not one str"),
])
def test_bad_inputs(cands, refs, exc, match):
    with pytest.raises(exc, match=match):
        caption_metrics(cands, refs, metrics=FAST_METRICS)


def test_unknown_metric_name():
    with pytest.raises(ValueError, match=r"metrics contains unknown name \('cider'\)"):
        caption_metrics(["a"], [["a"]], metrics=["bleu", "cider"])
    with pytest.raises(ValueError, match=r"unknown name \('blue_4'\)"):
        CaptionMetrics(metrics=["blue_4"])


def test_metric_selection_and_order():
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=["cider_d", "bleu_4"])
    assert list(scores) == ["cider_d", "bleu_4"]
    assert set(ALL_METRICS) >= FAST_KEYS


# ---------------------------------------------------------------- CaptionMetrics
def test_accumulator_equals_one_call():
    acc = CaptionMetrics(metrics=FAST_METRICS)
    for start in range(0, len(CANDIDATES), 7):  # uneven batches
        acc.update(CANDIDATES[start:start + 7], REFERENCES[start:start + 7])
    acc.update([], [])  # an empty batch adds nothing
    assert len(acc) == len(CANDIDATES)
    assert acc.compute() == caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS)
    assert acc.unavailable == {}
    acc.reset()
    assert len(acc) == 0
    with pytest.raises(ValueError, match=r"no captions were accumulated; call update\(\)"):
        acc.compute()


def test_accumulator_dedupes_by_key():
    acc = CaptionMetrics(metrics=FAST_METRICS)
    acc.update(CANDIDATES[:5], REFERENCES[:5], keys=list(range(5)))
    acc.update(CANDIDATES[:2], REFERENCES[:2], keys=torch.tensor([0, 1]))  # sampler padding
    rows = acc.gather()
    assert [r.key for r in rows] == [0, 1, 2, 3, 4]
    assert [r.prediction for r in rows] == CANDIDATES[:5]
    assert [r.references for r in rows] == REFERENCES[:5]
    assert acc.compute() == caption_metrics(CANDIDATES[:5], REFERENCES[:5], metrics=FAST_METRICS)


def test_accumulator_without_keys_keeps_duplicates():
    acc = CaptionMetrics(metrics=FAST_METRICS)
    acc.update(CANDIDATES[:2], REFERENCES[:2])
    acc.update(CANDIDATES[:2], REFERENCES[:2])
    assert len(acc.gather()) == 4


def test_accumulator_update_errors():
    acc = CaptionMetrics(metrics=FAST_METRICS)
    with pytest.raises(ValueError, match=r"len\(keys\) \(1\) != len\(candidates\) \(2\)"):
        acc.update(["a", "b"], [["a"], ["b"]], keys=["x"])
    with pytest.raises(ValueError, match=r"len\(candidates\) \(2\) != len\(references\) \(1\)"):
        acc.update(["a", "b"], [["a"]])


def test_gather_is_local_without_process_group():
    assert not dist.is_initialized()
    acc = CaptionMetrics(metrics=FAST_METRICS)
    acc.update(["a dog"], [["a dog barks"]])
    assert acc.gather() == [CaptionRow(None, "a dog", ["a dog barks"])]


def test_single_rank_process_group(tmp_path):
    """The collective path (all_gather_object + broadcast_object_list) with world_size 1."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        acc = CaptionMetrics(metrics=FAST_METRICS)
        acc.update(CANDIDATES, REFERENCES, keys=list(range(len(CANDIDATES))))
        assert acc.compute() == caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS)
    finally:
        dist.destroy_process_group()


def _parity(caption: str) -> int | None:
    """A stand-in event parser: the parity of the word count (never None)."""
    return len(caption.split()) % 2


def _ddp_worker(rank: int, world_size: int, store: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size)
    try:
        n = len(CANDIDATES)
        mine = list(range(rank, n, world_size)) + [0]  # item 0 repeated, as sampler padding
        acc = CaptionMetrics(metrics=FAST_METRICS)
        acc.update([CANDIDATES[i] for i in mine], [REFERENCES[i] for i in mine], keys=mine)
        scores = acc.compute(event_parser=_parity)
        keys = sorted(row.key for row in acc.rows)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"scores": scores,
                                                                 "keys": keys}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_gather_equals_one_process(tmp_path):
    """Two gloo ranks on CPU, item 0 on both (sampler padding): every rank returns the scores
    one process computes on the whole corpus, each item counted once."""
    # forked, not spawned: two new interpreters would spend ~10 s importing torch before gloo
    mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="fork")
    one = CaptionMetrics(metrics=FAST_METRICS)
    one.update(CANDIDATES, REFERENCES, keys=list(range(len(CANDIDATES))))
    expected = one.compute(event_parser=_parity)
    assert set(expected) == FAST_KEYS | {"event_accuracy"}
    direct = caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS)
    assert {k: v for k, v in expected.items() if k != "event_accuracy"} == dict(direct)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["keys"] == list(range(len(CANDIDATES)))
        assert got["scores"] == pytest.approx(expected, abs=1e-12)
