"""BERT-family text encoders (BERT, MiniLM, RoBERTa, XLM-RoBERTa, and sentence-transformers
folders of them) as mmtf's :class:`~mmtf.encoders.text.TextEncoder`.

The architecture: post-norm blocks (``BlockOptions.postnorm``) with biased layers, exact GELU and
``layer_norm_eps``; learned absolute positions, token-type embeddings and an embedding LayerNorm
(:class:`~mmtf.nn.TokenEmbedding`); no final norm; the pooler is not read. RoBERTa's positions
start at ``pad_token_id + 1`` and count real tokens only. A sentence-transformers folder adds the
pooling (``1_Pooling/config.json``: mean, cls or lasttoken), normalisation (a ``Normalize``
module) and truncation (``sentence_bert_config.json``) of its sentence embeddings; a plain folder
pools by mean. One name table (:func:`links`, q/k/v -> q and the fused ``to_kv``) serves import
(:func:`bert_encoder`), ``format=hf`` export (:func:`save_hf`) and PEFT names
(:func:`part_links`). Why: docs/design/text-encoders.md.

Shapes: c = hidden_size, v = vocab_size.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from mmtf.encoders.text import PoolingOptions, TextEncoder
from mmtf.errors import UserError
from mmtf.hub import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    HFModel,
    is_export,
    open_hf_model,
    resolve_source,
)
from mmtf.nn.transformer import MlpKind
from mmtf.pretrained.names import (
    Link,
    block_links,
    copy_weights,
    export_tensors,
    fill_sizes,
    link,
    original_names,
    require_config,
)

OWNER = "bert_encoder"
NODE = "model.text_encoder"
ARCHITECTURES: dict[str, str] = {"bert": "BertModel", "roberta": "RobertaModel",
                                 "xlm-roberta": "XLMRobertaModel"}
MODEL_TYPES = frozenset(ARCHITECTURES)
SUPPORTED = ("bert (BERT, MiniLM, BGE, E5 ...), roberta, xlm-roberta, alone or in a "
             "sentence-transformers folder")
ANCHOR = "embeddings.word_embeddings.weight"
_COMMON: dict[str, Any] = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "type_vocab_size": 2,
                           "max_position_embeddings": 512, "position_embedding_type": "absolute",
                           "is_decoder": False}
# The configs' defaults of the fields a config.json may leave out.
DEFAULTS: dict[str, dict[str, Any]] = {"bert": {**_COMMON, "pad_token_id": 0},
                                       "roberta": {**_COMMON, "pad_token_id": 1},
                                       "xlm-roberta": {**_COMMON, "pad_token_id": 1}}
# config.json's hidden_act -> the MLP kind, and back for the export.
ACTIVATIONS: dict[str, MlpKind] = {"gelu": "gelu", "gelu_new": "gelu_tanh",
                                   "gelu_pytorch_tanh": "gelu_tanh"}
HF_ACTIVATIONS: dict[str, str] = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
# The original module of each role of a block (mmtf.pretrained.names.block_links).
BLOCK = {"norm_self": "attention.output.LayerNorm", "q": "attention.self.query",
         "k": "attention.self.key", "v": "attention.self.value",
         "out": "attention.output.dense", "norm_mlp": "output.LayerNorm",
         "fc_in": "intermediate.dense", "fc_out": "output.dense"}
# The bert_encoder arguments read from config.json.
SIZES = ("vocab_size", "dim", "depth", "num_heads", "mlp_hidden", "mlp", "max_len", "norm_eps",
         "type_vocab_size", "position_offset")
# sentence-transformers' pooling modes -> mmtf's; legacy configs spell them as booleans.
ST_POOLING = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
ST_LEGACY = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
             "pooling_mode_mean_tokens": "mean",
             "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
             "pooling_mode_weightedmean_tokens": "weightedmean",
             "pooling_mode_lasttoken": "lasttoken"}
ST_MODULES = ("Transformer", "Pooling", "Normalize")
MODULES_FILE = "modules.json"
# Tokenizer files copied beside an export from the folder the model came from.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class FolderSettings:
    """What a folder says beside ``config.json``.

    Attributes:
        model_folder: where ``config.json``, the weights and the tokenizer are (a
            sentence-transformers folder may keep them in its Transformer module's subfolder).
        pooling, normalize: its sentence embeddings' pooling mode and normalisation.
        max_seq_length: sentence-transformers' truncation (None: the tokenizer's).
        lowercase: sentence-transformers' ``do_lower_case``.
    """

    model_folder: Path
    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    lowercase: bool = False


def bert_encoder(*, pretrained: str | Path | None = None, vocab_size: int | None = None,
                 dim: int | None = None, depth: int | None = None, num_heads: int | None = None,
                 mlp_hidden: int | None = None, mlp: MlpKind | None = None,
                 max_len: int | None = None, norm_eps: float | None = None,
                 type_vocab_size: int | None = None, position_offset: int | None = None,
                 pooling: PoolingOptions | Mapping[str, Any] | None = None,
                 dropout: float = 0.0, attn_dropout: float = 0.0,
                 activation_checkpointing: bool = False, freeze: bool = False) -> TextEncoder:
    """A BERT-shaped :class:`TextEncoder`, filled from ``pretrained``.

    Args:
        pretrained: a Hugging Face BERT / RoBERTa / XLM-RoBERTa folder or hub id (a
            sentence-transformers folder too), an mmtf export of such an encoder, or None
            (random weights; every size must then be given).
        vocab_size, ..., position_offset: the ``config.json`` fields of :func:`encoder_values`;
            None reads them, a value must equal them. ``position_offset`` > 0 is RoBERTa's
            position rule (offset ``pad_token_id + 1``, real tokens counted).
        pooling: :class:`~mmtf.encoders.text.PoolingOptions` (or a mapping); a null ``mode``
            or ``normalize`` is the folder's (sentence-transformers' modules; mean and no
            normalisation for a plain folder). A projection head is new (initialised here).
        dropout, attn_dropout: BERT's hidden and attention dropout (``hidden_dropout_prob``
            0.1 in its configs; 0 here unless set).
        activation_checkpointing: as :class:`mmtf.nn.TransformerStack`.
        freeze: frozen and in eval mode after loading.

    Raises:
        UserError: an unsupported ``model_type`` (named, with the supported list), a size that
            differs from ``config.json``, an unsupported sentence-transformers module or pooling,
            or a folder that is incomplete.
    """
    given = dict(vocab_size=vocab_size, dim=dim, depth=depth, num_heads=num_heads,
                 mlp_hidden=mlp_hidden, mlp=mlp, max_len=max_len, norm_eps=norm_eps,
                 type_vocab_size=type_vocab_size, position_offset=position_offset)
    hf = pretrained is not None and not is_export(pretrained)
    model = settings = None
    if hf:
        model, settings = open_bert(pretrained)
        needed = encoder_values(model)
        require_config(OWNER, given, {k: v for k, v in needed.items() if given[k] is not None},
                       source=model.source, key_prefix=NODE)
        given = {k: needed[k][0] if v is None else v for k, v in given.items()}
    else:
        defaults = dict(mlp="gelu", norm_eps=1e-12, type_vocab_size=2, position_offset=0)
        given = {k: (defaults.get(k) if v is None else v) for k, v in given.items()}
        given = fill_sizes(OWNER, given, None, pretrained=pretrained, source=str(pretrained),
                           key_prefix=NODE, folder="Hugging Face BERT-family folder")
    options = as_pooling(pooling, settings)
    encoder = build_encoder(given, pooling=options, dropout=dropout, attn_dropout=attn_dropout,
                            activation_checkpointing=activation_checkpointing,
                            export=None if hf else pretrained)
    if hf:
        table = links(encoder, model.prefix(ANCHOR, owner=OWNER))
        copy_weights(encoder, read_tensors(model, table), table, owner=OWNER,
                     source=model.source, keep_initialised=head_names(encoder))
    if freeze:
        encoder.freeze()
    return encoder


def as_pooling(pooling: PoolingOptions | Mapping[str, Any] | None,
               settings: FolderSettings | None) -> PoolingOptions:
    """``pooling`` with a null ``mode`` / ``normalize`` taken from the folder (mean and no
    normalisation without one)."""
    given = (dataclasses.asdict(pooling) if isinstance(pooling, PoolingOptions)
             else {k: v for k, v in (pooling or {}).items() if k != "_target_"})
    folder = settings or FolderSettings(Path())
    if given.get("mode") is None:
        given["mode"] = folder.pooling
    if given.get("normalize") is None:
        given["normalize"] = folder.normalize
    return PoolingOptions(**given)


def build_encoder(sizes: Mapping[str, Any], *, pooling: PoolingOptions | None = None,
                  dropout: float = 0.0, attn_dropout: float = 0.0,
                  activation_checkpointing: bool = False,
                  export: str | Path | None = None) -> TextEncoder:
    """A :class:`TextEncoder` in BERT's configuration of ``sizes`` (the :data:`SIZES` keys);
    ``export``: an mmtf export to load."""
    s = dict(sizes)
    block = dict(mlp=s["mlp"], mlp_hidden=s["mlp_hidden"], norm="layernorm",
                 norm_eps=s["norm_eps"], bias=True, mlp_bias=True, postnorm=True,
                 dropout=dropout, attn_dropout=attn_dropout)
    embedding = dict(type_vocab_size=s["type_vocab_size"], position_offset=s["position_offset"],
                     positions_from_mask=s["position_offset"] > 0, embed_norm=True)
    return TextEncoder(vocab_size=s["vocab_size"], dim=s["dim"], depth=s["depth"],
                       num_heads=s["num_heads"], block=block, embedding=embedding,
                       pooling=pooling, max_len=s["max_len"], positions="learned",
                       final_norm=False, activation_checkpointing=activation_checkpointing,
                       pretrained=export)


# ----------------------------------------------------------------------------- folders
def open_bert(source: str | Path) -> tuple[HFModel, FolderSettings]:
    """Open a BERT-family folder or hub id (a sentence-transformers folder too).

    Raises:
        UserError: no folder, no weights (or only pickled ones), a ``model_type`` mmtf does not
            build (named with the supported list), or sentence-transformers modules it cannot.
    """
    folder = resolve_source(source, owner=OWNER)
    settings = folder_settings(folder)
    model = open_hf_model(settings.model_folder, model_types=MODEL_TYPES, owner=OWNER,
                          family="text-encoder", supported=SUPPORTED)
    model.source = str(source)
    return model, settings


def folder_settings(folder: Path) -> FolderSettings:
    """The pooling, normalisation and truncation of a folder's sentence embeddings:
    sentence-transformers' ``modules.json`` and its modules' files, or the defaults (mean, not
    normalised) for a plain Hugging Face folder.

    Raises:
        UserError: a module other than Transformer, Pooling and Normalize, or a pooling mode
            mmtf does not compute.
    """
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        return FolderSettings(folder)
    modules = _read_json(modules_file)
    if not isinstance(modules, list):
        raise UserError(f"{OWNER}: {modules_file} is not a list of modules.")
    kinds = [(str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", "")))
             for m in modules]
    other = [(kind, path) for kind, path in kinds if kind not in ST_MODULES]
    if other:
        raise UserError(f"{OWNER}: {modules_file} has a {other[0][0]!r} module "
                        f"({other[0][1] or 'at the top'}); mmtf reads sentence-transformers "
                        f"folders of {', '.join(ST_MODULES)} modules (a Dense projection is "
                        f"not built).")
    paths = {kind: path for kind, path in reversed(kinds)}        # the first of each kind
    if "Transformer" not in paths:
        raise UserError(f"{OWNER}: {modules_file} lists no Transformer module; it is no "
                        f"sentence-transformers text model.")
    model_folder = folder / paths["Transformer"]
    st_file = model_folder / "sentence_bert_config.json"
    st_config = _read_json(st_file) if st_file.is_file() else {}
    pooling = "mean"
    if "Pooling" in paths:
        pooling_file = folder / paths["Pooling"] / CONFIG_FILE
        pooling = st_pooling_mode(_read_json(pooling_file) if pooling_file.is_file() else {},
                                  pooling_file)
    length = st_config.get("max_seq_length")
    return FolderSettings(model_folder=model_folder, pooling=pooling,
                          normalize="Normalize" in paths,
                          max_seq_length=None if length is None else int(length),
                          lowercase=bool(st_config.get("do_lower_case", False)))


def st_pooling_mode(config: Mapping[str, Any], file: Path) -> str:
    """mmtf's pooling mode of a sentence-transformers ``Pooling`` config (``pooling_mode``, or
    the legacy ``pooling_mode_*`` booleans; none set: mean, as sentence-transformers).

    Raises:
        UserError: several modes (concatenated) or one mmtf does not compute.
    """
    mode = config.get("pooling_mode")
    if mode is None:
        legacy = [name for key, name in ST_LEGACY.items() if config.get(key)]
        mode = legacy or ["mean"]
    modes = [mode] if isinstance(mode, str) else list(mode)
    supported = ", ".join(ST_POOLING)
    if len(modes) != 1:
        raise UserError(f"{OWNER}: {file} concatenates poolings {modes}; mmtf pools one of "
                        f"{supported}.")
    if modes[0] not in ST_POOLING:
        raise UserError(f"{OWNER}: {file} pools by {modes[0]!r}; mmtf pools {supported}.")
    return ST_POOLING[modes[0]]


def is_text_encoder_folder(source: str | Path) -> bool:
    """Whether ``source`` is a local folder of a supported text-encoder family: its
    ``config.json``, or its sentence-transformers Transformer module's, names one."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return False
    try:
        config = folder_settings(folder).model_folder / CONFIG_FILE
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") in MODEL_TYPES
    except (OSError, UserError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def encoder_values(model: HFModel) -> dict[str, tuple[Any, str]]:
    """The :func:`bert_encoder` sizes a folder's ``config.json`` needs: ``{key: (value, "the
    field=value it comes from")}``.

    Raises:
        UserError: relative position embeddings, a decoder configuration, or an activation
            other than GELU.
    """
    kind = model.model_type
    c = {**DEFAULTS[kind], **{k: v for k, v in model.config.items() if v is not None}}
    where = f"{model.source}/{CONFIG_FILE}"
    if c["position_embedding_type"] != "absolute":
        raise UserError(f"{OWNER}: {where} has position_embedding_type="
                        f"{c['position_embedding_type']!r}; mmtf builds absolute positions only.")
    if c["is_decoder"]:
        raise UserError(f"{OWNER}: {where} has is_decoder=true; mmtf reads BERT-family "
                        f"encoders (bidirectional), not their decoder configuration.")
    if c["hidden_act"] not in ACTIVATIONS:
        raise UserError(f"{OWNER}: {where} has hidden_act={c['hidden_act']!r}; mmtf builds "
                        f"{', '.join(ACTIVATIONS)}.")

    def field(key: str) -> str:
        return f"{key}={c.get(key)!r}"

    offset = 0 if kind == "bert" else int(c["pad_token_id"]) + 1
    return {
        "vocab_size": (c["vocab_size"], field("vocab_size")),
        "dim": (c["hidden_size"], field("hidden_size")),
        "depth": (c["num_hidden_layers"], field("num_hidden_layers")),
        "num_heads": (c["num_attention_heads"], field("num_attention_heads")),
        "mlp_hidden": (c["intermediate_size"], field("intermediate_size")),
        "mlp": (ACTIVATIONS[c["hidden_act"]], field("hidden_act")),
        "max_len": (c["max_position_embeddings"], field("max_position_embeddings")),
        "norm_eps": (c["layer_norm_eps"], field("layer_norm_eps")),
        "type_vocab_size": (c["type_vocab_size"], field("type_vocab_size")),
        "position_offset": (offset, f"model_type={kind!r} with " + field("pad_token_id")),
    }


def read_tensors(model: HFModel, table: list[Link]) -> dict[str, Tensor]:
    """The originals ``table`` reads, by their names; checkpoints of the original BERT spell a
    LayerNorm's weight and bias ``gamma`` and ``beta`` (read under the new names, as
    transformers does)."""
    stored = set(model.keys())
    source = {}
    for name in original_names(table):
        old = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                          "LayerNorm.beta")
        source[name] = old if name not in stored and old in stored else name
    loaded = model.tensors(set(source.values()))
    return {name: loaded[key] for name, key in source.items() if key in loaded}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{OWNER}: {path} is not valid JSON ({err}).") from None


# ----------------------------------------------------------------------------- name table
def links(encoder: TextEncoder, prefix: str = "") -> list[Link]:
    """The name table of ``encoder`` as ``BertModel`` / ``RobertaModel`` (``embeddings.*``,
    ``encoder.layer.N.*``); ``prefix`` goes before every original name (``bert.``)."""
    e = f"{prefix}embeddings."
    table = [link("embedding.tokens.weight", f"{e}word_embeddings.weight"),
             link("embedding.positions.weight", f"{e}position_embeddings.weight"),
             link("embedding.norm.weight", f"{e}LayerNorm.weight"),
             link("embedding.norm.bias", f"{e}LayerNorm.bias")]
    if encoder.embedding.token_types is not None:
        table.append(link("embedding.token_types.weight", f"{e}token_type_embeddings.weight"))
    for i in range(encoder.stack.depth):
        table += block_links(f"stack.blocks.{i}.", f"{prefix}encoder.layer.{i}.", BLOCK)
    return table


def head_names(encoder: TextEncoder) -> list[str]:
    """The projection head's tensors: new to the model, no original holds them."""
    return [f"head.{name}" for name in encoder.head.state_dict()]


def part_links(part: str, module: TextEncoder, prefix: str = "") -> list[Link]:
    """The name table of a built encoder in BERT's configuration (:mod:`mmtf.pretrained.peft`).

    Raises:
        UserError: the module is not in that configuration (:func:`hf_config`).
    """
    hf_config(module)
    return links(module, prefix)


# ----------------------------------------------------------------------------- export
def hf_config(encoder: TextEncoder, model_type: str | None = None,
              pad_id: int | None = None) -> dict[str, Any]:
    """``config.json`` of ``encoder`` for ``transformers`` (``model_type`` default: roberta
    with a position offset, else bert; ``pad_id``: BERT's ``pad_token_id``, default 0).

    Raises:
        UserError: the encoder is not in a family's configuration (the settings named).
    """
    if not isinstance(encoder, TextEncoder):
        raise UserError(f"export format=hf: a {type(encoder).__name__} is no BERT-family "
                        f"text encoder.")
    block, emb = encoder.stack.blocks[0], encoder.embedding
    attn, options = block.self_attn, emb.options
    offset = options.position_offset
    if model_type is None:
        model_type = "roberta" if offset else "bert"
    problems = []
    if not block.postnorm or not isinstance(block.norm_self, torch.nn.LayerNorm):
        problems.append("the blocks must be post-norm with LayerNorm")
    if not isinstance(encoder.stack.norm, torch.nn.Identity):
        problems.append("the stack has no final norm")
    if block.mlp.kind not in HF_ACTIVATIONS:
        problems.append(f"the MLP is GELU (exact or tanh), not {block.mlp.kind}")
    if any(layer.bias is None for layer in (attn.to_q, attn.to_kv, attn.to_out,
                                            block.mlp.fc_in, block.mlp.fc_out)):
        problems.append("every projection has a bias")
    if attn.num_kv_heads != attn.num_heads or attn.q_norm is not None or (
            attn.head_dim * attn.num_heads != encoder.dim) or encoder.stack.rope is not None:
        problems.append("plain multi-head attention without RoPE, q/k norm or another "
                        "head width")
    if encoder.causal:
        problems.append("the attention is bidirectional")
    if emb.positions is None or emb.norm is None or emb.token_types is None:
        problems.append("learned positions, token types and an embedding LayerNorm")
    if model_type == "bert" and (offset or options.positions_from_mask):
        problems.append("BERT's positions start at 0 and index the tokens")
    if model_type != "bert" and (not offset or not options.positions_from_mask):
        problems.append(f"{model_type}'s positions start at pad_token_id + 1 and count the "
                        f"real tokens")
    if model_type not in MODEL_TYPES:
        problems.append(f"model_type {model_type!r} is none of {sorted(MODEL_TYPES)}")
    if not isinstance(encoder.head, torch.nn.Identity):
        problems.append("a projection head has no place in the folder (export it with "
                        "format=mmtf)")
    if problems:
        raise UserError(f"export format=hf: this TextEncoder is no {model_type}: "
                        f"{'; '.join(problems)}.")
    pad = offset - 1 if model_type != "bert" else (0 if pad_id is None else pad_id)
    config = {
        "architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
        "vocab_size": encoder.vocab_size, "hidden_size": encoder.dim,
        "num_hidden_layers": encoder.stack.depth, "num_attention_heads": attn.num_heads,
        "intermediate_size": block.mlp.fc_in.out_features,
        "hidden_act": HF_ACTIVATIONS[block.mlp.kind],
        "hidden_dropout_prob": block.drop.p, "attention_probs_dropout_prob": attn.dropout,
        "max_position_embeddings": emb.positions.num_positions,
        "type_vocab_size": options.type_vocab_size, "layer_norm_eps": block.norm_self.eps,
        "pad_token_id": pad, "position_embedding_type": "absolute", "is_decoder": False,
        "initializer_range": 0.02, "torch_dtype": "float32",
    }
    if model_type != "bert":
        config.update(bos_token_id=0, eos_token_id=2)
    return config


def st_files(encoder: TextEncoder, out: Path) -> None:
    """sentence-transformers' files of ``encoder``'s embedding: ``modules.json``,
    ``sentence_bert_config.json``, ``1_Pooling/config.json`` (the legacy boolean keys every
    sentence-transformers version reads) and ``2_Normalize`` when it normalises."""
    mode = {v: k for k, v in ST_POOLING.items()}[encoder.pooling.mode]
    kind = "sentence_transformers.models."
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"{kind}Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{kind}Pooling"}]
    pooling = {"word_embedding_dimension": encoder.dim,
               **{key: name == mode for key, name in ST_LEGACY.items()}, "include_prompt": True}
    (out / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (out / "1_Pooling" / CONFIG_FILE).write_text(json.dumps(pooling, indent=2))
    if encoder.pooling.normalize:
        (out / "2_Normalize").mkdir(exist_ok=True)
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": f"{kind}Normalize"})
    (out / MODULES_FILE).write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": encoder.max_tokens, "do_lower_case": False}, indent=2))


def save_hf(encoder: TextEncoder, out: str | Path, *,
            tokenizer_folder: str | Path | None = None, model_type: str | None = None) -> Path:
    """Write ``encoder`` as a Hugging Face folder (``config.json``, ``model.safetensors``; no
    pooler) with sentence-transformers' files of its pooling and normalisation and the
    tokenizer files of ``tokenizer_folder`` (whose ``model_type`` it keeps unless
    ``model_type`` is given), then import it back and compare every tensor.

    Raises:
        UserError: the encoder is in no family's configuration (:func:`hf_config`).
        RuntimeError: the written folder does not import back into the same weights.
    """
    out = Path(out)
    source = None if tokenizer_folder is None else folder_settings(Path(tokenizer_folder))
    pad_id = None
    if source is not None and (source.model_folder / CONFIG_FILE).is_file():
        original = _read_json(source.model_folder / CONFIG_FILE)
        pad_id = original.get("pad_token_id")
        if model_type is None and original.get("model_type") in MODEL_TYPES:
            model_type = original["model_type"]               # XLM-R stays XLM-R
    config = hf_config(encoder, model_type, pad_id)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_file(export_tensors(encoder.state_dict(), links(encoder)), str(out / WEIGHTS_FILE),
              metadata={"format": "pt"})
    st_files(encoder, out)
    if source is not None:
        for name in TOKENIZER_FILES:
            src = source.model_folder / name
            if src.is_file() and src.resolve() != (out / name).resolve():
                shutil.copyfile(src, out / name)
    back = bert_encoder(pretrained=out).state_dict()
    for key, value in encoder.state_dict().items():
        if not torch.equal(value.detach().cpu().float(), back[key].float()):
            raise RuntimeError(f"export format=hf: {out} does not import back into the "
                               f"exported weights ({key}).")
    return out


def export_hf(task: Any, out: Path) -> None:
    """``format=hf`` of a task whose ``encoder`` part is a BERT-family :class:`TextEncoder`
    with no decoder (the encoder as ``BertModel`` / ``RobertaModel``)."""
    encoder = task.export_parts()["encoder"]
    source = getattr(task, "run_config", {}).get("pretrained")
    save_hf(encoder, out, tokenizer_folder=source)
    print(f"Exported the text encoder ({hf_config(encoder)['architectures'][0]}), "
          f"{sum(p.numel() for p in encoder.parameters()):,} parameters, to {out}/")


def resolved_sizes(part: str, module: TextEncoder) -> dict[str, Any]:
    """The :func:`bert_encoder` sizes a built encoder was given, recorded in a run's config so
    a checkpoint rebuilds without the folder (the pooling's mode and normalisation too)."""
    block, emb = module.stack.blocks[0], module.embedding
    return {"vocab_size": module.vocab_size, "dim": module.dim, "depth": module.stack.depth,
            "num_heads": block.self_attn.num_heads,
            "mlp_hidden": block.mlp.fc_in.out_features, "mlp": block.mlp.kind,
            "max_len": module.max_len, "norm_eps": block.norm_self.eps,
            "type_vocab_size": emb.options.type_vocab_size,
            "position_offset": emb.options.position_offset,
            "pooling": {"mode": module.pooling.mode, "normalize": module.pooling.normalize}}


__all__ = ["ARCHITECTURES", "MODEL_TYPES", "FolderSettings", "bert_encoder", "build_encoder",
           "encoder_values", "export_hf", "folder_settings", "hf_config",
           "is_text_encoder_folder", "links", "open_bert", "part_links", "resolved_sizes",
           "save_hf"]
