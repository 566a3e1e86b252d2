"""LoRA adapters in PEFT's format, against peft itself on a tiny random Whisper saved with
``save_pretrained``: mmtf's ``format=peft`` export (of a checkpoint) loaded by ``PeftModel.from_pretrained`` gives
mmtf's logits; an adapter made and saved by peft (random nonzero B) loads into mmtf with
peft's logits; ``format=hf merge_lora=true`` is the merged model in transformers; an adapter
for another base is a one-line error naming it and the shapes."""

from __future__ import annotations

import json
import re
from functools import partial

import pytest
import torch

from mmtf.errors import ConfigError, UserError
from mmtf.export import export_hf_model, export_peft_adapter
from mmtf.nn.lora import lora_layers
from mmtf.pretrained import resolved_sizes
from mmtf.pretrained import whisper as whisper_module
from mmtf.pretrained.peft import part_tables, read_adapter
from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder
from mmtf.tasks import CaptioningTask
from mmtf.text import PretrainedTokenizer
from tests.unit.pretrained.test_whisper import clips, hf_features
from tests.unit.pretrained.tiny_hf import WHISPER_PROMPT, padded_batch, write_whisper

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

CFG = {"encoder": {"_target_": "mmtf.pretrained.whisper.whisper_encoder"},
       "decoder": {"_target_": "mmtf.pretrained.whisper.whisper_decoder"}}
ALL = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """(folder, tokenizer, features, waveforms, lengths, tokens) of a tiny random Whisper."""
    folder = tmp_path_factory.mktemp("whisper")
    write_whisper(folder, d_model=32, layers=2, heads=4)
    tokenizer = PretrainedTokenizer.from_folder(folder, prompt=WHISPER_PROMPT)
    waves = clips()[:2]
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    tokens = torch.tensor([[*tokenizer.prompt_ids, 5, 17, 42, 99]] * 2)
    return folder, tokenizer, hf_features(extractor, waves), *padded_batch(waves), tokens


def _task(folder, tokenizer, lora) -> CaptioningTask:
    task = CaptioningTask(encoder=whisper_encoder(pretrained=folder),
                          decoder=whisper_decoder(pretrained=folder),
                          optimizer=partial(torch.optim.AdamW, lr=1e-3), lora=lora)
    task.use_tokenizer(tokenizer)
    return task.eval()


def _logits(task, wave, lengths, tokens) -> torch.Tensor:
    with torch.no_grad():
        memory, mask = task.model.encode(wave, lengths)
        return task.model.decoder(tokens, memory, mask)


def _base(folder):
    return transformers.WhisperForConditionalGeneration.from_pretrained(folder).eval()


def _peft_logits(model, features, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=tokens).logits


@pytest.mark.slow
@pytest.mark.parametrize("targets", [["q", "k", "v", "o", "mlp"], ["k"]], ids=["all", "k_only"])
def test_format_peft_loads_in_peft_with_mmtf_logits(whisper, tmp_path, targets):
    folder, tokenizer, features, wave, lengths, tokens = whisper
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "parts": ["encoder", "decoder"],
            "targets": targets}
    task = _task(folder, tokenizer, lora)
    torch.manual_seed(1)
    with torch.no_grad():                         # "training" moved every adapter
        for layer in [*lora_layers(task.model.encoder).values(),
                      *lora_layers(task.model.decoder).values()]:
            for b in layer.lora_B.values():
                b.normal_(0.0, 0.3)
    ours = _logits(task, wave, lengths, tokens)
    base = _base(folder)
    assert (ours - _peft_logits(base, features, tokens)).abs().max() > 1e-2   # adapters matter
    ckpt = _checkpoint(task, folder, lora, tmp_path / "lora.ckpt")
    out = export_peft_adapter(ckpt, tmp_path / "adapter")      # rebuilt from the checkpoint
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(folder) and config["r"] == 4
    modules = {m.rsplit(".", 1)[-1] for m in config["target_modules"]}
    assert modules == ({"k_proj"} if targets == ["k"] else set(ALL))
    model = peft.PeftModel.from_pretrained(base, out).eval()
    theirs = _peft_logits(model, features, tokens)
    assert (ours - theirs).abs().max().item() <= 1e-4

    # format=hf merge_lora=true: the merged model is transformers' plain Whisper
    with pytest.raises(ConfigError, match=r"format=hf: the checkpoint's model has LoRA adapters"
                                          r", .* add merge_lora=true"):
        export_hf_model(ckpt, tmp_path / "merged")
    hf = _base(export_hf_model(ckpt, tmp_path / "merged", merge_lora=True))
    assert (ours - _peft_logits(hf, features, tokens)).abs().max().item() <= 1e-4


def _checkpoint(task, folder, lora, path):
    """What mmtf.train stores for this task: the config with the sizes read from the folder."""
    model = {"_target_": "mmtf.tasks.CaptioningTask",
             "encoder": {**CFG["encoder"], "pretrained": str(folder)},
             "decoder": {**CFG["decoder"], "pretrained": str(folder)},
             "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3},
             "lora": lora}
    for part, sizes in resolved_sizes(model, task.export_parts()).items():
        model[part].update(sizes)
    torch.save({"state_dict": task.state_dict(),
                "mmtf": {"config": {"model": model}, "tokenizer": task.tokenizer.to_json_str()}},
               path)
    return path


def _peft_trained(folder, out, target_modules, seed: int = 2):
    """An adapter made by peft's own API with random A and B (init_lora_weights=False), saved."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.0, init_lora_weights=False,
                             target_modules=target_modules)
    model = peft.get_peft_model(_base(folder), config).eval()
    model.save_pretrained(out)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("target_modules, targets", [(ALL, ["q", "k", "v", "o", "mlp"]),
                                                     (["q_proj", "v_proj"], ["q", "v"])],
                         ids=["all", "q_v"])
def test_a_peft_trained_adapter_loads_into_mmtf_with_peft_logits(whisper, tmp_path,
                                                                target_modules, targets):
    folder, tokenizer, features, wave, lengths, tokens = whisper
    model = _peft_trained(folder, tmp_path / "peft", target_modules)
    theirs = _peft_logits(model, features, tokens)
    task = _task(folder, tokenizer, {"r": 8, "alpha": 16, "parts": ["encoder", "decoder"],
                                     "targets": ["q"], "pretrained": str(tmp_path / "peft")})
    assert task.lora.r == 4 and task.lora.alpha == 12 and list(task.lora.targets) == targets
    assert task.resolved_lora()["pretrained"] is None
    ours = _logits(task, wave, lengths, tokens)
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert (ours - _peft_logits(_base(folder), features, tokens)).abs().max() > 1e-2
    trainable = {n for n, p in task.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    # the resolved config rebuilds the same adapters without the folder (a checkpoint)
    again = _task(folder, tokenizer, task.resolved_lora())
    again.load_state_dict(task.state_dict(), strict=True)


def test_an_adapter_for_another_base_names_it_and_the_shapes(whisper, tmp_path):
    folder, tokenizer = whisper[:2]
    other = tmp_path / "other_base"
    write_whisper(other, d_model=48, layers=2, heads=4)
    _peft_trained(other, tmp_path / "peft", ["q_proj"])
    lora = {"r": 8, "alpha": 16, "parts": ["encoder", "decoder"],
            "pretrained": str(tmp_path / "peft")}
    with pytest.raises(UserError, match=rf"model.lora.pretrained: .* was trained for "
                                        rf"base_model_name_or_path='{other}': "
                                        rf"[\w.]+q_proj.lora_A.weight has shape \(4, 48\), but "
                                        rf"mmtf's model.\w+.stack.blocks.0.\w+.to_q "
                                        rf"\(q\) needs \(4, 32\)"):
        _task(folder, tokenizer, lora)
    _peft_trained(folder, tmp_path / "dec_only", r".*decoder\.layers\.\d+\.self_attn\.q_proj")
    with pytest.raises(ConfigError, match=r"model.lora.pretrained: .* has no adapter in the "
                                          r"encoder \(it adapts \['decoder'\]\)"):
        _task(folder, tokenizer, {**lora, "pretrained": str(tmp_path / "dec_only")})
    # self-attention's q_proj alone is no whole target (q is self- and cross-attention's)
    with pytest.raises(ConfigError, match=r"adapts 2 of the 4 projections that its targets "
                                          r"\['q'\] name in the decoder"):
        _task(folder, tokenizer, {**lora, "parts": ["decoder"],
                                  "pretrained": str(tmp_path / "dec_only")})


@pytest.fixture(scope="module")
def plain_peft(tmp_path_factory):
    """A plain LoRA folder as peft saves it (every key at peft's default) and its config."""
    folder = tmp_path_factory.mktemp("plain_peft")
    model = peft.get_peft_model(torch.nn.Sequential(torch.nn.Linear(4, 4)),
                                peft.LoraConfig(r=2, target_modules=["0"]))
    model.save_pretrained(folder)
    return folder, json.loads((folder / "adapter_config.json").read_text())


@pytest.mark.parametrize("change", [{}, {"init_lora_weights": False},
                                    {"init_lora_weights": "gaussian"},
                                    {"fan_in_fan_out": True, "bias": "all", "lora_dropout": 0.1,
                                     "layers_to_transform": [0], "future_option": None}],
                         ids=["defaults", "zero_init", "gaussian", "others"])
def test_plain_lora_options_are_read(plain_peft, change):
    folder, config = plain_peft
    (folder / "adapter_config.json").write_text(json.dumps({**config, **change}))
    assert read_adapter(folder)[0] == {**config, **change}


@pytest.mark.parametrize("option, value", [
    ("init_lora_weights", "pissa"), ("init_lora_weights", "pissa_niter_4"),
    ("init_lora_weights", "olora"), ("init_lora_weights", "corda"),
    ("init_lora_weights", "loftq"), ("loftq_config", {"loftq_bits": 4}),
    ("layer_replication", [[0, 1], [0, 1]]), ("alora_invocation_tokens", [5, 6]),
    ("use_dora", True), ("use_rslora", True), ("modules_to_save", ["classifier"]),
    ("peft_type", "IA3"), ("lora_bias", True), ("future_option", 3)])
def test_options_mmtf_does_not_compute_are_refused_in_one_line(plain_peft, option, value):
    """Each of these gives other outputs than plain LoRA on the same tensors (PiSSA, OLoRA,
    CorDA and LoftQ also change the base weights), so loading must stop and say which."""
    folder, config = plain_peft
    (folder / "adapter_config.json").write_text(json.dumps({**config, option: value}))
    with pytest.raises(UserError, match=rf"model.lora.pretrained: .*adapter_config.json has "
                                        rf"{option}={re.escape(repr(value))}; mmtf loads plain "
                                        rf"LoRA"):
        read_adapter(folder)


def test_a_bug_in_a_name_table_is_no_other_base(whisper, monkeypatch):
    """part_tables skips families of another configuration, never an error of the table's
    own code: that would read as "the adapter was trained on another base"."""
    encoder = whisper_encoder(pretrained=whisper[0])
    assert set(part_tables("encoder", encoder)) == {"whisper"}

    def broken(prefix: str, depth: int):
        raise AttributeError("'Link' object has no attribute 'ours'")

    monkeypatch.setattr(whisper_module, "encoder_links", broken)
    with pytest.raises(AttributeError, match="no attribute 'ours'"):
        part_tables("encoder", encoder)


@pytest.mark.parametrize("target_modules, targets", [(ALL, ["q", "k", "v", "o", "mlp"]),
                                                     (["k_proj"], ["k"]), (["v_proj"], ["v"])],
                         ids=["all", "k", "v"])
def test_bias_lora_only_trains_the_biases_peft_trains(whisper, target_modules, targets):
    """PEFT trains the bias of each adapted module: Whisper's v_proj.bias (mmtf's v_bias, apart
    from the fused to_kv), none for k_proj (no bias)."""
    folder, tokenizer = whisper[:2]
    model = peft.get_peft_model(_base(folder), peft.LoraConfig(
        r=4, target_modules=target_modules, bias="lora_only"))
    theirs = {n.removeprefix("base_model.model.").replace(".base_layer.", ".")
              for n, p in model.named_parameters() if p.requires_grad and n.endswith("bias")}
    task = _task(folder, tokenizer, {"r": 4, "alpha": 8, "parts": ["encoder", "decoder"],
                                     "targets": targets, "bias": "lora_only"})
    ours = set()
    for part in ("encoder", "decoder"):
        module = getattr(task.model, part)
        names = {w: row.theirs for row in whisper_module.part_links(part, module, "model.")
                 for w in row.ours}
        ours |= {t for n, p in module.named_parameters() if p.requires_grad and "lora_" not in n
                 for t in names[n]}
    assert ours == theirs and bool(theirs) == (targets != ["k"])
