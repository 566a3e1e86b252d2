"""Decoder-only LLM families (llama, qwen2, qwen3) against transformers on tiny random folders.

Each folder is written once per module by ``tiny_hf.write_llm`` (transformers'
``save_pretrained``); the reference is the transformers model that wrote it.
"""

from __future__ import annotations

import json

import pytest
import torch

from mmtf.decoders.lm import CausalLM
from mmtf.errors import UserError
from mmtf.pretrained.llm import llm_decoder, load_peft, save_hf, save_peft

from .tiny_hf import ENDOFTEXT, write_llm

transformers = pytest.importorskip("transformers")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
# name -> write_llm arguments; max_positions 24 makes the dynamic case scale inside the tests.
CASES = {
    "llama": dict(model_type="llama"),
    "llama_tied_llama3": dict(model_type="llama", tie=True, rope_scaling=LLAMA3),
    "llama_linear": dict(model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama_dynamic": dict(model_type="llama", max_positions=24,
                          rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
    "qwen2_tied": dict(model_type="qwen2", tie=True),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3"),
    "qwen3_tied_llama3": dict(model_type="qwen3", tie=True, rope_scaling=LLAMA3),
}
GENERATED = ("llama_tied_llama3", "llama_dynamic", "qwen2_tied", "qwen3")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> (folder, the transformers model that wrote it, the mmtf model read from it)."""
    out = {}
    for name, kw in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        reference = write_llm(folder, **kw)
        out[name] = (folder, reference, llm_decoder(pretrained=folder).eval())
    return out


def prompts(vocab: int, lengths=(9, 5, 7), seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts (b, p) and their 0/1 attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(0, vocab - 3, (n,), generator=g)
        mask[i, width - n:] = 1
    return ids, mask


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers(folders, name):
    folder, reference, lm = folders[name]
    ids = torch.randint(0, lm.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = lm(ids), reference(ids).logits
    assert theirs.abs().max() > 3.0                      # far from a uniform distribution
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,side", [("llama", "left"), ("qwen2", "left"),
                                       ("qwen3_tied_llama3", "left"), ("qwen3", "right")])
def test_padded_logits_match_transformers(folders, name, side):
    _, reference, lm = folders[name]
    ids, mask = prompts(lm.vocab_size)
    if side == "right":
        ids, mask = ids.flip(1), mask.flip(1)      # reversed prompts, padded on the right
    with torch.no_grad():
        ours, theirs = lm(ids, mask), reference(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", GENERATED)
def test_greedy_tokens_equal_transformers_generate_batched_and_one_by_one(folders, name):
    """32 greedy steps of a left-padded batch: transformers' tokens, mmtf cached, mmtf
    uncached, and each prompt alone are all the same. (Dynamic NTK scaling depends on the
    history: the frequencies follow the longest position of the batch so far while cached
    keys keep theirs, in transformers as here; there only the cached batch is compared.)"""
    _, reference, lm = folders[name]
    ids, mask = prompts(lm.vocab_size)
    kw = dict(max_new_tokens=32, min_new_tokens=32)
    theirs = reference.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                pad_token_id=lm.eos_id, **kw)[:, ids.shape[1]:]
    ours = lm.generate(ids, mask, **kw).tokens
    assert torch.equal(ours, theirs)
    if "dynamic" in name:
        assert ids.shape[1] + 32 > lm.stack.rope.trained_len        # it did scale
        return
    assert torch.equal(lm.generate(ids, mask, use_cache=False, **kw).tokens, theirs)
    for i in range(ids.shape[0]):
        alone = ids[i:i + 1, mask[i].bool()]
        assert torch.equal(lm.generate(alone, **kw).tokens[0], theirs[i])


def test_chunked_cached_decoding_equals_one_pass(folders):
    """Chunks of several new tokens on a filled cache (queries fewer than keys: the causal mask
    is bottom-right aligned, not SDPA's top-left) equal the uncached pass, padded or not."""
    _, _, lm = folders["qwen3"]
    ids, mask = prompts(lm.vocab_size, lengths=(12, 8))
    with torch.no_grad():
        whole = lm(ids, mask)
        for m in (mask, None):
            cache = lm.make_cache(batch_size=2, max_len=12)
            parts = [lm(ids[:, a:b], None if m is None else m[:, :b], cache=cache)
                     for a, b in ((0, 5), (5, 6), (6, 9), (9, 12))]
            chunked = torch.cat(parts, dim=1)
            ref = whole if m is not None else lm(ids)
            real = mask.bool() if m is not None else torch.ones_like(mask, dtype=torch.bool)
            torch.testing.assert_close(chunked[real], ref[real], atol=1e-5, rtol=1e-5)


def test_inputs_embeds_equal_ids(folders):
    _, _, lm = folders["llama"]
    ids, mask = prompts(lm.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(lm(inputs_embeds=lm.embed_tokens(ids), attention_mask=mask),
                                   lm(ids, mask))
        by_embeds = lm.generate(inputs_embeds=lm.embed_tokens(ids), attention_mask=mask,
                                max_new_tokens=8).tokens
    assert torch.equal(by_embeds, lm.generate(ids, mask, max_new_tokens=8).tokens)


def test_beam_search_equals_transformers(folders):
    _, reference, lm = folders["llama"]
    ids, mask = prompts(lm.vocab_size, lengths=(6, 4))
    kw = dict(max_new_tokens=10, min_new_tokens=10, num_beams=3, length_penalty=1.0)
    theirs = reference.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                early_stopping=True, pad_token_id=lm.eos_id,
                                **kw)[:, ids.shape[1]:]
    ours = lm.generate(ids, mask, strategy="beam", **kw).tokens
    assert torch.equal(ours, theirs)


def test_sharded_folder_loads(tmp_path_factory, folders):
    folder = tmp_path_factory.mktemp("sharded")
    reference = write_llm(folder, model_type="qwen2", shard="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(llm_decoder(pretrained=folder)(ids), reference(ids).logits,
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["llama_tied_llama3", "qwen2", "qwen3", "llama_dynamic"])
def test_format_hf_export_loads_in_transformers(folders, tmp_path, name):
    folder, _, _ = folders[name]
    lm = llm_decoder(pretrained=folder).eval()     # a fresh dynamic RoPE state, as back's
    out = save_hf(lm, tmp_path / "hf", tokenizer_folder=folder)
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(back).__name__ == json.loads((folder / "config.json").read_text())[
        "architectures"][0]
    ids = torch.randint(0, lm.vocab_size, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, lm(ids), atol=1e-4, rtol=1e-4)
    assert (out / "tokenizer.json").is_file()


def _random_lora(lm: CausalLM) -> None:
    from mmtf.nn.lora import LoRAConfig, add_lora, lora_layers

    add_lora(lm, LoRAConfig(r=4, alpha=8.0, targets=("q", "k", "v", "o")))
    torch.manual_seed(3)
    with torch.no_grad():
        for layer in lora_layers(lm).values():
            for b in layer.lora_B.values():
                b.normal_(0.0, 0.5)


def test_lora_exported_as_peft_loads_in_peftmodel_and_back(folders, tmp_path):
    peft = pytest.importorskip("peft")
    folder, _, _ = folders["llama"]
    lm = llm_decoder(pretrained=folder).eval()
    _random_lora(lm)
    out = save_peft(lm, tmp_path / "adapter", base=str(folder))
    base = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    model = peft.PeftModel.from_pretrained(base, out).eval()
    ids = torch.randint(0, lm.vocab_size, (2, 16))
    with torch.no_grad():
        ours = lm.eval()(ids)
        torch.testing.assert_close(model(input_ids=ids).logits, ours, atol=1e-4, rtol=1e-4)
        # ... and the folder loads back into a fresh mmtf model.
        again = llm_decoder(pretrained=folder).eval()
        config = load_peft(again, out)
        assert config.r == 4 and set(config.targets) == {"q", "k", "v", "o"}
        torch.testing.assert_close(again.eval()(ids), ours, atol=1e-5, rtol=1e-5)


def test_peft_made_adapter_loads_into_mmtf(folders, tmp_path):
    peft = pytest.importorskip("peft")
    folder, _, _ = folders["qwen2"]
    base = transformers.Qwen2ForCausalLM.from_pretrained(folder).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    torch.manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path / "adapter")
    lm = llm_decoder(pretrained=folder).eval()
    load_peft(lm, tmp_path / "adapter")
    ids = torch.randint(0, lm.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(lm.eval()(ids), model.eval()(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------- zero-shot use
@pytest.fixture(scope="module")
def loaded(folders):
    import mmtf

    folder, reference, _ = folders["llama"]
    model, tokenizer = mmtf.load(folder, max_new_tokens=12)
    return model, tokenizer, reference, folder


def test_generate_text_returns_the_continuation_of_transformers_generate(loaded):
    model, _, reference, folder = loaded
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    texts = ["a dog barks at", "rain falls<|im_end|>", "birds sing in tall trees and"]
    ours = model.generate_text(texts, min_new_tokens=12)
    hf_tok.padding_side = "left"
    hf_tok.pad_token = ENDOFTEXT
    batch = hf_tok(texts, return_tensors="pt", padding=True)
    first = batch["input_ids"][batch["attention_mask"].bool()][0]
    assert first == hf_tok.convert_tokens_to_ids(ENDOFTEXT)              # bos is added
    out = reference.generate(**batch, do_sample=False, max_new_tokens=12, min_new_tokens=12,
                             pad_token_id=hf_tok.pad_token_id)
    expected = hf_tok.batch_decode(out[:, batch["input_ids"].shape[1]:],
                                   skip_special_tokens=True)
    assert ours == expected and all(isinstance(t, str) for t in ours)
    ids = torch.tensor([hf_tok(texts[0])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model.lm_logits(ids), reference(ids).logits, atol=1e-4,
                                   rtol=1e-4)
    assert model.lm_logits(ids).shape == (1, ids.shape[1], model.lm.vocab_size)


def test_generate_text_sampling_and_beam_run_on_the_cache(loaded):
    model, _, _, _ = loaded
    torch.manual_seed(0)
    sampled = model.generate_text(["a dog", "rain"], strategy="sample", top_k=5,
                                  num_return_sequences=2)
    assert len(sampled) == 2 and all(len(row) == 2 for row in sampled)
    beams = model.generate_text("a dog", strategy="beam", num_beams=3)
    assert len(beams) == 1 and isinstance(beams[0], str)
    assert model.generation["strategy"] == "greedy"          # call settings do not stick


def test_conversations_render_with_the_chat_template_as_transformers(loaded):
    model, _, reference, folder = loaded
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "system", "content": "brief"}, {"role": "user", "content": "a dog"},
            {"role": "assistant", "content": "barks"}, {"role": "user", "content": "rain"}]
    ours = model.generate_text([chat], min_new_tokens=12)
    ids = hf_tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)["input_ids"]
    out = reference.generate(input_ids=ids, do_sample=False, max_new_tokens=12,
                             min_new_tokens=12, pad_token_id=0)
    assert ours == [hf_tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)]


def test_predict_cli_continues_prompts_as_json(loaded, capsys):
    from omegaconf import OmegaConf

    from mmtf.predict import print_continuations

    model, _, _, folder = loaded
    cfg = OmegaConf.create({"ckpt_path": str(folder), "inputs": "???", "prompts": ["a dog"],
                            "format": "json", "batch_size": 4, "accelerator": "cpu",
                            "generation": {"max_new_tokens": 12, "strategy": None}})
    print_continuations(cfg)
    row = json.loads(capsys.readouterr().out.strip())
    assert row == {"prompt": "a dog", "text": model.generate_text(["a dog"])[0]}
    from mmtf.predict import predict

    with pytest.raises(UserError, match=r"is a language model; it continues prompts="):
        predict(str(folder), ["a.wav"])


# ---------------------------------------------------------------------------- bad input
def test_unsupported_family_is_one_line_naming_it_and_the_supported_list(folders, tmp_path):
    import mmtf

    folder, _, _ = folders["llama"]
    other = tmp_path / "mistral"
    other.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    (other / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    for call in (lambda: llm_decoder(pretrained=other), lambda: mmtf.load(other)):
        with pytest.raises(UserError, match=r"model_type 'mistral' .*llama.*qwen2.*qwen3") as e:
            call()
        assert "\n" not in str(e.value)


def test_prompt_longer_than_the_positions_is_one_line(folders):
    _, _, lm = folders["llama"]
    long = torch.zeros(1, lm.max_len - 4, dtype=torch.long)
    with pytest.raises(UserError, match=r"max_position_embeddings") as e:
        lm.generate(long, max_new_tokens=8)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"exceed the model's 128 positions"):
        lm(torch.zeros(1, lm.max_len + 1, dtype=torch.long))


def test_config_values_that_disagree_with_the_folder_name_the_override(folders):
    folder, _, _ = folders["qwen3"]
    with pytest.raises(UserError, match=r"model.decoder.head_dim=24"):
        llm_decoder(pretrained=folder, head_dim=16)
