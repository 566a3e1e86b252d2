"""The Whisper experiment end to end on a locally saved random-weight tiny Whisper (never
downloaded) and the built-in synthetic audio captions; bad pretrained folders stop the CLI with
one line and exit 2 before any data is generated."""

from __future__ import annotations

import json
import re

import pytest

from mmtf.train import train

from .conftest import COMMON, cli_in_process, compose_train

pytest.importorskip("transformers")

DATA = ["data=synth_audio_captions", "data.synthetic.min_seconds=1.0",
        "data.synthetic.max_seconds=1.5", "data.synthetic.num_workers=0",
        "data.synthetic.num_train=12", "data.synthetic.num_val=4", "data.synthetic.num_test=4",
        "model.generation.max_new_tokens=6", "model.generation.num_beams=2",
        "model.test_metrics=[bleu,rouge_l,cider_d]", "data.max_caption_tokens=24"]


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    from tests.unit.pretrained.tiny_hf import write_whisper

    folder = tmp_path_factory.mktemp("tiny_whisper")
    write_whisper(folder)
    return folder


@pytest.mark.slow
def test_whisper_experiment_fast_dev_run(tiny_whisper, data_dir, tmp_path):
    cfg = compose_train(["experiment=audio_captioning_clotho_whisper", f"paths.data_dir={data_dir}",
                         *COMMON, *DATA, f"pretrained={tiny_whisper}",
                         "trainer.fast_dev_run=true"], tmp_path)
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert any(k.startswith("test/") for k in metrics), metrics
    assert all(v == v for v in metrics.values())       # no NaN


CASES = {
    "missing": (lambda folder, tmp: tmp / "nowhere",
                r"model.encoder \(whisper_encoder\): .*nowhere.* is neither a folder nor a hub id"),
    "no_config": (lambda folder, tmp: tmp,
                  r"model.encoder \(whisper_encoder\): \S+config.json not found"),
    "model_type": (None, r"config.json has model_type='gpt2', but this loader reads 'whisper'"),
    "width": (None, r"model.encoder.dim \(96\) disagrees with \S+config.json \(64\)"),
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_pretrained_folder_is_one_line_before_any_data(case, tiny_whisper, tmp_path):
    data_dir = tmp_path / "data"
    make, pattern = CASES[case]
    extra = []
    if case == "model_type":
        folder = tmp_path / "gpt2"
        folder.mkdir()
        config = json.loads((tiny_whisper / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
        (folder / "model.safetensors").write_bytes((tiny_whisper / "model.safetensors")
                                                   .read_bytes())
    elif case == "width":
        folder, extra = tiny_whisper, ["model.encoder.dim=96"]
    else:
        folder = make(tiny_whisper, tmp_path / "empty")
        (tmp_path / "empty").mkdir()
    args = ["experiment=audio_captioning_clotho_whisper", f"paths.data_dir={data_dir}", *COMMON,
            *DATA, f"pretrained={folder}", *extra,
            f"hydra.run.dir={tmp_path / 'run'}"]
    out = cli_in_process("mmtf.train", args, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("mmtf: error:")]
    assert len(errors) == 1 and re.search(pattern, errors[0]), out.stderr[-3000:]
    assert not data_dir.exists()                           # no data generated


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trained_checkpoint_rebuilds_alone_and_exports_for_transformers(tiny_whisper,
                                                                           data_dir, tmp_path):
    import torch
    import transformers

    from mmtf.checkpoint_io import load_checkpoint
    from mmtf.tasks.rebuild import build_task

    run = tmp_path / "run"
    train(compose_train(["experiment=audio_captioning_clotho_whisper",
                         f"paths.data_dir={data_dir}", *COMMON, *DATA,
                         f"pretrained={tiny_whisper}"], run))
    ckpt = run / "checkpoints" / "last.ckpt"
    stored = load_checkpoint(ckpt)["mmtf"]["config"]["model"]
    assert stored["encoder"]["dim"] == 64 and stored["decoder"]["vocab_size"] == 310
    task, _ = build_task(load_checkpoint(ckpt), ckpt)    # sizes from the checkpoint alone
    out = cli_in_process("mmtf.export", [f"ckpt_path={ckpt}", "format=hf",
                                         f"out={tmp_path / 'hf'}",
                                         f"hydra.run.dir={tmp_path / 'x'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    generation = "generation_config.json"       # the source's, through the checkpoint
    assert (json.loads((tmp_path / "hf" / generation).read_text())
            == json.loads((tiny_whisper / generation).read_text()))
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    wave = 0.1 * torch.randn(1, 16000 * 2, generator=torch.Generator().manual_seed(0))
    features = transformers.WhisperFeatureExtractor()(wave[0].numpy(), sampling_rate=16000,
                                                      return_tensors="pt").input_features
    tokens = torch.tensor([[*task.tokenizer.prompt_ids, 5, 6, 7]])
    task.eval()
    with torch.no_grad():
        ref = hf(input_features=features, decoder_input_ids=tokens).logits
        memory, mask = task.model.encode(wave, torch.tensor([wave.shape[1]]))
        logits = task.model.decoder(tokens, memory, mask)
    assert (logits - ref).abs().max().item() <= 1e-4
    # The mmtf format of each part loads back by the override that loads any export.
    from mmtf.export import export_part
    from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder

    for part, build in (("encoder", whisper_encoder), ("decoder", whisper_decoder)):
        folder = export_part(ckpt, part, tmp_path / part)
        back = build(pretrained=folder).eval()           # sizes from the export's config.yaml
        ours = getattr(task.model, part).state_dict()
        assert all(torch.equal(v, ours[k]) for k, v in back.state_dict().items())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_captions_without_its_pretrained_folder(tiny_whisper, data_dir, tmp_path):
    import shutil

    import torch

    import mmtf
    from mmtf.predict import predict

    from .conftest import evaluate_in_process

    folder = tmp_path / "whisper"
    shutil.copytree(tiny_whisper, folder)
    run = tmp_path / "run"
    train(compose_train(["experiment=audio_captioning_clotho_whisper",
                         f"paths.data_dir={data_dir}", *COMMON, *DATA, "test=false",
                         "trainer.limit_train_batches=1", "trainer.limit_val_batches=1",
                         f"pretrained={folder}"], run))
    ckpt = run / "checkpoints" / "last.ckpt"
    waves = [0.1 * torch.randn(n, generator=torch.Generator().manual_seed(n))
             for n in (16000, 24000)]
    files = sorted((data_dir).rglob("*.wav"))[:2]

    def captions():
        model, _ = mmtf.load(ckpt)
        return model.caption(waves), [r["caption"] for r in predict(str(ckpt), map(str, files))]

    before = captions()
    metrics_before = evaluate_in_process(ckpt, tmp_path / "eval1")
    folder.rename(tmp_path / "moved")                      # the checkpoint on another machine
    assert captions() == before
    assert evaluate_in_process(ckpt, tmp_path / "eval2") == metrics_before


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_lora_variant_trains_adapters_only_and_exports_them_for_peft(tiny_whisper, data_dir,
                                                                        tmp_path):
    """README's LoRA variant end to end: ``model/lora=default`` trains, the base in the
    checkpoint is the folder's bit for bit, ``format=peft`` loads in peft with mmtf's logits,
    ``mmtf.load`` rebuilds the adapters from the checkpoint alone."""
    import torch
    import transformers

    import mmtf
    from mmtf.checkpoint_io import load_checkpoint
    from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder

    peft = pytest.importorskip("peft")
    run = tmp_path / "run"
    train(compose_train(["experiment=audio_captioning_clotho_whisper",
                         f"paths.data_dir={data_dir}", *COMMON, *DATA, "test=false",
                         "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                         f"pretrained={tiny_whisper}", "model/lora=default",
                         "model.lora.r=4", "model.optimizer.lr=1e-2"], run))
    ckpt = run / "checkpoints" / "last.ckpt"
    state = load_checkpoint(ckpt)["state_dict"]
    for part, build in (("encoder", whisper_encoder), ("decoder", whisper_decoder)):
        base = build(pretrained=tiny_whisper).state_dict()
        for key, value in base.items():
            assert torch.equal(state[f"model.{part}.{key}"], value), (part, key)
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in state.items())   # trained
    out = cli_in_process("mmtf.export", [f"ckpt_path={ckpt}", "format=peft",
                                         f"out={tmp_path / 'adapter'}",
                                         f"hydra.run.dir={tmp_path / 'x'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(tiny_whisper).eval()
    model = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    task, _ = mmtf.load(ckpt)
    wave = 0.1 * torch.randn(1, 16000 * 2, generator=torch.Generator().manual_seed(0))
    features = transformers.WhisperFeatureExtractor()(wave[0].numpy(), sampling_rate=16000,
                                                      return_tensors="pt").input_features
    tokens = torch.tensor([[*task.tokenizer.prompt_ids, 5, 6, 7]])
    with torch.no_grad():
        ref = model(input_features=features, decoder_input_ids=tokens).logits
        memory, mask = task.model.encode(wave, torch.tensor([wave.shape[1]]))
        logits = task.model.decoder(tokens, memory, mask)
    assert (logits - ref).abs().max().item() <= 1e-4
