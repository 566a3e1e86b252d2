"""metrics_backend=aac: aac-metrics scores what runs offline exactly as mmtf does, and what needs
its downloaded files is unavailable with a reason naming the fix (never 0)."""

from __future__ import annotations

import sys

import pytest

from mmtf.errors import UserError
from mmtf.metrics import ALL_METRICS, FAST_METRICS, CaptionMetrics, caption_metrics
from mmtf.metrics import aac as aac_backend
from tests.unit.metrics.fixtures import CANDIDATES, REFERENCES
from tests.unit.tasks.conftest import captioner

NEEDS_DOWNLOAD = {"meteor", "spice", "spider", "spider_fl"}


@pytest.fixture
def empty_aac_cache(monkeypatch, tmp_path):
    """aac-metrics looking at an empty cache: what a machine without aac-metrics-download has."""
    pytest.importorskip("aac_metrics")
    monkeypatch.setenv("AAC_METRICS_CACHE_PATH", str(tmp_path / "aac"))
    monkeypatch.setenv("FENSE_DATA", str(tmp_path / "fense"))


def test_aac_offline_metrics_equal_mmtf(empty_aac_cache):
    """The independent implementation (aac-metrics' BLEU/ROUGE-L/CIDEr-D) on the same tokens."""
    ours = caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS)
    theirs = caption_metrics(CANDIDATES, REFERENCES, metrics=FAST_METRICS, backend="aac")
    assert set(theirs) == set(ours) == {"bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l",
                                        "cider_d"}
    for name, value in ours.items():
        assert theirs[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert ours["cider_d"] > 0.1 and ours["bleu_4"] > 0.01      # a corpus that scores something


def test_aac_without_downloads_is_unavailable_never_zero(empty_aac_cache):
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=None, backend="aac")
    assert not NEEDS_DOWNLOAD & set(scores)
    assert set(scores.unavailable) == NEEDS_DOWNLOAD
    for name in NEEDS_DOWNLOAD:
        assert "aac-metrics-download" in scores.unavailable[name], name


def test_spider_from_aac_and_fluency_model_missing(empty_aac_cache, monkeypatch):
    """SPICE files present (faked), the FENSE checkpoint absent: SPIDEr and SPICE come from
    aac-metrics' spider(), SPIDEr-FL is unavailable with the checkpoint's path and the fix."""
    monkeypatch.setattr(aac_backend, "_missing_java_files", lambda name: None)
    functional = aac_backend._functional()
    calls = []

    def fake_spider(cands, refs, **kwargs):
        calls.append(len(cands))
        return {"cider_d": 1.0, "spice": 0.2, "spider": 0.6}, {}

    monkeypatch.setattr(functional, "spider", fake_spider)
    monkeypatch.setattr(functional, "meteor", lambda c, r, **kw: ({"meteor": 0.3}, {}))
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=["spice", "spider", "spider_fl"],
                             backend="aac")
    assert calls == [len(CANDIDATES)]
    assert dict(scores) == {"spice": 0.2, "spider": 0.6}
    reason = scores.unavailable["spider_fl"]
    assert "echecker_clotho_audiocaps_base.ckpt" in reason and "aac-metrics-download" in reason


def test_aac_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "aac_metrics", None)     # import aac_metrics -> ImportError
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=ALL_METRICS, backend="aac")
    assert dict(scores) == {}
    assert set(scores.unavailable) == set(ALL_METRICS)
    assert all("pip install 'mmtf[aac]'" in r for r in scores.unavailable.values())


def test_mmtf_backend_spider_fl_reason_names_the_aac_backend():
    scores = caption_metrics(CANDIDATES, REFERENCES, metrics=["spider_fl"])
    assert "model.metrics_backend=aac" in scores.unavailable["spider_fl"]


def test_unknown_backend_is_a_user_error():
    with pytest.raises(UserError, match=r"model.metrics_backend \('coco'\) must be one of"):
        CaptionMetrics(backend="coco")
    with pytest.raises(UserError, match=r"model.metrics_backend \('x'\)"):
        caption_metrics(CANDIDATES, REFERENCES, backend="x")


def test_captioning_task_scores_with_its_backend(empty_aac_cache):
    task = captioner(metrics_backend="aac")
    metrics = task.caption_metrics["test"]
    metrics.update(CANDIDATES, REFERENCES)
    scores = metrics.compute()
    assert "cider_d" in scores and "spider" in metrics.unavailable
    assert "aac-metrics-download" in metrics.unavailable["spider"]
    task.set_metrics_backend("mmtf")
    assert {m.backend for m in task.caption_metrics.values()} == {"mmtf"}
