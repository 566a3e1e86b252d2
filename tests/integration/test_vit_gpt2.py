"""The ViT + GPT-2 experiment end to end on random-weight tiny folders built locally (the
experiment's make_tiny_models.py, never downloaded), and bad pretrained folders as one line."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from mmtf.train import train

from .conftest import COMMON, REPO, cli_in_process, compose_train

transformers = pytest.importorskip("transformers")
EXPERIMENT = "image_captioning_coco_vit_gpt2"
SCRIPT = REPO / "experiments" / EXPERIMENT / "make_tiny_models.py"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """The tiny ViT and GPT-2 folders and the overrides that point the experiment at them."""
    spec = importlib.util.spec_from_file_location("make_tiny_models", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path_factory.mktemp("tiny_models")
    script.write_vit(out / "vit")
    vocab = script.write_gpt2(out / "gpt2")
    eos = json.loads((out / "gpt2" / "config.json").read_text())["eos_token_id"]
    return out, script.overrides(out, vocab, eos)


def _overrides(data_dir, models, *extra):
    return [f"experiment={EXPERIMENT}", "data=synth_image_captions", f"paths.data_dir={data_dir}",
            *COMMON, "data.synthetic.num_train=12", "data.synthetic.num_val=4",
            "data.synthetic.num_test=4", "data.synthetic.num_workers=0",
            "model.test_metrics=[bleu,rouge_l,cider_d]", *models, *extra]


@pytest.mark.slow
def test_fast_dev_run_on_tiny_pretrained_folders(tiny_models, data_dir, tmp_path):
    _, models = tiny_models
    cfg = compose_train(_overrides(data_dir, models, "trainer.fast_dev_run=true"), tmp_path)
    assert cfg.tokenizer.kind == "pretrained"
    assert cfg.data.transforms.train[0].source == cfg.model.encoder.pretrained
    train(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert "test/cider_d" in metrics and all(v == v for v in metrics.values())


CASES = {
    "missing_weights": r"gpt2_decoder: .*gpt2/model\.safetensors not found",
    "other_architecture": r"model\.encoder \(vit_encoder\): .*gpt2/config\.json has "
                          r"model_type='gpt2', but this loader reads",
    "size_disagrees": r"model\.encoder does not match .*vit/config\.json: dim=32, but it has "
                      r"hidden_size=64 \(dim=64\)",
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_pretrained_folders_are_one_line_before_anything_is_written(case, tiny_models,
                                                                        tmp_path):
    import shutil

    source, models = tiny_models
    folder = tmp_path / "models"
    shutil.copytree(source, folder)
    models = [m.replace(str(source), str(folder)) for m in models]
    if case == "missing_weights":
        (folder / "gpt2" / "model.safetensors").unlink()
    elif case == "other_architecture":
        models.append(f"model.encoder.pretrained={folder / 'gpt2'}")
    else:
        models.append("model.encoder.dim=32")
    data_dir, run = tmp_path / "data", tmp_path / "run"
    out = cli_in_process("mmtf.train", _overrides(data_dir, models, f"hydra.run.dir={run}"),
                         cwd=tmp_path, env={"HYDRA_FULL_ERROR": "0"})
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("mmtf: error:")]
    assert len(errors) == 1 and re.search(CASES[case], errors[0]), out.stderr[-3000:]
    assert not data_dir.exists() and not list(run.rglob("*.ckpt"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trained_captioner_exports_for_transformers(tiny_models, data_dir, tmp_path):
    import torch

    from mmtf.checkpoint_io import load_checkpoint
    from mmtf.tasks.rebuild import build_task

    _, models = tiny_models
    run = tmp_path / "run"
    train(compose_train(_overrides(data_dir, models, "test=false"), run))
    ckpt = run / "checkpoints" / "last.ckpt"
    task, _ = build_task(load_checkpoint(ckpt), ckpt)    # without re-reading the folders
    out = cli_in_process("mmtf.export", [f"ckpt_path={ckpt}", "format=hf",
                                         f"out={tmp_path / 'hf'}",
                                         f"hydra.run.dir={tmp_path / 'x'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "VisionEncoderDecoderModel" in out.stdout
    hf = transformers.VisionEncoderDecoderModel.from_pretrained(tmp_path / "hf").eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[*task.tokenizer.prompt_ids, 5, 6, 7]] * 2)
    task.eval()
    with torch.no_grad():
        ref = hf(pixel_values=images, decoder_input_ids=tokens).logits
        memory, mask = task.model.encode(images)
        logits = task.model.decoder(tokens, memory, mask)
    assert (logits - ref).abs().max().item() <= 1e-4
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "a red circle on the left of a blue square"
    assert theirs(text)["input_ids"] == task.tokenizer.encode(text, add_special=False)


def _captions(ckpt, files):
    import mmtf
    from mmtf.predict import predict

    model, _ = mmtf.load(ckpt)
    return [r["caption"] for r in predict(str(ckpt), [str(f) for f in files])], model.caption(files)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_captions_without_its_pretrained_folders(tiny_models, data_dir, tmp_path):
    import shutil

    import numpy as np
    from PIL import Image

    from .conftest import evaluate_in_process

    source, models = tiny_models
    folder = tmp_path / "models"
    shutil.copytree(source, folder)
    models = [m.replace(str(source), str(folder)) for m in models]
    run = tmp_path / "run"
    train(compose_train(_overrides(data_dir, models, "test=false", "trainer.limit_train_batches=1",
                                   "trainer.limit_val_batches=1"), run))
    ckpt = run / "checkpoints" / "last.ckpt"
    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate([(40, 52), (61, 33)]):
        files.append(tmp_path / f"img{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(files[-1])
    before = _captions(ckpt, files)
    metrics_before = evaluate_in_process(ckpt, tmp_path / "eval1")
    folder.rename(tmp_path / "moved")                      # the checkpoint on another machine
    assert _captions(ckpt, files) == before
    assert evaluate_in_process(ckpt, tmp_path / "eval2") == metrics_before
