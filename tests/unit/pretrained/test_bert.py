"""BERT-family text encoders (bert, roberta, xlm-roberta, sentence-transformers folders) against
transformers on tiny random folders.

Each folder is written once per module by ``tiny_hf.write_bert`` / ``write_sentence_transformer``
(transformers' ``save_pretrained``); the reference is the transformers model and tokenizer read
from it (and ``SentenceTransformer(folder).encode`` where sentence-transformers is installed).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from safetensors.torch import load_file, save_file

import mmtf
from mmtf.errors import UserError
from mmtf.pretrained import resolved_sizes
from mmtf.pretrained.bert import SIZES, bert_encoder, save_hf
from mmtf.pretrained.bert_text import PretrainedTextEncoder
from mmtf.text import PretrainedTokenizer
from tests.unit.presets import load_preset

from .tiny_hf import write_bert, write_sentence_transformer

transformers = pytest.importorskip("transformers")

TEXTS = ["a dog barks at the cat", "Rain falls on a tin roof near the busy road and birds sing",
         "water", "people talk [MASK] <mask> near the bucket!", "tall trees, tall trees"]
# name -> write_bert arguments
CASES = {"bert": dict(model_type="bert"), "roberta": dict(model_type="roberta"),
         "xlm-roberta": dict(model_type="xlm-roberta", layers=1),
         "bert_sharded": dict(model_type="bert", shard="20KB")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> (folder, the transformers model that wrote it, the mmtf encoder read from it)."""
    out = {}
    for name, kw in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        reference = write_bert(folder, **kw)
        out[name] = (folder, reference, bert_encoder(pretrained=folder).eval())
    return out


def hf_batch(folder, texts=TEXTS, max_length=None):
    """transformers' tokenizer of ``folder``: right-padded ids and the attention mask."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(list(texts), padding=True, truncation=max_length is not None,
                max_length=max_length, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def mean_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' mean: sum over the attention mask / its count."""
    weight = mask[..., None].to(states.dtype)
    return (states * weight).sum(1) / weight.sum(1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_token_states_match_transformers_with_padding(folders, name):
    folder, reference, encoder = folders[name]
    ids, mask = hf_batch(folder)
    assert (mask == 0).any()                                  # the batch is padded
    with torch.no_grad():
        theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = encoder(ids, mask)
    real = mask.bool()
    assert theirs.abs().max() > 1.0
    torch.testing.assert_close(ours.memory[real], theirs[real], atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.mask, real) and not ours.memory[~real].any()   # padding zeroed


def test_bert_token_types_of_a_sentence_pair(folders):
    folder, reference, encoder = folders["bert"]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(["a dog barks", "rain"], ["at the cat", "falls on a tin roof"], padding=True,
                return_tensors="pt")
    assert batch["token_type_ids"].any()
    with torch.no_grad():
        theirs = reference(**batch).last_hidden_state
        ours = encoder(batch["input_ids"], batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).memory
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


def test_roberta_left_padding_counts_real_tokens_as_transformers(folders):
    """transformers' RoBERTa numbers the positions of non-pad ids from pad_token_id + 1, so a
    left-padded row keeps the positions it has alone."""
    folder, reference, encoder = folders["roberta"]
    ids, mask = hf_batch(folder)
    pad = reference.config.pad_token_id
    left_ids, left_mask = torch.full_like(ids, pad), torch.zeros_like(mask)
    for i, n in enumerate(mask.sum(1).tolist()):
        left_ids[i, ids.shape[1] - n:] = ids[i, :n]
        left_mask[i, ids.shape[1] - n:] = 1
    with torch.no_grad():
        theirs = reference(input_ids=left_ids, attention_mask=left_mask).last_hidden_state
        ours = encoder(left_ids, left_mask).memory
        right = encoder(ids, mask).memory
    real = left_mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[real], right[mask.bool()], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_tokenizer_ids_match_transformers(folders, family):
    """WordPiece (lower-cased) and RoBERTa's byte-level BPE: ids, padding and truncation (the end
    token kept) as transformers' tokenizer gives them, special tokens spelled in the text too."""
    folder = folders[family][0]
    model = PretrainedTextEncoder.from_folder(folder)
    mask_id = transformers.AutoTokenizer.from_pretrained(folder).mask_token_id
    for max_length in (None, 6):
        if max_length is not None:
            model.max_len = max_length
        ids, mask = hf_batch(folder, max_length=max_length)
        ours_ids, ours_mask = model.encode_texts(TEXTS)
        assert torch.equal(ours_ids, ids) and torch.equal(ours_mask, mask.bool())
        if max_length is None:
            assert (ids == mask_id).any()                 # "[MASK]" / "<mask>" in the text


@pytest.fixture(scope="module")
def st_folders(tmp_path_factory):
    """pooling -> (folder, its BertModel): sentence-transformers folders built by hand."""
    out = {}
    for pooling, kw in {"mean": dict(normalize=True), "cls": dict(normalize=False, legacy=False),
                        "lasttoken": dict(normalize=False)}.items():
        folder = tmp_path_factory.mktemp(f"st_{pooling}")
        out[pooling] = (folder, write_sentence_transformer(folder, pooling=pooling, **kw))
    return out


def test_mean_pooled_normalised_embeddings_equal_transformers(st_folders):
    folder, reference = st_folders["mean"]
    model, _ = mmtf.load(folder)
    ours = model.embed_text(TEXTS, batch_size=2)
    ids, mask = hf_batch(folder, max_length=16)               # sentence_bert_config's 16
    with torch.no_grad():
        states = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    theirs = F.normalize(mean_pool(states, mask), dim=-1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEXTS)))
    # unnormalised on request: the plain mean
    torch.testing.assert_close(model.embed_text(TEXTS, normalize=False), mean_pool(states, mask),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_embeddings_equal_sentence_transformers(st_folders, pooling):
    st = pytest.importorskip("sentence_transformers")
    folder, _ = st_folders[pooling]
    theirs = st.SentenceTransformer(str(folder), device="cpu").encode(
        TEXTS, convert_to_tensor=True, batch_size=2)
    ours = PretrainedTextEncoder.from_folder(folder).embed_text(TEXTS)
    torch.testing.assert_close(ours, theirs.cpu(), atol=1e-4, rtol=1e-4)


def test_cls_and_last_token_pooling(st_folders):
    for pooling, pick in (("cls", lambda m: torch.zeros(m.shape[0], dtype=torch.long)),
                          ("lasttoken", lambda m: m.sum(1) - 1)):
        folder, reference = st_folders[pooling]
        ours = PretrainedTextEncoder.from_folder(folder).embed_text(TEXTS)
        ids, mask = hf_batch(folder, max_length=16)
        with torch.no_grad():
            states = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = states[torch.arange(len(TEXTS)), pick(mask)]
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_pooling_override_and_resolved_sizes(st_folders):
    folder, _ = st_folders["mean"]
    enc = bert_encoder(pretrained=folder, pooling={"mode": "cls", "normalize": None})
    assert enc.pooling.mode == "cls" and enc.pooling.normalize is True   # the folder's Normalize
    cfg = {"text_encoder": {"_target_": "mmtf.pretrained.bert.bert_encoder", "dim": None,
                            "pooling": {"mode": None, "normalize": None, "head": "none"}}}
    sizes = resolved_sizes(cfg, {"text_encoder": bert_encoder(pretrained=folder)})
    assert sizes["text_encoder"]["dim"] == 32
    assert sizes["text_encoder"]["pooling"] == {"mode": "mean", "normalize": True, "head": "none"}


@pytest.mark.parametrize("name", ["bert", "roberta", "xlm-roberta"])
def test_hf_export_loads_back_with_equal_outputs(folders, name, tmp_path):
    folder, _, encoder = folders[name]
    out = save_hf(encoder, tmp_path / "export", tokenizer_folder=folder)
    assert json.loads((out / "config.json").read_text())["model_type"] == name
    back = transformers.AutoModel.from_pretrained(out).eval()
    ids, mask = hf_batch(folder)
    with torch.no_grad():
        theirs = back(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = encoder(ids, mask).memory
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
    # the export is a sentence-transformers folder of the same embedding
    model, _ = mmtf.load(out)
    torch.testing.assert_close(model.embed_text(TEXTS),
                               PretrainedTextEncoder.from_folder(folder).embed_text(TEXTS))


def test_unsupported_family_is_one_line_naming_it(tmp_path, folders):
    folder = tmp_path / "distil"
    shutil.copytree(folders["bert"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "distilbert"}))
    with pytest.raises(UserError, match=r"model_type 'distilbert' is not a supported "
                                        r"text-encoder family; mmtf builds bert .*roberta, "
                                        r"xlm-roberta"):
        bert_encoder(pretrained=folder)
    with pytest.raises(UserError, match=r"model_type 'distilbert' is not supported zero-shot.*"
                                        r"text encoders bert"):
        mmtf.load(folder)


def test_size_mismatch_names_the_field_and_the_override(folders):
    with pytest.raises(UserError, match=r"dim=64, but it has hidden_size=32 .*"
                                        r"model\.text_encoder\.dim=32"):
        bert_encoder(pretrained=folders["bert"][0], dim=64)


def test_original_bert_names_with_prefix_and_gamma_beta_load(folders, tmp_path):
    """BertForMaskedLM-style ``bert.`` names and the original checkpoint's LayerNorm.gamma/beta
    load into the same encoder."""
    folder, _, encoder = folders["bert"]
    copy = tmp_path / "old"
    shutil.copytree(folder, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    renamed = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma")
               .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in tensors.items()}
    renamed["cls.predictions.bias"] = torch.zeros(3)                  # a head, not read
    save_file(renamed, str(copy / "model.safetensors"))
    old = bert_encoder(pretrained=copy)
    for key, value in encoder.state_dict().items():
        assert torch.equal(old.state_dict()[key], value), key


def test_pickled_weights_are_refused(folders, tmp_path):
    copy = tmp_path / "pickled"
    shutil.copytree(folders["bert"][0], copy)
    (copy / "model.safetensors").rename(copy / "pytorch_model.bin")
    with pytest.raises(UserError, match=r"only pickled weights .* never unpickles"):
        bert_encoder(pretrained=copy)


@pytest.mark.parametrize(("change", "match"), [
    ({"pooling_mode": "max"}, r"pools by 'max'; mmtf pools mean, cls, lasttoken"),
    ({"pooling_mode": ["cls", "mean"]}, r"concatenates poolings \['cls', 'mean'\]"),
    ("dense", r"has a 'Dense' module \(2_Dense\); mmtf reads sentence-transformers folders of "
              r"Transformer, Pooling, Normalize"),
])
def test_sentence_transformers_modules_mmtf_does_not_build(st_folders, tmp_path, change, match):
    folder = tmp_path / "st"
    shutil.copytree(st_folders["mean"][0], folder)
    if change == "dense":
        modules = json.loads((folder / "modules.json").read_text())
        modules.append({"idx": 3, "name": "3", "path": "2_Dense",
                        "type": "sentence_transformers.models.Dense"})
        (folder / "modules.json").write_text(json.dumps(modules))
    else:
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(change))
    with pytest.raises(UserError, match=match):
        PretrainedTextEncoder.from_folder(folder)


def test_load_refuses_generation_settings(st_folders):
    with pytest.raises(UserError, match=r"a text encoder generates nothing"):
        mmtf.load(st_folders["mean"][0], max_new_tokens=3)


def test_projection_head_is_new_and_the_rest_is_the_folder(folders):
    folder, _, encoder = folders["bert"]
    torch.manual_seed(0)
    tower = bert_encoder(pretrained=folder, pooling={"head": "mlp", "embed_dim": 8,
                                                     "normalize": True})
    assert tower.embed_dim == 8 and tower.head[0].weight.shape == (32, 32)
    own = tower.state_dict()
    assert all(torch.equal(own[k], v) for k, v in encoder.state_dict().items())
    ids, mask = hf_batch(folder)
    torch.testing.assert_close(tower.embed(ids, mask).norm(dim=-1), torch.ones(len(TEXTS)))
    with pytest.raises(UserError, match=r"projection head has no place"):
        save_hf(tower, folder.parent / "no")


@pytest.mark.parametrize("name", ["bert", "minilm"])
def test_presets_build_in_bert_configuration(name):
    cfg = load_preset("text_encoder", name)
    with torch.device("meta"):                             # base sizes: shapes only, no memory
        enc = instantiate(cfg)
    block = enc.stack.blocks[0]
    assert enc.dim == cfg.dim and block.postnorm and block.mlp.fc_in.out_features == cfg.mlp_hidden
    assert enc.pooling.mode == "mean" and enc.pooling.normalize is False   # no folder: defaults


def test_preset_with_null_sizes_reads_the_folder(st_folders):
    folder, _ = st_folders["mean"]
    cfg = load_preset("text_encoder", "bert")
    for key in SIZES:
        cfg[key] = None
    cfg.pretrained = str(folder)
    enc = instantiate(cfg)
    assert enc.dim == 32 and enc.pooling.normalize is True          # its Normalize module
    torch.testing.assert_close(PretrainedTextEncoder(enc.eval(), PretrainedTokenizer.from_folder(
        folder), max_len=16).embed_text(TEXTS), mmtf.load(folder)[0].embed_text(TEXTS))


def test_export_format_hf_routes_a_bert_encoder_and_an_mmtf_export_loads(folders, tmp_path):
    """``mmtf.export format=hf`` of a task whose encoder came from a BERT folder (no decoder)
    writes BertModel; the encoder's mmtf export (weights.safetensors + config.yaml) rebuilds it."""
    from types import SimpleNamespace

    from mmtf.hub import write_export
    from mmtf.pretrained import export_hf
    from mmtf.pretrained.bert import resolved_sizes as sizes_of

    folder, reference, encoder = folders["bert"]
    task = SimpleNamespace(export_parts=lambda: {"encoder": encoder},
                           run_config={"pretrained": str(folder)})
    out = export_hf(task, {"encoder": {"_target_": "mmtf.pretrained.bert.bert_encoder"}},
                    tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    assert (out / "tokenizer.json").is_file() and (out / "modules.json").is_file()
    sizes = sizes_of("text_encoder", encoder)
    write_export(tmp_path / "mmtf", encoder.state_dict(),
                 {"_target_": "mmtf.pretrained.bert.bert_encoder", **sizes})
    back = bert_encoder(pretrained=tmp_path / "mmtf", **sizes).eval()
    ids, mask = hf_batch(folder)
    assert torch.equal(back(ids, mask).memory, encoder(ids, mask).memory)


def test_old_sentence_transformers_layout_with_a_module_subfolder(st_folders, tmp_path):
    """Older sentence-transformers folders keep the model, its config and tokenizer in
    ``0_Transformer/`` (modules.json's path), with no config.json at the top."""
    folder = tmp_path / "old_st"
    shutil.copytree(st_folders["mean"][0], folder)
    sub = folder / "0_Transformer"
    sub.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "sentence_bert_config.json"):
        (folder / name).rename(sub / name)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (folder / "modules.json").write_text(json.dumps(modules))
    model, _ = mmtf.load(folder)
    torch.testing.assert_close(model.embed_text(TEXTS), mmtf.load(st_folders["mean"][0])[0]
                               .embed_text(TEXTS))
