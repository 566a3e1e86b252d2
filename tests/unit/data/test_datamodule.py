"""CaptionDataModule / ClassificationDataModule on tiny generated sets: batches, tokenizer,
caption policies, determinism, and bad files under on_error=raise and skip."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hydra.utils import instantiate
from torchvision.transforms import v2

from mmtf.data import (
    CaptionDataModule,
    ClassificationDataModule,
    DataError,
)
from mmtf.errors import UserError
from mmtf.synthetic import audio as synthetic_audio
from mmtf.text import CharTokenizer, build_tokenizer
from mmtf.utils.parts import upgrade_config
from tests.unit.data.datamodule_reference import CONFIGS, ROOTS, digest
from tests.unit.presets import flat

BPE = {"kind": "bpe", "vocab_size": 200}


def _audio_dm(root, *, tokenizer: dict | None = BPE, **kw) -> CaptionDataModule:
    """A Clotho data module, connected (as mmtf.train does) to a tokenizer trained on its train
    captions from ``tokenizer`` (None: none connected)."""
    args = dict(format="clotho", root=str(root), batch_size=4, max_seconds=1.5, seed=0)
    dm = flat(CaptionDataModule, **{**args, **kw})
    if tokenizer is not None:
        dm.connect(build_tokenizer(tokenizer, dm.train_captions))
    return dm


def test_audio_caption_batches(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions, batch_size=3)
    dm.setup("fit")
    assert dm.modality == "audio" and dm.sample_rate == 16000
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"audio", "audio_lengths", "tokens", "token_lengths", "references", "ids"}
    assert batch["audio"].dtype == torch.float32 and batch["audio"].shape[0] == 3
    assert batch["audio"].shape[1] == int(batch["audio_lengths"].max()) <= 24000  # 1.5 s crop
    for row, n in zip(batch["tokens"], batch["token_lengths"]):
        assert row[0] == dm.tokenizer.bos_id and row[n - 1] == dm.tokenizer.eos_id
        assert (row[n:] == 0).all()
    for refs, row, n in zip(batch["references"], batch["tokens"], batch["token_lengths"]):
        assert len(refs) == 5   # all references kept; tokens are one of them
        assert dm.tokenizer.decode(row[:n].tolist()) in {dm.tokenizer.normalize(r) for r in refs}
    val = next(iter(dm.val_dataloader()))
    assert val["audio"].shape[1] == int(val["audio_lengths"].max()) > 24000  # eval: full clips


def test_image_caption_batches(tiny_image_captions):
    norm = [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.5] * 3)]
    dm = flat(CaptionDataModule, format="coco", root=str(tiny_image_captions), batch_size=3,
                           train_transforms=norm, eval_transforms=norm, media_cache_mb=1)
    dm.setup("fit")
    dm.connect(build_tokenizer(BPE, dm.train_captions))
    assert dm.modality == "image"
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (3, 3, 32, 32) and batch["image"].dtype == torch.float32
    assert float(batch["image"].min()) >= -1.0 and float(batch["image"].max()) <= 1.0
    assert "audio" not in batch and batch["tokens"].dtype == torch.long
    # data.media_cache_mb reaches the dataset: the batch's three images stay decoded.
    assert len(dm._loaders["train"].dataset._cache) == 3


def test_image_augmentation_is_a_function_of_seed_epoch_and_item(tiny_image_labels):
    crop = [v2.RandomResizedCrop(16, scale=(0.1, 0.5), antialias=True)]
    dm = flat(ClassificationDataModule, format="image_folder", root=str(tiny_image_labels),
                                  train_transforms=crop, seed=3)
    dm.setup("fit")
    ds = dm._dataset("train", "random")
    torch.manual_seed(123)
    a = ds[(0, 0, 0)]["image"]
    torch.manual_seed(456)                      # the global RNG state does not matter
    assert torch.equal(a, ds[(0, 0, 0)]["image"])
    assert not torch.equal(a, ds[(0, 0, 1)]["image"])      # a new epoch, a new crop
    assert a.shape == (3, 16, 16)


def test_classification_audio(tiny_audio_labels):
    dm = flat(ClassificationDataModule, format="esc50", root=str(tiny_audio_labels), batch_size=4)
    dm.setup("fit")
    assert dm.num_classes == 9 and dm.class_names == list(synthetic_audio.CLASS_NAMES)
    labels = []
    for batch in dm.train_dataloader():
        assert set(batch) == {"audio", "audio_lengths", "label", "ids"}
        labels += batch["label"].tolist()
    assert len(labels) == 12 and set(labels) <= set(range(9))  # folds 1-3 of 20 clips
    assert [i.id.split("-")[0] for i in dm.items("test")] == ["5"] * 4


def test_classification_images(tiny_image_labels):
    dm = flat(ClassificationDataModule, format="image_folder", root=str(tiny_image_labels),
                                  batch_size=8)
    dm.setup()
    assert dm.num_classes == 4 and dm.class_names == ["circle", "cross", "square", "triangle"]
    batch = next(iter(dm.test_dataloader()))
    assert batch["image"].shape == (4, 3, 32, 32) and sorted(batch["label"].tolist()) == [0, 1, 2, 3]


def test_caption_policy_all_and_random(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions, caption_policy="all", batch_size=5)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert len(loader) == 6 and sum(len(b["ids"]) for b in loader) == 30
    dm = _audio_dm(tiny_audio_captions, caption_policy="random", batch_size=5)
    dm.setup("fit")
    assert sum(len(b["ids"]) for b in dm.train_dataloader()) == 6


def test_captions_per_item_trains_on_several_references_of_each_item(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions, captions_per_item=3, batch_size=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    tokens = dm.tokens("train")
    index = {item.id: i for i, item in enumerate(dm.items("train"))}
    seen = 0
    for batch in loader:
        b = len(batch["ids"])
        assert batch["audio"].shape[0] == b and batch["tokens"].shape[0] == 3 * b
        for i, item_id in enumerate(batch["ids"]):
            refs = tokens[index[item_id]]                        # every reference of the item
            rows = [batch["tokens"][3 * i + j, : batch["token_lengths"][3 * i + j]].tolist()
                    for j in range(3)]
            start = refs.index(rows[0])                          # the epoch's drawn caption
            assert rows == [refs[(start + j) % len(refs)] for j in range(3)]
            seen += 1
    assert seen == 6
    val = next(iter(dm.val_dataloader()))                        # evaluation: one row per item
    assert val["tokens"].shape[0] == len(val["ids"])
    with pytest.raises(ValueError, match=r"captions_per_item \(2\).*caption_policy=random"):
        _audio_dm(tiny_audio_captions, captions_per_item=2, caption_policy="all")
    with pytest.raises(ValueError, match=r"captions_per_item \(0\)"):
        _audio_dm(tiny_audio_captions, captions_per_item=0)


def test_same_seed_same_batches_new_epoch_new_batches(tiny_audio_captions):
    def first_batches(seed, epoch):
        dm = _audio_dm(tiny_audio_captions, seed=seed, max_seconds=0.5, batch_size=6)
        dm.setup("fit")
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(epoch)
        return next(iter(loader))
    a, b, c = first_batches(0, 0), first_batches(0, 0), first_batches(0, 1)
    assert torch.equal(a["audio"], b["audio"]) and torch.equal(a["tokens"], b["tokens"])
    assert not torch.equal(a["audio"], c["audio"])  # new crops (and order) each epoch


def test_plain_iteration_advances_the_epoch(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions)
    dm.setup("fit")
    loader = dm.train_dataloader()
    epochs = []
    for _ in range(3):
        epochs.append(loader.batch_sampler.epoch)
        list(loader)
    assert epochs == [0, 1, 2] and dm.stats["train"]["complete"]


def test_truncated_captions_are_counted(tiny_audio_captions, caplog):
    dm = _audio_dm(tiny_audio_captions, max_caption_tokens=4)
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        dm.setup("fit")
        batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape[1] == 4 and (batch["tokens"][:, -1] == 2).all()
    assert dm.error_counts["caption_truncated"] == 30
    assert "30 of 30 captions exceed max_caption_tokens=4" in caplog.text


def test_truncation_keeps_the_head_of_each_caption_and_eos(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions, max_caption_tokens=6)
    captions = [c for item in dm.items("train") for c in item.captions]
    full = [dm.tokenizer.encode(c) for c in captions]                  # no limit
    got = [ids for per_item in dm.tokens("train") for ids in per_item]
    expected = [ids if len(ids) <= 6 else ids[:5] + [dm.tokenizer.eos_id] for ids in full]
    assert got == expected
    assert dm.error_counts["caption_truncated"] == sum(len(ids) > 6 for ids in full) > 0


def test_connect_replaces_the_cached_ids(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions, max_caption_tokens=256)      # nothing truncated
    char = CharTokenizer.train(dm.train_captions())
    bpe_ids = dm.tokens("val")
    dm.connect(char)
    captions = [item.captions for item in dm.items("val")]
    assert dm.tokens("val") == [[char.encode(c) for c in caps] for caps in captions]
    assert dm.tokens("val") != bpe_ids


def test_without_a_tokenizer_the_data_module_names_the_call_and_trains_none(
        tiny_audio_captions, monkeypatch):
    # Before: tokens() trained a tokenizer itself when none had been handed over.
    trained = []
    for cls in ("BPETokenizer", "CharTokenizer"):
        monkeypatch.setattr(f"mmtf.text.{cls}.train", lambda *a, **k: trained.append(a))
    dm = _audio_dm(tiny_audio_captions, tokenizer=None)
    dm.setup("fit")
    with pytest.raises(UserError, match=r"no tokenizer to build the train token ids with; "
                                        r"call datamodule.connect\(tokenizer\) first"):
        dm.train_dataloader()
    with pytest.raises(UserError, match=r"datamodule.connect\(tokenizer\)"):
        dm.tokens("val")
    assert dm.tokenizer is None and trained == []


def test_train_captions_are_every_reference_of_the_train_split(tiny_audio_captions):
    dm = _audio_dm(tiny_audio_captions, tokenizer=None)
    refs = [c for item in dm.items("train") for c in item.captions]
    assert dm.train_captions() == refs and len(refs) == 5 * len(dm.items("train"))


def test_constructor_checks(tmp_path):
    with pytest.raises(ValueError, match=r"format \('clothoo'\) must be one of"):
        flat(CaptionDataModule, format="clothoo", root=str(tmp_path))
    with pytest.raises(ValueError, match=r"modality \('image'\) must be 'audio' for format"):
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), modality="image")
    with pytest.raises(ValueError, match=r"on_error \('ignore'\) must be one of"):
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), on_error="ignore")
    with pytest.raises(ValueError, match=r"caption_policy \('first'\)"):
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), caption_policy="first")
    with pytest.raises(ValueError, match=r"media_cache_mb \(-1\) must be >= 0 .* fix "
                                         r"data.media_cache_mb"):
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), media_cache_mb=-1)
    # The old name, as stored in earlier runs' configs, is read as the new one.
    assert flat(CaptionDataModule, format="clotho", root=str(tmp_path),
                             image_cache_mb=2).cache_bytes == 2 * 2 ** 20
    with pytest.raises(ValueError, match=r"image_cache_mb \(2\) is the old name of "
                                         r"data.media_cache_mb \(4\)"):
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), media_cache_mb=4,
                          image_cache_mb=2)


def test_media_cache_without_persistent_workers_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), media_cache_mb=8, num_workers=2,
                          persistent_workers=True)
        assert "media_cache_mb" not in caplog.text
        flat(CaptionDataModule, format="clotho", root=str(tmp_path), media_cache_mb=8, num_workers=2,
                          persistent_workers=False)
    assert ("data.media_cache_mb=8 with data.loader.num_workers=2 and data.loader.persistent_workers=false"
            in caplog.text and "set data.loader.persistent_workers=true" in caplog.text)


# ------------------------------------------------------------------ bad files
@pytest.fixture
def broken_clotho(tiny_audio_captions, tmp_path):
    """The tiny set with: undecodable, missing and NaN clips and an empty caption (train)."""
    root = tmp_path / "broken"
    shutil.copytree(tiny_audio_captions, root)
    dev = root / "development"
    files = sorted(dev.glob("*.wav"))
    files[0].write_bytes(np.random.default_rng(0).bytes(3000))          # undecodable
    files[1].unlink()                                                    # missing
    x = np.full(16000, 0.1, dtype=np.float32)
    x[100] = np.nan
    sf.write(str(files[2]), x, 16000, subtype="FLOAT")                   # NaN (found on decode)
    csv = root / "clotho_captions_development.csv"
    lines = csv.read_text().splitlines()
    head, *cells = lines[5].split(",")
    lines[5] = ",".join([head, "", *cells[1:]])                          # empty caption_1
    csv.write_text("\n".join(lines) + "\n")
    return root, files


def test_raise_names_file_and_line(broken_clotho):
    root, files = broken_clotho
    with pytest.raises(DataError, match=r"broken/clotho_captions_development\.csv \(line 6\): "
                                        r"caption_1 is empty; fill it in or delete it \(or set "
                                        r"data.on_error=skip"):
        _audio_dm(root).setup("fit")
    csv = root / "clotho_captions_development.csv"
    csv.write_text(csv.read_text().replace(",,", ",x,", 1))
    with pytest.raises(DataError, match=rf"{files[0].name} \(clotho_captions_development\.csv "
                                        rf"line 2\): cannot be decoded"):
        _audio_dm(root).setup("fit")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_counts_every_problem_and_keeps_batches_full(broken_clotho, num_workers, caplog):
    root, files = broken_clotho
    dm = _audio_dm(root, on_error="skip", num_workers=num_workers, batch_size=2)
    with caplog.at_level(logging.WARNING, logger="mmtf.data"):
        dm.setup("fit")
        assert dm.error_counts.as_dict() == {"undecodable": 1, "missing_file": 1,
                                             "empty_caption": 1}
        assert len(dm.items("train")) == 4
        sizes = [len(b["ids"]) for b in dm.train_dataloader()]
    assert sizes == [2, 2]                                  # the NaN clip was replaced, not dropped
    assert dm.error_counts["non_finite"] == 1
    assert dm.stats["train"]["skipped"] == {"non_finite": 1}
    assert files[2].name in str(dm.error_counts.examples["non_finite"])
    assert "skipped 1 problem(s): non_finite=1" in caplog.text


def test_decode_errors_raise_through_workers(broken_clotho):
    root, files = broken_clotho
    dm = _audio_dm(root, on_error="skip", num_workers=2)
    dm.setup("fit")
    dm.on_error = "raise"  # header problems were skipped at setup; decode problems now raise
    with pytest.raises(DataError, match=rf"{files[2].name} \(clotho_captions_development\.csv "
                                        rf"line 4\): has 1 NaN/inf sample"):
        list(dm.train_dataloader())


@pytest.mark.parametrize("persistent", [False, True])
def test_teardown_stops_the_workers_of_a_pass_left_unfinished(tiny_audio_captions, persistent):
    """A run stopped mid-epoch (max_steps, limit_train_batches) leaves its pass unfinished;
    teardown, which Lightning calls at the end of fit and test, ends its workers. The loader
    still works: the next pass starts new ones."""
    from tests.forked import alive

    dm = _audio_dm(tiny_audio_captions, batch_size=2, num_workers=2,
                   persistent_workers=persistent)
    dm.setup("fit")
    loader = dm.train_dataloader()
    next(iter(loader))
    workers = [w.pid for w in loader._pass()._workers]
    assert len(workers) == 2 and all(alive(pid) for pid in workers)
    dm.teardown("fit")
    assert not any(alive(pid) for pid in workers)
    assert loader.stop_workers() == 0                      # nothing left to stop
    assert len(list(loader)) == len(loader) > 1            # a whole new pass, new workers


def test_empty_split_is_a_clear_error(tiny_audio_captions, tmp_path):
    root = tmp_path / "empty"
    shutil.copytree(tiny_audio_captions, root)
    (root / "clotho_captions_validation.csv").write_text("file_name,caption_1\n")
    dm = _audio_dm(root)
    dm.setup("fit")
    with pytest.raises(DataError, match="split 'val' has no usable items"):
        dm.val_dataloader()


@pytest.mark.parametrize(("pin_memory", "device", "pinned"), [
    (None, "cpu", False), (None, "cuda", True), (False, "cuda", False), (True, "cpu", True)])
def test_pin_memory_follows_the_trainer_device_when_unset(tiny_audio_captions, pin_memory,
                                                          device, pinned):
    from types import SimpleNamespace
    dm = _audio_dm(tiny_audio_captions, pin_memory=pin_memory)
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
    dm.setup("fit")
    assert dm.train_dataloader().pin_memory is pinned
    assert dm.val_dataloader().pin_memory is pinned


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_pre_39_flat_data_config_gives_the_same_batches(name, tiny_audio_captions,
                                                          tiny_image_captions):
    """A stored flat config (batch, loader and crop keys, image_cache_mb), upgraded, gives the
    batches the pre-#39 code gave, bit for bit (the reference: datamodule_reference.py)."""
    reference = json.loads(Path(__file__).with_name("datamodule_reference.json").read_text())
    root = {"audio_captions": tiny_audio_captions, "image_captions": tiny_image_captions}
    cfg = upgrade_config({**CONFIGS[name], "root": str(root[ROOTS[name]])})
    assert not set(cfg) & {"batch_size", "num_workers", "train_crop", "image_cache_mb"}
    assert digest(instantiate(cfg)) == reference[name]


def test_flat_data_keys_beside_their_part_are_refused_naming_the_new_key():
    with pytest.raises(ValueError, match=r"keep only batches\.batch_size"):
        upgrade_config({"_target_": "mmtf.data.CaptionDataModule", "batch_size": 4,
                        "batches": {"batch_size": 8}})
    with pytest.raises(ValueError, match=r"keep only crop\.eval"):
        upgrade_config({"_target_": "mmtf.data.CaptionDataModule", "eval_crop": "start",
                        "crop": {"train": "start"}})


def test_bad_crop_names_the_key(tmp_path):
    with pytest.raises(UserError, match=r"data.crop \(.*'middle'.*\) must be \{train: random"):
        CaptionDataModule(format="clotho", root=str(tmp_path), crop={"eval": "middle"})
