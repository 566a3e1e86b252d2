"""The built-in sets' data modules (generate, then read with mmtf.data's readers) and the caption
parsers found by the set's name, as the captioning task's event accuracy looks them up."""

from __future__ import annotations

import pytest

from mmtf.data import CaptionDataModule, ClassificationDataModule
from mmtf.errors import UserError
from mmtf.synthetic import (
    SETS,
    SyntheticCaptionDataModule,
    SyntheticClassificationDataModule,
    audio,
    caption_parser,
    image,
)
from mmtf.synthetic.cache import MARKER
from mmtf.text import BPETokenizer
from tests.unit.data.conftest import TINY_AUDIO
from tests.unit.presets import flat
from tests.unit.tasks.conftest import captioner


def test_caption_module_generates_the_set_then_reads_it_as_clotho(tmp_path):
    dm = flat(SyntheticCaptionDataModule, format="clotho", root=str(tmp_path / "set"), batch_size=4,
                                    synthetic={"kind": "audio_captions", **TINY_AUDIO})
    assert isinstance(dm, CaptionDataModule) and not (tmp_path / "set").exists()
    dm.setup("fit")                       # reading a split generates the set first
    assert (tmp_path / "set" / MARKER).is_file() and len(dm.items("train")) == 6
    dm.connect(BPETokenizer.train(dm.train_captions(), vocab_size=200))
    refs = [r for b in dm.val_dataloader() for r in b["references"]]
    assert len(refs) == 3
    parser = caption_parser("audio_captions")
    assert parser is audio.parse_caption and all(parser(c) for rr in refs for c in rr)


def test_classification_module_generates_an_image_folder(tmp_path):
    dm = flat(SyntheticClassificationDataModule,
        format="image_folder", root=str(tmp_path / "set"), batch_size=4,
        synthetic={"kind": "image_labels", "num_train": 4, "num_val": 4, "num_test": 4,
                   "image_size": 32, "num_workers": 0})
    assert isinstance(dm, ClassificationDataModule)
    dm.setup("fit")
    assert dm.class_names == ["circle", "cross", "square", "triangle"]


def test_kind_must_write_the_format(tmp_path):
    with pytest.raises(UserError, match=r"synthetic\.kind \('image_captions'\) does not write "
                                        r"format 'clotho'; kinds: .*'image_captions': 'coco'"):
        flat(SyntheticCaptionDataModule, format="clotho", root=str(tmp_path),
                                   synthetic={"kind": "image_captions"})
    with pytest.raises(UserError, match=r"synthetic\.kind \('video'\) does not write"):
        flat(SyntheticClassificationDataModule, format="esc50", root=str(tmp_path),
                                          synthetic={"kind": "video"})


def test_parsers_are_found_by_the_set_name():
    assert caption_parser("image_captions") is image.parse_caption
    for name in ("audio_labels", "audio_qa", "image_labels", "clotho", None):
        assert caption_parser(name) is None
    assert {k: row.format for k, row in SETS.items()} == {
        "audio_captions": "clotho", "audio_labels": "esc50", "audio_qa": "aqa",
        "image_captions": "coco", "image_labels": "image_folder"}


def test_the_task_looks_up_the_parser_of_its_run_data():
    """Event accuracy follows the run's data set name (data.synthetic.kind), not the data module."""
    task = captioner()
    assert task.event_parser() is None                          # no run config (a bare task)
    task.run_config = {"data": {"format": "clotho", "root": "/data/clotho"}}
    assert task.event_parser() is None                          # real data: no event accuracy
    task.run_config = {"data": {"synthetic": {"kind": "image_captions"}}}
    assert task.event_parser() is image.parse_caption
