"""Every conf/data/*.yaml composes (through conf/data_check.yaml), instantiates, sets up and
yields batches — synthetic ones generated tiny into tmp_path, real ones on written fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from mmtf.data import CaptionDataModule
from mmtf.data.formats import write_coco_json
from mmtf.data.shards.writer import write_shards
from mmtf.synthetic import caption_parser, ensure_synthetic
from mmtf.text import build_tokenizer
from mmtf.text.chat import ChatTemplate
from tests.unit.data.conftest import TINY_AUDIO, TINY_IMAGE, sine, write_audio
from tests.unit.data.speech_sets import write_common_voice, write_librispeech
from tests.unit.presets import flat

CONF = Path(__file__).resolve().parents[2] / "conf"
DATA = sorted(p.stem for p in (CONF / "data").glob("*.yaml"))
SYNTHETIC_SIZES = {
    "synth_audio_captions": {**TINY_AUDIO},
    "synth_image_captions": {**TINY_IMAGE},
    "synth_audio_labels": {"num_clips": 20, "min_seconds": 1.0, "max_seconds": 1.5},
    "synth_audio_qa": {**TINY_AUDIO},
    "synth_audio_qa_instruction": {**TINY_AUDIO},
    "synth_image_labels": {"num_train": 8, "num_val": 4, "num_test": 4, "image_size": 32},
}
# The built-in mixture: two built-in audio sets (its sources keep their own seeds).
MIXTURE = [f"data.sources.{source}.synthetic.{k}={v}" for source in ("synth_a", "synth_b")
           for k, v in TINY_AUDIO.items() if k != "seed"]
# The built-in instruction mixture: the AQA set and the captions with an instruction.
INSTRUCTION_MIXTURE = [f"data.sources.{source}.synthetic.{k}={v}" for source in ("qa", "captions")
                       for k, v in TINY_AUDIO.items() if k != "seed"]
# Chats for a prefix LLM: connected with a chat template, batches of media and chat ids.
CHATS = {"instruction", "synth_audio_qa_instruction", "synth_audio_instruction_mix"}
BUILT_IN = {*SYNTHETIC_SIZES, "synth_audio_captions_mix", "synth_audio_instruction_mix"}


def _compose(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("data_check", overrides=overrides)


@pytest.fixture(scope="module")
def real_roots(tmp_path_factory) -> dict[str, Path]:
    """One small dataset per real format, in its real layout."""
    base = tmp_path_factory.mktemp("real")
    roots = {
        "clotho": ensure_synthetic(base / "clotho", "audio_captions", **TINY_AUDIO),
        "esc50": ensure_synthetic(base / "esc50", "audio_labels", num_clips=20,
                                  min_seconds=1.0, max_seconds=1.5),
        "image_folder": ensure_synthetic(base / "imgf", "image_labels", num_train=8,
                                         num_val=4, num_test=4, image_size=32),
    }
    ac = base / "audiocaps"
    for split in ("train", "val", "test"):
        rows = ["audiocap_id,youtube_id,start_time,caption"]
        for k in range(4):
            write_audio(ac / "audio" / split / f"{split}{k}.wav", sine(1.0 + k / 4, 16000))
            rows += [f"{split}{k}{j},{split}{k},30,a sound number {k} take {j}" for j in range(2)]
        (ac / f"{split}.csv").write_text("\n".join(rows) + "\n")
    roots["audiocaps"] = ac
    mf = base / "manifest"
    for split in ("train", "val", "test"):
        lines = []
        for k in range(4):
            write_audio(mf / "clips" / f"{split}{k}.flac", sine(0.5 + k / 4, 22050), 22050)
            lines.append(json.dumps({"audio": f"clips/{split}{k}.flac",
                                     "caption": [f"tone {k}", f"a tone {k}"]}))
        (mf / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    roots["manifest"] = mf
    # Instruction JSONL (data=instruction): the built-in question set's lines carry messages.
    roots["instruction"] = ensure_synthetic(base / "instruction", "audio_qa", **TINY_AUDIO)
    # Speech: the real LibriSpeech / Common Voice layouts, and a manifest with text + language.
    roots["librispeech"] = write_librispeech(base / "librispeech", {
        "train-clean-100": 4, "dev-clean": 2, "test-clean": 2})
    roots["common_voice"] = write_common_voice(base / "cv", {"train": 2, "dev": 2, "test": 2})
    sm = base / "speech_manifest"
    for split in ("train", "val", "test"):
        write_audio(sm / f"{split}.flac", sine(1.0, 16000))
        (sm / f"{split}.jsonl").write_text("\n".join(json.dumps(
            {"audio": f"{split}.flac", "text": f"tone {k}", "language": "en", "id": f"{k}"})
            for k in range(2)) + "\n")
    roots["speech_manifest"] = sm
    shapes = ensure_synthetic(base / "shapes", "image_captions", **TINY_IMAGE)
    coco = base / "coco"
    for ours, name in (("train", "train2017"), ("val", "val2017")):
        data = json.loads((shapes / "annotations" / f"captions_{ours}.json").read_text())
        caps: dict[int, list[str]] = {}
        for ann in data["annotations"]:
            caps.setdefault(ann["image_id"], []).append(ann["caption"])
        (coco / name).mkdir(parents=True)
        entries = []
        for img in data["images"]:
            (coco / name / img["file_name"]).write_bytes(
                (shapes / ours / img["file_name"]).read_bytes())
            entries.append((img["id"], img["file_name"], caps[img["id"]], 32, 32))
        write_coco_json(coco, name, entries)
    roots["coco_captions"] = coco
    # Tar shards (data=shards, data=shards_image) written from the Clotho and shapes sets.
    for name, src in (("shards", flat(CaptionDataModule, format="clotho", root=str(roots["clotho"]))),
                      ("shards_image", flat(CaptionDataModule,
                          format="coco", root=str(shapes),
                          splits={"train": "train", "val": "val", "test": "test"}))):
        for split in ("train", "val", "test"):
            write_shards(src.items(split), base / name / split, prefix=split, shard_size=4)
        roots[name] = base / name
    return roots


@pytest.mark.parametrize("name", [n for n in DATA if n != "mixture"])
def test_every_data_config_loads(name, tmp_path, real_roots):
    overrides = [f"data={name}", f"paths.data_dir={tmp_path}", "data.loader.num_workers=0",
                 "data.batches.batch_size=2"]
    if name in SYNTHETIC_SIZES:
        overrides += [f"data.synthetic.{k}={v}" for k, v in SYNTHETIC_SIZES[name].items()]
    elif name == "synth_audio_captions_mix":
        overrides += MIXTURE
    elif name == "synth_audio_instruction_mix":
        overrides += INSTRUCTION_MIXTURE
    else:
        overrides.append(f"data.root={real_roots[name]}")
    cfg = _compose(overrides)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    chat = name in CHATS
    if "tokenizer" in cfg:                  # the caption configs select one (conf/tokenizer/)
        spec = dm.tokenizer_spec(OmegaConf.to_container(cfg.tokenizer))   # as mmtf.train
        if chat:                            # as the *_llm experiments' tokenizer=bpe_chat
            spec["special_tokens"] = ["<|im_start|>", "<|im_end|>", "<|audio|>", "<|image|>"]
        template = {"chat_template": ChatTemplate.builtin("chatml")} if chat else {}
        dm.connect(build_tokenizer(spec, dm.train_captions), **template)
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        batch = next(iter(loader))
        key = "media" if chat else "audio" if dm.modality == "audio" else "image"
        assert batch[key].dtype == torch.float32 and len(batch["ids"]) == 2
        assert ("tokens" in batch) == ("tokenizer" in cfg and not chat)
        assert ("labels" in batch) == chat
    if name in SYNTHETIC_SIZES and "captions" in name:
        parser = caption_parser(cfg.data.synthetic.kind)   # as the task's event accuracy finds it
        assert parser is not None and all(parser(r) for r in batch["references"][0])


@pytest.mark.parametrize("name", [n for n in DATA if n not in BUILT_IN])
def test_real_configs_require_a_root(name):
    cfg = _compose([f"data={name}"])
    with pytest.raises(MissingMandatoryValue, match="sources" if name == "mixture" else "root"):
        instantiate(cfg.data)


def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MMTF_DATA_DIR", str(tmp_path / "elsewhere"))
    cfg = _compose([])
    assert cfg.data.root == f"{tmp_path}/elsewhere/synth_audio_captions"
    monkeypatch.delenv("MMTF_DATA_DIR")
    assert _compose([]).paths.data_dir == "./data"
    assert _compose([]).paths.output_dir.startswith("./outputs/")
