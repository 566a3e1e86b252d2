"""Tiny model folders in the Hugging Face layout, built locally (never downloaded).

A byte-level BPE trained with `tokenizers` on a few captions, with the special tokens of the
family appended after the learned vocabulary as GPT-2 and Whisper have them, and the
``tokenizer_config.json`` that names them as ``save_pretrained`` writes it; and a random-weight
Whisper saved beside it with ``save_pretrained`` (transformers, a test dependency).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = ["a dog barks at the cat", "rain falls on a tin roof", "birds sing in tall trees",
          "people talk near the busy road", "water drips into a metal bucket"] * 4
ENDOFTEXT = "<|endoftext|>"
WHISPER_SPECIALS = [ENDOFTEXT, "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>",
                    "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                    "<|notimestamps|>"]
WHISPER_PROMPT = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
# Whisper's full special layout (whisper/tokenizer.py), with 8 of its 99 languages in its order:
# languages between <|startoftranscript|> and <|translate|>, then <|0.00|> .. <|30.00|> (0.02 s).
SPEECH_LANGUAGES = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja"]
TIMESTAMPS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
WHISPER_SPEECH_SPECIALS = [ENDOFTEXT, "<|startoftranscript|>",
                           *(f"<|{code}|>" for code in SPEECH_LANGUAGES), "<|translate|>",
                           "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                           "<|notimestamps|>"]


def write_tokenizer(folder: Path, *, family: str = "whisper", vocab_size: int = 300) -> Tokenizer:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` into ``folder``; return the
    tokenizer. ``family``: "whisper" (eos = pad = <|endoftext|>, the Whisper specials),
    "whisper_speech" (the same with 8 languages and the 1501 timestamp tokens, added as
    non-special tokens as in the hub's Whisper tokenizer.json) or "gpt2" (bos = eos = unk =
    <|endoftext|>, no pad)."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    specials = {"whisper": WHISPER_SPECIALS, "whisper_speech": WHISPER_SPEECH_SPECIALS}.get(
        family, [ENDOFTEXT])
    tok.add_special_tokens(specials)
    if family == "whisper_speech":
        tok.add_tokens(TIMESTAMPS)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    if family.startswith("whisper"):
        config["pad_token"] = ENDOFTEXT
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def write_whisper(folder: Path, *, n_mels: int = 80, d_model: int = 64, layers: int = 2,
                  heads: int = 4, seed: int = 0, speech: bool = False,
                  multilingual: bool = True, max_target_positions: int = 48,
                  suppress: bool = False):
    """A random-weight ``WhisperForConditionalGeneration`` and its tokenizer in ``folder``;
    returns the model (eval mode). Weights are drawn far from the default init (biases,
    decoder positions, cross-attention) so that outputs depend on every tensor and the random
    decoder does not just repeat one token. ``speech``: Whisper's full special layout (8
    languages, timestamps) and the ``generation_config.json`` fields transformers' Whisper
    ``generate`` reads (``lang_to_id``, ``task_to_id``, ``no_timestamps_token_id``,
    ``is_multilingual``, ``max_initial_timestamp_index``). ``suppress``: the token suppression
    of the hub's Whisper generation configs (``begin_suppress_tokens`` space and eos,
    ``suppress_tokens`` the symbols of openai's ``Tokenizer.non_speech_tokens``)."""
    import torch
    import transformers

    tok = write_tokenizer(folder, family="whisper_speech" if speech else "whisper")
    end = tok.token_to_id(ENDOFTEXT)
    config = transformers.WhisperConfig(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), d_model=d_model,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        num_mel_bins=n_mels, max_source_positions=1500,
        max_target_positions=max_target_positions,
        pad_token_id=end, bos_token_id=end, eos_token_id=end,
        decoder_start_token_id=tok.token_to_id("<|startoftranscript|>"),
        begin_suppress_tokens=None, suppress_tokens=None)
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "decoder.embed_positions" in name:
                p.normal_(0.0, 1.0)
            elif "encoder_attn.out_proj" in name or "encoder_attn.v_proj" in name:
                p.mul_(4.0)
            elif "encoder.layers" in name and p.dim() == 2:
                p.normal_(0.0, 0.3)
    if speech:
        # The language rows of the (tied) output projection are made orthogonal to the mean
        # hidden state after <|startoftranscript|> and scaled to its spread, so the detected
        # language depends on the audio (a random model's hidden state hardly does).
        with torch.no_grad():
            rows = [tok.token_to_id(f"<|{c}|>") for c in SPEECH_LANGUAGES]
            feats = torch.randn(8, n_mels, 3000, generator=torch.Generator().manual_seed(seed))
            start = torch.full((8, 1), config.decoder_start_token_id)
            hidden = model.model(input_features=feats, decoder_input_ids=start
                                 ).last_hidden_state[:, -1]                     # (8, d)
            mean = hidden.mean(dim=0)
            unit = mean / mean.norm()
            spread = (hidden - mean).norm(dim=1).mean()
            lang = torch.randn(len(rows), d_model, generator=torch.Generator().manual_seed(seed))
            lang -= (lang @ unit)[:, None] * unit[None]
            model.model.decoder.embed_tokens.weight[rows] = lang * (3.0 / spread)
        generation = model.generation_config
        if multilingual:     # English-only models' generation configs name no languages
            generation.lang_to_id = {f"<|{c}|>": tok.token_to_id(f"<|{c}|>")
                                     for c in SPEECH_LANGUAGES}
            generation.task_to_id = {t: tok.token_to_id(f"<|{t}|>") for t in ("transcribe",
                                                                               "translate")}
        generation.no_timestamps_token_id = tok.token_to_id("<|notimestamps|>")
        generation.is_multilingual = multilingual
        generation.max_initial_timestamp_index = 50
        generation.suppress_tokens = None
        generation.begin_suppress_tokens = None
        generation._from_model_config = False      # from_pretrained keeps the file's fields
    if suppress:
        symbols = [tok.token_to_id(c) for c in '"#()*+/:;<=>@[\\]^_`{|}~-']
        model.generation_config.suppress_tokens = sorted({i for i in symbols if i is not None})
        model.generation_config.begin_suppress_tokens = [tok.token_to_id("Ġ"), end]
        model.generation_config._from_model_config = False
    model.save_pretrained(folder)
    return model


def padded_batch(waves: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Waveforms of any lengths as one zero-padded (b, t) batch and their (b,) lengths."""
    lengths = torch.tensor([len(w) for w in waves])
    out = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        out[i, : len(w)] = torch.from_numpy(w)
    return out, lengths


def whisper_bans(no_timestamps_id: int, prompt: list[int], *, prev: bool = True) -> list[int]:
    """transformers' ``suppress_tokens`` equal to mmtf's bans in timed decoding: the prompt,
    ``<|nospeech|>`` and (``prev``: when the context id is given) ``<|startofprev|>``, the two
    ids before ``<|notimestamps|>`` in Whisper's layout."""
    return sorted({*prompt, no_timestamps_id - 1, *((no_timestamps_id - 2,) if prev else ())})


def import_whisper(folder: Path):
    """(mmtf EncoderDecoder in eval mode, tokenizer) of the Whisper saved in ``folder``, with
    the English transcription prompt."""
    from mmtf.decoders import EncoderDecoder
    from mmtf.pretrained.whisper import whisper_decoder, whisper_encoder
    from mmtf.text import PretrainedTokenizer
    from mmtf.text.prompt import WhisperPrompt

    tokenizer = PretrainedTokenizer.from_folder(folder)
    model = EncoderDecoder(encoder=whisper_encoder(pretrained=folder),
                           decoder=whisper_decoder(pretrained=folder), pad_id=tokenizer.pad_id,
                           eos_id=tokenizer.eos_id,
                           prompt_ids=WhisperPrompt(tokenizer).build("en")).eval()
    return model, tokenizer


def speech_whisper(folder: Path):
    """(HF model, mmtf EncoderDecoder, tokenizer) of a tiny random multilingual Whisper with 64
    decoder positions, written to ``folder`` and imported from it."""
    hf = write_whisper(folder, speech=True, max_target_positions=64)
    return (hf, *import_whisper(folder))


# A ChatML template (Qwen's form) for the tiny LLM folders: system, multi-turn, generation prompt.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLM_SPECIALS = ["<|im_start|>", "<|im_end|>"]


def write_llm(folder: Path, *, model_type: str = "llama", tie: bool = False,
              rope_scaling: dict | None = None, hidden: int = 64, layers: int = 2,
              heads: int = 4, kv_heads: int = 2, max_positions: int = 128, seed: int = 0,
              shard: str | None = None, bos: bool = True):
    """A random-weight ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` and
    its tokenizer (the byte-level BPE above with ``<|im_start|>`` / ``<|im_end|>`` and a ChatML
    ``chat_template``) in ``folder``; returns the model (eval mode). Weights are drawn wide
    (embeddings N(0, 1), projections N(0, 1.5 / sqrt(fan_in)), norm gains 1 + N(0, 0.2),
    biases N(0, 0.2)) so logits are far from uniform and greedy picks are not near-ties. Qwen3
    gets ``head_dim`` 24 (not hidden / heads); ``shard``: ``save_pretrained``'s
    ``max_shard_size`` (e.g. "40KB": sharded with an index). ``bos``: the tokenizer prepends
    ``<|endoftext|>`` to plain text, as Llama's prepends ``<s>``."""
    import transformers
    from tokenizers import processors

    tok = write_tokenizer(folder, family="gpt2")
    tok.add_special_tokens(LLM_SPECIALS)
    end = tok.token_to_id(ENDOFTEXT)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{ENDOFTEXT} $A", pair=f"{ENDOFTEXT} $A {ENDOFTEXT} $B",
            special_tokens=[(ENDOFTEXT, end)])
    tok.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(chat_template=CHATML, tokenizer_class="PreTrainedTokenizerFast")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
    config_class, model_class = classes[model_type]
    extra = {"head_dim": 24} if model_type == "qwen3" else {}
    config = config_class(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), hidden_size=hidden,
        intermediate_size=3 * hidden // 2 + 8, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, rope_theta=5000.0 if model_type == "llama"
        else 10000.0, rope_scaling=rope_scaling, tie_word_embeddings=tie, bos_token_id=end,
        eos_token_id=end, pad_token_id=None, rms_norm_eps=1e-6, **extra)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 1.5 / p.shape[1] ** 0.5)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return model


# BERT-family folders: a WordPiece (BERT's specials at 0..4) or byte-level BPE (RoBERTa's <s>,
# <pad>, </s>, <unk> at 0..3 and <mask> last) tokenizer trained on CORPUS, with the
# post-processor and tokenizer_config.json that save_pretrained writes for the family.
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def write_text_tokenizer(folder: Path, *, family: str = "bert",
                         model_max_length: int = 512) -> Tokenizer:
    """``tokenizer.json`` + ``tokenizer_config.json`` of a BERT WordPiece (``family`` "bert",
    lower-casing) or a RoBERTa byte-level BPE ("roberta", "xlm-roberta") in ``folder``."""
    from tokenizers import normalizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    if family == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
            vocab_size=120, special_tokens=BERT_SPECIALS, show_progress=False))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        config = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                  "unk_token": "[UNK]", "mask_token": "[MASK]", "do_lower_case": True,
                  "tokenizer_class": "BertTokenizer"}
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
            vocab_size=300, special_tokens=ROBERTA_SPECIALS, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.add_special_tokens(["<mask>"])
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0),
                                                          add_prefix_space=False)
        config = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>",
                  "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                  "mask_token": "<mask>", "add_prefix_space": False,
                  "tokenizer_class": "RobertaTokenizer"}
    tok.save(str(folder / "tokenizer.json"))
    config["model_max_length"] = model_max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def write_bert(folder: Path, *, model_type: str = "bert", hidden: int = 32, layers: int = 2,
               heads: int = 4, positions: int = 40, seed: int = 0, shard: str | None = None,
               model_max_length: int = 512):
    """A random-weight ``BertModel`` / ``RobertaModel`` / ``XLMRobertaModel`` and its tokenizer
    in ``folder`` (``positions``: the real tokens the model reads; RoBERTa's table has 2 rows
    more); returns the model (eval mode). Weights are drawn wide (projections N(0, 1.5 /
    sqrt(fan_in)), norm gains 1 + N(0, 0.2), biases and embeddings N(0, 0.2) and N(0, 1)) so
    every tensor moves the outputs. ``shard``: ``save_pretrained``'s ``max_shard_size``."""
    import transformers

    tok = write_text_tokenizer(folder, family=model_type, model_max_length=model_max_length)
    classes = {"bert": (transformers.BertConfig, transformers.BertModel),
               "roberta": (transformers.RobertaConfig, transformers.RobertaModel),
               "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel)}
    config_class, model_class = classes[model_type]
    roberta = model_type != "bert"
    pad = tok.token_to_id("<pad>" if roberta else "[PAD]")
    config = config_class(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=3 * hidden,
        max_position_embeddings=positions + (pad + 1 if roberta else 0),
        type_vocab_size=1 if roberta else 2, pad_token_id=pad, layer_norm_eps=1e-12 if not
        roberta else 1e-5, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif "embeddings" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 1.5 / p.shape[1] ** 0.5)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return model


def write_sentence_transformer(folder: Path, *, pooling: str = "mean", normalize: bool = True,
                               max_seq_length: int = 16, legacy: bool = True,
                               extra_modules: list | None = None, **bert):
    """A sentence-transformers folder built by hand around a tiny BERT (:func:`write_bert`,
    its ``bert`` arguments): ``modules.json``, ``sentence_bert_config.json``,
    ``1_Pooling/config.json`` (``legacy``: the ``pooling_mode_*`` booleans of the hub's folders;
    else sentence-transformers 5's ``pooling_mode``) and an empty ``2_Normalize``; returns
    the BERT."""
    model = write_bert(folder, **bert)
    kind = "sentence_transformers.models."
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"{kind}Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{kind}Pooling"}]
    names = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
             "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}
    config = ({"word_embedding_dimension": model.config.hidden_size,
               **{key: mode == pooling for mode, key in names.items()}} if legacy else
              {"embedding_dimension": model.config.hidden_size, "pooling_mode": pooling,
               "include_prompt": True})
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    if normalize:
        (folder / "2_Normalize").mkdir()
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": f"{kind}Normalize"})
    modules += extra_modules or []
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}))
    return model
