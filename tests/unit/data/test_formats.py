"""Format readers on small fixtures written here: Clotho, AudioCaps, COCO, JSONL manifest,
ESC-50, ImageFolder — good files, and each way an index can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from mmtf.data import DataError
from mmtf.data.errors import ErrorPolicy
from mmtf.data.formats import (
    read_audiocaps,
    read_clotho,
    read_coco,
    read_esc50,
    read_image_folder,
    read_manifest,
)
from tests.unit.data.conftest import sine, write_audio

RAISE = ErrorPolicy("raise")


def _skip() -> ErrorPolicy:
    return ErrorPolicy("skip")


def _png(path: Path, color=(255, 0, 0)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)
    return path


# ------------------------------------------------------------------ Clotho
def _clotho(root: Path, rows: list[str], header="file_name,caption_1,caption_2",
            name="development") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"clotho_captions_{name}.csv").write_text("\n".join([header, *rows]) + "\n")
    return root


def test_clotho_reads_every_caption(tmp_path):
    root = _clotho(tmp_path, ['a.wav,"A dog, barking.",Dog barks', "b.wav,Rain,Rain falls"])
    items = read_clotho(root, "train", report=RAISE)
    assert [i.id for i in items] == ["a", "b"]
    assert items[0].captions == ("A dog, barking.", "Dog barks")
    assert items[0].path == root / "development" / "a.wav"
    assert items[1].where == "clotho_captions_development.csv line 3"


def test_clotho_split_names_and_audio_folder_fallback(tmp_path):
    root = _clotho(tmp_path, ["x.wav,Hi,There"], name="evaluation")
    (root / "clotho_audio_evaluation").mkdir()
    items = read_clotho(root, "test", report=RAISE)
    assert items[0].path == root / "clotho_audio_evaluation" / "x.wav"
    with pytest.raises(DataError, match=r"clotho_captions_validation\.csv.*does not exist") as e:
        read_clotho(root, "val", report=RAISE)
    assert e.value.reason == "missing_split"


def test_clotho_missing_columns_always_raise(tmp_path):
    root = _clotho(tmp_path, ["a.wav,x"], header="fname,caption_1")
    for policy in (RAISE, _skip()):
        with pytest.raises(DataError, match=r"clotho_captions_development\.csv \(line 1\): "
                                            r"clotho CSV is missing column\(s\) \['file_name'\]"):
            read_clotho(root, "train", report=policy)


def test_clotho_empty_captions(tmp_path):
    root = _clotho(tmp_path, ["a.wav,Fine,", "b.wav,  ,", "c.wav,Ok,Ok too"])
    with pytest.raises(DataError, match=r"line 2\): caption_2 is empty") as e:
        read_clotho(root, "train", report=RAISE)
    assert e.value.reason == "empty_caption"
    policy = _skip()
    items = read_clotho(root, "train", report=policy)
    assert [(i.id, len(i.captions)) for i in items] == [("a", 1), ("c", 2)]  # b has none left
    assert policy.counter["empty_caption"] == 3


def test_clotho_short_row_and_empty_file_name(tmp_path):
    root = _clotho(tmp_path, ["a.wav", ",x,y", "c.wav,x,y"])
    policy = _skip()
    items = read_clotho(root, "train", report=policy)
    assert [i.id for i in items] == ["c"]
    assert policy.counter.as_dict() == {"empty_caption": 2, "bad_row": 1}


# ------------------------------------------------------------------ AudioCaps
def test_audiocaps_groups_rows_and_finds_files_by_any_name(tmp_path):
    for stem in ("abc", "Ydef", "501"):
        write_audio(tmp_path / "audio" / "val" / f"{stem}.wav", sine(0.1, 16000))
    write_audio(tmp_path / "audio" / "val" / "ghi_30.flac", sine(0.1, 16000))
    (tmp_path / "val.csv").write_text(
        "audiocap_id,youtube_id,start_time,caption\n"
        "1,abc,0,A car passes\n2,abc,0,A vehicle drives by\n"
        "3,def,10,Birds sing\n501,zzz,5,Wind blows\n4,ghi,30.0,Water runs\n")
    items = {i.id: i for i in read_audiocaps(tmp_path, "val", report=RAISE)}
    assert items["abc"].captions == ("A car passes", "A vehicle drives by")
    assert items["def"].path.name == "Ydef.wav"
    assert items["zzz"].path.name == "501.wav"          # named by audiocap_id
    assert items["ghi"].path.name == "ghi_30.flac"       # <youtube_id>_<start>


def test_audiocaps_missing_audio_names_the_row(tmp_path):
    (tmp_path / "audio").mkdir()
    (tmp_path / "train.csv").write_text("audiocap_id,youtube_id,start_time,caption\n"
                                        "1,nope,0,Silence\n")
    with pytest.raises(DataError, match=r"train\.csv line 2\): no audio file for clip nope"):
        read_audiocaps(tmp_path, "train", report=RAISE)
    policy = _skip()
    assert read_audiocaps(tmp_path, "train", report=policy) == []
    assert policy.counter["missing_file"] == 1


def test_audiocaps_missing_column(tmp_path):
    (tmp_path / "test.csv").write_text("audiocap_id,youtube_id,caption\n1,a,x\n")
    with pytest.raises(DataError, match=r"missing column\(s\) \['start_time'\]") as e:
        read_audiocaps(tmp_path, "test", report=RAISE)
    assert e.value.reason == "missing_columns"


# ------------------------------------------------------------------ COCO
def _coco(root: Path, images, annotations, name="val2017") -> Path:
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / f"captions_{name}.json").write_text(
        json.dumps({"images": images, "annotations": annotations}))
    return root


def test_coco_groups_captions_by_image(tmp_path):
    root = _coco(tmp_path, [{"id": 7, "file_name": "a.jpg"}, {"id": 9, "file_name": "b.jpg"}],
                 [{"image_id": 9, "id": 1, "caption": "A cat."},
                  {"image_id": 7, "id": 2, "caption": " A dog. "},
                  {"image_id": 9, "id": 3, "caption": "A kitten."}])
    items = read_coco(root, "val", report=RAISE, splits={"val": "val2017"})
    assert [(i.id, i.captions) for i in items] == [("7", ("A dog.",)),
                                                   ("9", ("A cat.", "A kitten."))]
    assert items[0].path == root / "val2017" / "a.jpg"


def test_coco_bad_entries(tmp_path):
    root = _coco(tmp_path, [{"id": 1, "file_name": "a.jpg"}, {"file_name": "b.jpg"},
                            {"id": 3, "file_name": "c.jpg"}],
                 [{"image_id": 1, "caption": "ok"}, {"image_id": 1},
                  {"image_id": 99, "caption": "orphan"}], name="train")
    with pytest.raises(DataError, match=r"captions_train\.json \(images\[1\]\): image entry "
                                        r"needs 'id'"):
        read_coco(root, "train", report=RAISE)
    policy = _skip()
    items = read_coco(root, "train", report=policy)
    assert [i.id for i in items] == ["1"]
    # images[1] malformed, annotations[1] malformed, annotations[2] orphan, image 3 no captions
    assert policy.counter.as_dict() == {"bad_row": 3, "empty_caption": 1}


def test_coco_invalid_json(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "captions_test.json").write_text("{not json")
    with pytest.raises(DataError, match="is not valid JSON"):
        read_coco(tmp_path, "test", report=_skip())
    (tmp_path / "annotations" / "captions_test.json").write_text('{"images": []}')
    with pytest.raises(DataError, match=r"COCO JSON has no \['annotations'\]"):
        read_coco(tmp_path, "test", report=_skip())


# ------------------------------------------------------------------ JSONL manifest
def test_manifest_paths_and_caption_lists(tmp_path):
    clip = write_audio(tmp_path / "clips" / "a.flac", sine(0.1, 16000))
    lines = [{"audio": "clips/a.flac", "caption": "one"},
             {"audio": str(clip), "caption": ["two", "three"], "id": "x"},
             {"path": "clips/a.flac", "captions": ["four"]}]
    (tmp_path / "train.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    items = read_manifest(tmp_path, "train", report=RAISE)
    assert [(i.id, i.captions) for i in items] == [("clips/a", ("one",)), ("x", ("two", "three")),
                                                   ("clips/a", ("four",))]
    assert all(i.path == clip for i in items)


def test_manifest_bad_lines(tmp_path):
    (tmp_path / "val.jsonl").write_text("\n".join([
        '{"audio": "a.wav", "caption": "ok"}',
        "{broken",
        '{"image": "b.png", "caption": "wrong modality"}',
        '{"audio": "c.wav"}',
        '{"audio": "d.wav", "caption": ""}',
        '{"audio": "e.wav", "caption": 5}',
        "[1, 2]"]))
    with pytest.raises(DataError, match=r"val\.jsonl \(line 2\): is not valid JSON"):
        read_manifest(tmp_path, "val", report=RAISE)
    policy = _skip()
    items = read_manifest(tmp_path, "val", report=policy)
    assert [i.id for i in items] == ["a"]
    assert policy.counter.as_dict() == {"bad_row": 5, "empty_caption": 1}
    img_items = read_manifest(tmp_path, "val", report=_skip(), modality="image")
    assert [i.id for i in img_items] == ["b"]


# ------------------------------------------------------------------ ESC-50
ESC_HEADER = "filename,fold,target,category,esc10,src_file,take\n"


def test_esc50_folds_and_classes(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "esc50.csv").write_text(
        ESC_HEADER + "1-1-A-0.wav,1,0,dog,True,1,A\n2-2-A-2.wav,2,2,rain,False,2,A\n"
        "5-3-A-0.wav,5,0,dog,True,3,A\n")
    train = read_esc50(tmp_path, "train", report=RAISE)
    assert train.class_names == ["dog", "class_1", "rain"]
    assert [(i.id, i.label) for i in train.items] == [("1-1-A-0", 0), ("2-2-A-2", 2)]
    test = read_esc50(tmp_path, "test", report=RAISE)
    assert [i.path for i in test.items] == [tmp_path / "audio" / "5-3-A-0.wav"]
    custom = read_esc50(tmp_path, "test", report=RAISE, folds={"test": [1, 5]})
    assert len(custom.items) == 2


def test_esc50_bad_rows_and_columns(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "esc50.csv").write_text(
        ESC_HEADER + "a.wav,one,0,dog,,,\nb.wav,1,0,cat,,,\nc.wav,1,0,dog,,,\n")
    with pytest.raises(DataError, match=r"esc50\.csv \(line 2\): fold \('one'\)"):
        read_esc50(tmp_path, "train", report=RAISE)
    policy = _skip()
    labels = read_esc50(tmp_path, "train", report=policy)
    assert [i.id for i in labels.items] == ["b"] and policy.counter["bad_row"] == 2  # a, then c
    (tmp_path / "meta" / "esc50.csv").write_text("filename,target\na.wav,0\n")
    with pytest.raises(DataError, match=r"missing column\(s\) \['fold', 'category'\]"):
        read_esc50(tmp_path, "train", report=_skip())


# ------------------------------------------------------------------ ImageFolder
def test_image_folder_with_split_folders(tmp_path):
    for split, cls, n in (("train", "cat", 2), ("train", "dog", 1), ("val", "dog", 1),
                          ("val", "owl", 1)):
        for k in range(n):
            _png(tmp_path / split / cls / f"{k}.png")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    train = read_image_folder(tmp_path, "train", report=RAISE)
    assert train.class_names == ["cat", "dog"]
    assert [(i.id, i.label) for i in train.items] == [("train/cat/0", 0), ("train/cat/1", 0),
                                                      ("train/dog/0", 1)]
    with pytest.raises(DataError, match=r"class folder 'owl' is not in train/"):
        read_image_folder(tmp_path, "val", report=RAISE)
    policy = _skip()
    val = read_image_folder(tmp_path, "val", report=policy)
    assert [i.id for i in val.items] == ["val/dog/0"] and policy.counter["bad_row"] == 1
    assert read_image_folder(tmp_path, "test", report=RAISE).items == []
    with pytest.raises(DataError, match=r"nowhere.*data\.root is not a folder"):
        read_image_folder(tmp_path / "nowhere", "train", report=RAISE)


def test_image_folder_without_splits_is_split_deterministically(tmp_path):
    for cls in ("a", "b"):
        for k in range(10):
            _png(tmp_path / cls / f"{k}.png")
    parts = {s: read_image_folder(tmp_path, s, report=RAISE, val_fraction=0.2,
                                  test_fraction=0.1, seed=1).items for s in ("train", "val",
                                                                             "test")}
    assert [len(parts[s]) for s in ("train", "val", "test")] == [14, 4, 2]
    ids = [i.id for s in parts for i in parts[s]]
    assert len(set(ids)) == 20          # disjoint and complete
    again = read_image_folder(tmp_path, "val", report=RAISE, val_fraction=0.2,
                              test_fraction=0.1, seed=1).items
    assert again == parts["val"]
    other = read_image_folder(tmp_path, "val", report=RAISE, val_fraction=0.2,
                              test_fraction=0.1, seed=2).items
    assert other != parts["val"]
    with pytest.raises(ValueError, match=r"val_fraction \(0\.6\) and test_fraction \(0\.5\)"):
        read_image_folder(tmp_path, "val", report=RAISE, val_fraction=0.6, test_fraction=0.5)
