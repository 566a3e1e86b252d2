"""mmtf.load(<contrastive ckpt>).embed_audio / embed_image / embed_text against the checkpoint's
towers called by hand on one unpadded input at a time: batching, padding, resampling, the
long-audio rule, eval mode, and the wrong call on the wrong checkpoint."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image
from torch.utils.data import DataLoader

import mmtf
from mmtf.errors import UserError
from mmtf.predict.model import Model
from mmtf.text import CharTokenizer

from ..tasks.conftest import captioner
from ..tasks.test_contrastive import CAPTIONS, _batches, _waves
from .contrastive_ckpt import IMAGE_SIZE, RATE, contrastive_config, save_contrastive_ckpt

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def audio_model(tmp_path_factory) -> Model:
    model, _ = mmtf.load(save_contrastive_ckpt(tmp_path_factory.mktemp("a") / "a.ckpt"))
    return model


@pytest.fixture(scope="module")
def image_model(tmp_path_factory) -> Model:
    path = tmp_path_factory.mktemp("i") / "i.ckpt"
    model, _ = mmtf.load(save_contrastive_ckpt(path, modality="image"))
    return model


def _wave(seconds: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(int(seconds * RATE), generator=g)


@torch.no_grad()
def _by_hand(model: Model, wave: torch.Tensor) -> torch.Tensor:
    """The media tower on one clip, unpadded: (e,)."""
    return model.task.embed_media(wave[None], torch.tensor([wave.shape[0]]))[0]


def test_embed_audio_equals_the_tower_clip_by_clip(audio_model, tmp_path):
    waves = [_wave(1.0, 0), _wave(0.4, 1), _wave(1.7, 2)]
    path = tmp_path / "c.wav"
    sf.write(path, waves[2].numpy(), RATE, subtype="FLOAT")
    got = audio_model.embed_audio([waves[0], waves[1], path], batch_size=2)   # padded batches
    expected = torch.stack([_by_hand(audio_model, w) for w in waves])
    assert got.shape == (3, 16) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, **TOL)
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(3), **TOL)
    # a file at another rate is resampled as the same waveform given with its rate is
    sf.write(tmp_path / "low.wav", waves[0].numpy(), 8000, subtype="FLOAT")
    torch.testing.assert_close(audio_model.embed_audio(tmp_path / "low.wav"),
                               audio_model.embed_audio([(waves[0], 8000)]), **TOL)


def test_long_audio_is_cropped_or_averaged_over_windows(audio_model, caplog):
    wave = _wave(5.0, 3)                    # the checkpoint reads 2 s: 3 windows of 5/3 s
    crop = audio_model.embed_audio([wave])
    assert any("longer than model.encoder.max_seconds" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(crop[0], _by_hand(audio_model, wave[:2 * RATE]), **TOL)
    window = audio_model.embed_audio([_wave(1.0, 4), wave], long_audio="window")
    bounds = [0, 26666, 53333, 80000]       # i * 80000 // 3
    parts = torch.stack([_by_hand(audio_model, wave[a:b]) for a, b in zip(bounds, bounds[1:])])
    torch.testing.assert_close(window[1], F.normalize(parts.mean(0), dim=0), **TOL)
    torch.testing.assert_close(window[0], _by_hand(audio_model, _wave(1.0, 4)), **TOL)


def test_embeddings_are_made_in_eval_mode_and_the_mode_is_restored(audio_model):
    wave = _wave(1.0, 5)
    audio_model.task.train()                # SpecAugment masks in training mode
    try:
        got = audio_model.embed_audio([wave])
        assert audio_model.task.training
    finally:
        audio_model.task.eval()
    torch.testing.assert_close(got[0], _by_hand(audio_model, wave), **TOL)


def test_embed_text_equals_the_tower_text_by_text(audio_model):
    task = audio_model.task
    texts = ["a dog barks", "hum", "rain falls on a roof, twice"]
    got = audio_model.embed_text(texts, batch_size=2)
    with torch.no_grad():
        expected = []
        for text in texts:
            (ids,) = task.tokenizer.encode_batch([text])          # <bos> ... <eos>, no padding
            ids = torch.tensor([ids])
            expected.append(task.embed_text(ids, torch.ones_like(ids, dtype=torch.bool))[0])
    torch.testing.assert_close(got, torch.stack(expected), **TOL)
    torch.testing.assert_close(audio_model.embed_text("hum"), got[1:2], **TOL)


def test_embed_image_takes_files_pil_and_tensors(image_model, tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    Image.fromarray(pixels.transpose(1, 2, 0)).save(tmp_path / "x.png")
    tensor = torch.from_numpy(pixels)
    got = image_model.embed_image([tmp_path / "x.png", Image.open(tmp_path / "x.png"), tensor])
    with torch.no_grad():                  # the stored transform: a 32x32 resize (identity here)
        expected = image_model.task.embed_media((tensor.float() / 255)[None], None)[0]
    for row in got:
        torch.testing.assert_close(row, expected, **TOL)


def test_the_wrong_call_is_one_line(audio_model, image_model):
    with pytest.raises(UserError, match=r"embed_image: this checkpoint embeds audio .*"
                                        r"AudioEncoder\); use embed_audio"):
        audio_model.embed_image([torch.zeros(3, 8, 8)])
    with pytest.raises(UserError, match=r"embed_audio: this checkpoint embeds image"):
        image_model.embed_audio([_wave(0.5, 0)])
    with pytest.raises(UserError, match=r"long_audio \('whole'\) must be 'crop'"):
        audio_model.embed_audio([_wave(0.5, 0)], long_audio="whole")
    with pytest.raises(UserError, match=r"item 1 is a int, not a string"):
        audio_model.embed_text(["a", 3])
    with pytest.raises(UserError, match=r"batch_size \(0\) must be >= 1"):
        audio_model.embed_text(["a"], batch_size=0)
    plain = Model(captioner().eval())
    for call, arg in (("embed_text", ["a dog"]), ("embed_audio", [_wave(0.5, 0)])):
        with pytest.raises(UserError, match=rf"{call}: a CaptioningTask has no shared "
                                            rf"media-text embedding; load a contrastive"):
            getattr(plain, call)(arg)


def test_a_lightning_trainer_checkpoint_loads_with_the_same_embeddings(tmp_path):
    """What mmtf.train writes (Trainer.save_checkpoint, the task's on_save_checkpoint inside)
    rebuilds through mmtf.load into the task that was trained, embeddings and all."""
    tokenizer = CharTokenizer.train([c for caps in CAPTIONS for c in caps])
    cfg = contrastive_config("audio", tokenizer.vocab_size)
    torch.manual_seed(0)
    task = instantiate(OmegaConf.create(cfg["model"]))
    task.use_tokenizer(tokenizer)
    task.run_config = cfg
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, max_steps=1,
                        default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(_batches(tokenizer, list(range(4))), batch_size=None))
    trainer.save_checkpoint(tmp_path / "last.ckpt", weights_only=True)
    model, loaded_tokenizer = mmtf.load(tmp_path / "last.ckpt")
    assert loaded_tokenizer == tokenizer
    waves = _waves()[:3]
    task.eval()
    with torch.no_grad():
        media = task.embed_media(waves, torch.full((3,), waves.shape[1]))
    torch.testing.assert_close(model.embed_audio(list(waves)), media, **TOL)
    torch.testing.assert_close(model.embed_text(CAPTIONS[0]), task.embed_texts(CAPTIONS[0]),
                               **TOL)
