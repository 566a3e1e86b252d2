"""Whisper imported into mmtf's modules computes what transformers' Whisper computes.

Each test builds a small random-weight ``WhisperForConditionalGeneration`` (2 + 2 layers,
d_model 64, 4 heads; 80 and 128 mel bins) and a tiny byte-level tokenizer with Whisper's special
tokens, saves them with ``save_pretrained`` into a temporary folder (nothing is downloaded) and
imports the folder. Compared, float32 throughout:

* log-mel features against ``WhisperFeatureExtractor`` (its torch float32 path, the default) on
  rendered sound scenes of 0.6, 2.3, 7.1 and 30 s: <= 1e-4 max abs on every frame with
  ``pad_to_seconds=30`` and on the valid frames with mmtf's padding mask (for the 30 s clip,
  which Whisper does not pad, the frames whose window lies inside the clip). The extractor's numpy
  float64 path differs from its own float32 path by about 1e-5 here, well inside that bound;
* encoder outputs (short clips padded to 30 s, as Whisper pads them), decoder logits under
  teacher forcing after a 4-token prompt: <= 1e-4 max abs;
* greedy and beam tokens with mmtf's KV cache against Hugging Face decoding with
  ``past_key_values``. Greedy: a manual loop over the HF model, so none of Whisper's
  ``generate``-specific logic (language detection, timestamp rules, forced ids) is involved.
  Beam: ``GenerationMixin.generate`` (the parent of Whisper's own ``generate``), with the same
  banned ids as mmtf (the prompt's), masked before the log-softmax as mmtf does, through a
  logits processor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmtf.decoders import EncoderDecoder
from mmtf.errors import UserError
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder
from mmtf.text import PretrainedTokenizer
from tests.unit.pretrained.tiny_hf import WHISPER_PROMPT, padded_batch, write_whisper

transformers = pytest.importorskip("transformers")

SR = 16000
SECONDS = (0.6, 2.3, 7.1, 30.0)


def clips() -> list[np.ndarray]:
    from mmtf.synthetic.audio import render, sample_scene

    rng = np.random.default_rng(0)
    out = []
    for seconds in SECONDS:
        scene = sample_scene(rng, min_seconds=seconds, max_seconds=seconds)
        out.append(render(scene, SR, rng)[: int(seconds * SR)].astype(np.float32))
    return out


@pytest.fixture(scope="module", params=[80, 128], ids=["mel80", "mel128"])
def whisper(request, tmp_path_factory):
    """(folder, HF model, feature extractor, tokenizer) of a tiny random Whisper."""
    folder = tmp_path_factory.mktemp(f"whisper{request.param}")
    model = write_whisper(folder, n_mels=request.param)
    extractor = transformers.WhisperFeatureExtractor(feature_size=request.param)
    tokenizer = PretrainedTokenizer.from_folder(folder, prompt=WHISPER_PROMPT)
    return folder, model, extractor, tokenizer


def hf_features(extractor, waves: list[np.ndarray]) -> torch.Tensor:
    return extractor(waves, sampling_rate=SR, return_tensors="pt").input_features  # (b, f, 3000)


def mmtf_model(folder, tokenizer, **encoder_options) -> EncoderDecoder:
    encoder = whisper_encoder(pretrained=folder, **encoder_options)
    decoder = whisper_decoder(pretrained=folder)
    return EncoderDecoder(encoder=encoder, decoder=decoder, pad_id=tokenizer.pad_id,
                          eos_id=tokenizer.eos_id, prompt_ids=tokenizer.prompt_ids).eval()


@pytest.mark.parametrize("pad_to_seconds", [30.0, None])
def test_log_mel_features_equal_whisper_feature_extractor(whisper, pad_to_seconds):
    folder, _, extractor, _ = whisper
    waves = clips()
    expected = hf_features(extractor, waves)
    encoder = whisper_encoder(pretrained=folder, pad_to_seconds=pad_to_seconds,
                              max_seconds=30.0).eval()
    wave, lengths = padded_batch(waves)
    feats, frames = encoder.frontend(wave, lengths)
    if pad_to_seconds is None:
        assert frames.tolist() == [n // 160 + 1 for n in lengths.tolist()]
    else:
        assert feats.shape == expected.shape and frames.tolist() == [3000] * len(waves)
    for i, n in enumerate(frames.tolist()):
        n = min(n, expected.shape[-1])
        if pad_to_seconds is None and lengths[i] == 30 * SR:
            # A clip of exactly 30 s has no padding in Whisper: its last frames see the
            # reflected clip, mmtf's mask mode zeros. Compare the frames inside the clip.
            n = (int(lengths[i]) - 200) // 160 + 1
        error = (feats[i, :, :n] - expected[i, :, :n]).abs().max().item()
        assert error <= 1e-4, (SECONDS[i], error)


def test_encoder_and_teacher_forced_logits_equal_transformers(whisper):
    folder, hf, extractor, tokenizer = whisper
    waves = clips()[:3]                                  # short clips, padded to 30 s
    model = mmtf_model(folder, tokenizer)
    wave, lengths = padded_batch(waves)
    features = hf_features(extractor, waves)
    body = torch.randint(0, 290, (3, 6), generator=torch.Generator().manual_seed(1))
    tokens = torch.cat([torch.tensor([tokenizer.prompt_ids] * 3), body], dim=1)   # (3, 10)
    with torch.no_grad():
        ref = hf(input_features=features, decoder_input_ids=tokens)
        memory, mask = model.encode(wave, lengths)
        logits = model.decoder(tokens, memory, mask)
    assert memory.shape == ref.encoder_last_hidden_state.shape == (3, 1500, 64)
    assert (memory - ref.encoder_last_hidden_state).abs().max().item() <= 1e-4
    assert (logits - ref.logits).abs().max().item() <= 1e-4
    # A control: the HF logits are not trivially close to something unrelated.
    assert (logits[:, 1:] - ref.logits[:, :-1]).abs().max().item() > 1e-2


def hf_greedy(hf, features: torch.Tensor, prompt: list[int], banned: list[int], steps: int,
              ) -> list[list[int]]:
    """Greedy decoding on the HF model with its KV cache (past_key_values)."""
    b = features.shape[0]
    with torch.no_grad():
        encoder_outputs = hf.model.encoder(features)
        ids = torch.tensor([prompt] * b)
        out = hf(encoder_outputs=encoder_outputs, decoder_input_ids=ids, use_cache=True)
        rows = [[] for _ in range(b)]
        for _ in range(steps):
            logits = out.logits[:, -1].clone()
            logits[:, banned] = -math.inf
            nxt = logits.argmax(-1)
            for r in range(b):
                rows[r].append(int(nxt[r]))
            out = hf(encoder_outputs=encoder_outputs, decoder_input_ids=nxt[:, None],
                     cache=out.cache, use_cache=True)
    return rows


def test_greedy_tokens_with_the_kv_cache_equal_transformers(whisper):
    folder, hf, extractor, tokenizer = whisper
    waves = clips()[:3]
    model = mmtf_model(folder, tokenizer)
    wave, lengths = padded_batch(waves)
    out = model.generate(wave, lengths, strategy="greedy", max_new_tokens=12)
    expected = hf_greedy(hf, hf_features(extractor, waves), tokenizer.prompt_ids,
                         tokenizer.prompt_ids, 12)
    eos = tokenizer.eos_id
    for row, ref in zip(out.tokens.tolist(), expected):
        ref = ref[: ref.index(eos) + 1] if eos in ref else ref
        # A reference that ended at once would compare nothing but eos.
        assert len([t for t in ref if t != eos]) >= 5, ref
        assert row[: len(ref)] == ref
    assert min(len(set(r)) for r in expected) > 3       # not one token repeated


class RenormalisedBan:
    """Mask ids and renormalise the log-probs (mmtf masks before its log-softmax)."""

    def __init__(self, banned: list[int]) -> None:
        self.banned = banned

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, self.banned] = -math.inf
        return scores.log_softmax(-1)


def test_beam_tokens_with_the_kv_cache_equal_transformers(whisper):
    folder, hf, extractor, tokenizer = whisper
    waves = clips()[:2]
    model = mmtf_model(folder, tokenizer)
    wave, lengths = padded_batch(waves)
    out = model.generate(wave, lengths, strategy="beam", num_beams=3, max_new_tokens=8,
                         length_penalty=1.0, early_stopping=True)
    prompt = tokenizer.prompt_ids
    with torch.no_grad():
        ref = transformers.GenerationMixin.generate(
            hf, input_features=hf_features(extractor, waves),
            decoder_input_ids=torch.tensor([prompt] * 2), num_beams=3, max_new_tokens=8,
            do_sample=False, length_penalty=1.0, early_stopping=True,
            logits_processor=transformers.LogitsProcessorList([RenormalisedBan(prompt)]),
            pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id)
    ref = ref[:, len(prompt):]
    eos = tokenizer.eos_id
    for row, ref_row in zip(out.tokens.tolist(), ref.tolist()):
        ref_row = ref_row[: ref_row.index(eos) + 1] if eos in ref_row else ref_row
        assert len(ref_row) > 1 and row[: len(ref_row)] == ref_row


def test_bad_folders_are_one_line_errors(whisper, tmp_path):
    folder, _, _, _ = whisper
    with pytest.raises(UserError, match=r"config.json not found"):
        whisper_encoder(pretrained=tmp_path)
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "gpt2"}')
    (other / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match=r"config.json has model_type='gpt2'.*'whisper'"):
        whisper_decoder(pretrained=other)
    with pytest.raises(UserError, match=r"model.encoder.dim \(96\) disagrees with "
                                        r"\S+config.json \(64\)"):
        whisper_encoder(pretrained=folder, dim=96)
    # A width mismatch with the rest of the model names both sizes.
    encoder = whisper_encoder(pretrained=folder)
    decoder = whisper_decoder(dim=32, depth=1, num_heads=4, vocab_size=310, context_dim=32,
                              max_len=48)
    with pytest.raises(UserError, match=r"model.encoder.dim \(64\) != "
                                        r"model.decoder.context_dim \(32\)"):
        EncoderDecoder(encoder=encoder, decoder=decoder)


def test_export_to_the_hugging_face_layout_loads_in_transformers_with_equal_outputs(
        whisper, tmp_path):
    """A fine-tuned (here: perturbed) pair written by ``format=hf`` is the same model in
    transformers: logits under teacher forcing, greedy tokens, tokenizer ids."""
    from functools import partial

    from mmtf.pretrained import export_hf
    from mmtf.tasks import CaptioningTask

    folder, _, extractor, tokenizer = whisper
    task = CaptioningTask(encoder=whisper_encoder(pretrained=folder),
                          decoder=whisper_decoder(pretrained=folder),
                          optimizer=partial(torch.optim.AdamW, lr=1e-3))
    task.use_tokenizer(tokenizer)
    torch.manual_seed(3)
    with torch.no_grad():                                 # "training" moved every weight
        for p in task.parameters():
            p.add_(0.05 * torch.randn_like(p))
    task.eval()
    cfg = {"encoder": {"_target_": "mmtf.pretrained.whisper.whisper_encoder"},
           "decoder": {"_target_": "mmtf.pretrained.whisper.whisper_decoder"}}
    out = export_hf(task, cfg, tmp_path / "hf")
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(out).eval()
    waves = clips()[:2]
    wave, lengths = padded_batch(waves)
    features = hf_features(extractor, waves)
    tokens = torch.tensor([[*tokenizer.prompt_ids, 5, 17, 42, 99]] * 2)
    with torch.no_grad():
        ref = hf(input_features=features, decoder_input_ids=tokens).logits
        memory, mask = task.model.encode(wave, lengths)
        logits = task.model.decoder(tokens, memory, mask)
    assert (logits - ref).abs().max().item() <= 1e-4
    greedy = task.model.generate(wave, lengths, strategy="greedy", max_new_tokens=8).tokens
    expected = hf_greedy(hf, features, tokenizer.prompt_ids, tokenizer.prompt_ids, 8)
    for row, ref_row in zip(greedy.tolist(), expected):
        eos = tokenizer.eos_id
        ref_row = ref_row[: ref_row.index(eos) + 1] if eos in ref_row else ref_row
        assert len([t for t in ref_row if t != eos]) >= 5, ref_row
        assert row[: len(ref_row)] == ref_row
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "rain falls on a tin roof"
    assert hf_tok(text, add_special_tokens=False).input_ids == tokenizer.encode(
        text, add_special=False)
    assert hf_tok.eos_token_id == tokenizer.eos_id == hf.config.eos_token_id
    # mmtf's own models have no Hugging Face family.
    with pytest.raises(UserError, match=r"format=hf writes models built from \['gpt2', "
                                        r"'llm', 'whisper'\]"):
        export_hf(task, {"encoder": {"_target_": "mmtf.encoders.AudioEncoder"}}, tmp_path / "x")


def test_export_keeps_the_source_generation_config_and_transformers_generates_the_same(
        tmp_path, caplog):
    """format=hf wrote ``suppress_tokens: None`` (and no languages, tasks, begin suppression):
    transformers' ``generate`` on the export then gave other tokens than on the source folder
    (issue 40, defect 10). The source's generation_config.json goes through the checkpoint's
    tokenizer (here: its JSON round trip) into the export unchanged."""
    import json
    from functools import partial

    from mmtf.pretrained import export_hf
    from mmtf.tasks import CaptioningTask
    from mmtf.text import Tokenizer

    source = tmp_path / "source"
    write_whisper(source, suppress=True)
    stored = Tokenizer.from_json_str(PretrainedTokenizer.from_folder(source).to_json_str())
    task = CaptioningTask(encoder=whisper_encoder(pretrained=source),
                          decoder=whisper_decoder(pretrained=source),
                          optimizer=partial(torch.optim.AdamW, lr=1e-3))
    task.use_tokenizer(stored)
    cfg = {"encoder": {"_target_": "mmtf.pretrained.whisper.whisper_encoder"},
           "decoder": {"_target_": "mmtf.pretrained.whisper.whisper_decoder"}}
    out = export_hf(task, cfg, tmp_path / "hf")
    generation = "generation_config.json"
    assert (json.loads((out / generation).read_text())
            == json.loads((source / generation).read_text()))
    features = hf_features(transformers.WhisperFeatureExtractor(), clips()[:2])

    def generate(folder, **options) -> torch.Tensor:
        hf = transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()
        return hf.generate(features, max_new_tokens=12, **options)

    expected = generate(source)
    assert torch.equal(generate(out), expected)
    # The rules decide tokens here, so a lost suppression shows.
    assert not torch.equal(generate(source, suppress_tokens=None, begin_suppress_tokens=None),
                           expected)
    # A tokenizer stored before it kept the file still loads; the export says what is missing.
    older = json.loads(stored.to_json_str())
    del older["generation_config"]
    task.use_tokenizer(Tokenizer.from_json_str(json.dumps(older)))
    with caplog.at_level("WARNING", logger="mmtf.pretrained.whisper"):
        export_hf(task, cfg, tmp_path / "old")
    assert "copy the source folder's generation_config.json" in caplog.text
    assert json.loads((tmp_path / "old" / generation).read_text())["eos_token_id"] == 300


def test_the_yaml_parts_build_from_a_folder_with_null_sizes(whisper):
    """conf/model/{encoder,decoder}/whisper_*.yaml: every size null, read from config.json."""
    from pathlib import Path

    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    folder = whisper[0]
    conf = Path(__file__).resolve().parents[3] / "conf" / "model"
    for path in (conf / "encoder" / "whisper_encoder.yaml",
                 conf / "decoder" / "whisper_decoder.yaml"):
        cfg = OmegaConf.load(path)
        assert cfg.dim is None and cfg.pretrained is None
        part = instantiate(cfg, pretrained=str(folder))
        assert part.dim == 64
    with pytest.raises(InstantiationException, match=r"no pretrained folder and no depth, dim"):
        instantiate(OmegaConf.load(conf / "encoder" / "whisper_encoder.yaml"))
