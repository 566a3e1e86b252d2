"""Chat templates of LLM folders, rendered as transformers' ``apply_chat_template`` renders them,
and conversations as training items (ids plus per-token labels).

:class:`ChatTemplate` reads a folder's Jinja template (``chat_template.jinja``, else
``tokenizer_config.json``'s ``chat_template``) and renders a list of ``{"role", "content"}``
messages in the sandbox and with the helpers transformers gives templates
(``raise_exception``, ``strftime_now``, its ``tojson``, the special tokens as strings), so
the text is byte-identical to ``apply_chat_template(..., tokenize=False)``.
:func:`encode_conversation` turns a conversation into ``input_ids`` and unshifted ``labels``
that train the assistant turns only; :func:`ensure_media_token` makes a media placeholder
(``<|audio|>``) one token. Why: docs/design/chat-templates.md.

Shapes: ids are python ``list[int]``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import numpy as np
from tokenizers import AddedToken, Encoding
from tokenizers import Tokenizer as HFTokenizer

from mmtf.errors import UserError
from mmtf.hub import resolve_source
from mmtf.text.base import BackedTokenizer
from mmtf.text.pretrained import _merged, _token_text

log = logging.getLogger("mmtf.text")

TEMPLATE_FILE = "chat_template.jinja"
# The chat templates shipped in the package (mmtf/text/templates/<name>.jinja), for LLMs trained
# from scratch with mmtf's own tokenizer, and the special tokens each spells.
BUILTIN_DIR = Path(__file__).resolve().parent / "templates"
BUILTIN_TOKENS: dict[str, tuple[str, ...]] = {"chatml": ("<|im_start|>", "<|im_end|>")}
# The media placeholder of each modality: one token of the tokenizer.
MEDIA_TOKENS: dict[str, str] = {"audio": "<|audio|>", "image": "<|image|>"}
TEMPLATE_DIR = "additional_chat_templates"      # <name>.jinja each, as transformers saves them
CONFIG_FILE = "tokenizer_config.json"
IGNORE_INDEX = -100            # the label of an untrained token (cross_entropy's ignore_index)
# transformers copies a message's reasoning under each of these names (the first is standard).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Appended to the message continued by continue_final_message to find where it ends once
# rendered (transformers' marker, so trimmed trailing spaces behave the same).
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

Message = Mapping[str, Any]


class _TemplateRaised(jinja2.TemplateError):
    """A template's own ``raise_exception(message)``: the conversation is refused."""


# ---------------------------------------------------------------------------- the Jinja sandbox
class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker) renders
    its body unchanged, so templates that carry it parse; the spans are found by prefixes."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _SafeNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore attributes (no way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not set the namespace attribute {name!r}")


class _DictFactory:
    """``dict(...)`` / ``dict.fromkeys(...)`` for templates without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


def _raise_exception(message: Any) -> None:
    raise _TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """The environment transformers renders chat templates in: an immutable sandbox (templates
    come from the hub), trim_blocks + lstrip_blocks, break/continue, and its helpers."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_DictFactory(), namespace=_SafeNamespace)
    return env


@lru_cache(maxsize=32)
def _compiled(source: str) -> jinja2.Template:
    return _environment().from_string(source)


# ---------------------------------------------------------------------------- template data
def _plain(value: Any) -> Any:
    """``value`` rebuilt from JSON types only (what the sandbox may see); anything else, such
    as an array or tensor in a media block, becomes the inert string ``<TypeName>``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, np.generic):
        return _plain(value.item())
    # Subclasses (enums, str-like objects) carry methods of their own: back to the base type.
    for base in (str, bool, int, float):
        if isinstance(value, base):
            return base(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _prepared_messages(messages: Sequence[Message], owner: str) -> list[dict[str, Any]]:
    """Plain copies of the messages as transformers hands them to a template: keys whose value
    is None dropped, reasoning copied under each of its names."""
    if isinstance(messages, str | Mapping) or not isinstance(messages, Sequence):
        raise UserError(f"{owner}: a conversation is a list of {{'role', 'content'}} messages, "
                        f"not {type(messages).__name__}.")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UserError(f"{owner}: message {i} is {type(message).__name__}, not a "
                            f"{{'role', 'content'}} mapping.")
        message = _plain({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def template_tokens(folder: Path) -> dict[str, str]:
    """The special tokens a chat template sees as variables, as strings: every ``*_token`` key
    of ``tokenizer_config.json`` / ``special_tokens_map.json`` (``bos_token``, ``eos_token``,
    ``pad_token``, ``unk_token``, ...; a null one is left out) and every name of a mapping
    ``extra_special_tokens``, as transformers' ``special_tokens_map`` gives them."""
    config = _merged(folder, (CONFIG_FILE, "special_tokens_map.json"), f"chat template ({folder})")
    extra = config.get("extra_special_tokens")
    named = {**{k: v for k, v in config.items() if k.endswith("_token")},
             **(extra if isinstance(extra, Mapping) else {})}
    texts = {key: _token_text(value) for key, value in named.items()}
    return {key: text for key, text in texts.items() if text is not None}


# ---------------------------------------------------------------------------- the template
class ChatTemplate:
    """A chat template (one or several named Jinja sources) with the special tokens it reads.

    Args:
        templates: the Jinja source, or name -> source ("default" is used unless ``name`` or
            tools pick another).
        special_tokens: template variables such as ``bos_token`` (strings).
        name: the template to use; None = "tool_use" when tools are passed and there is one,
            else "default".
        origin: where it came from, for messages.

    Raises:
        UserError: no template, or ``name`` is not one of them.
    """

    def __init__(self, templates: str | Mapping[str, str], *,
                 special_tokens: Mapping[str, str] | None = None, name: str | None = None,
                 origin: str = "chat template") -> None:
        self.templates = {"default": templates} if isinstance(templates, str) else dict(templates)
        self.special_tokens = dict(special_tokens or {})
        self.origin = origin
        if not self.templates:
            raise UserError(f"{origin}: no chat template given.")
        if name is not None and name not in self.templates:
            raise UserError(f"{origin}: no chat template named {name!r} (it has "
                            f"{', '.join(sorted(self.templates))}); pass one of those names.")
        self.name = name

    @classmethod
    def from_folder(cls, source: str | Path, *, name: str | None = None) -> ChatTemplate:
        """The template of a model folder (or hub id) as transformers reads it:
        ``chat_template.jinja`` (the "default") and ``additional_chat_templates/<name>.jinja``;
        without those, ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
        ``{"name", "template"}``).

        Raises:
            UserError: the folder has no template (naming both places), a malformed
                ``chat_template`` entry, or an unknown ``name``.
        """
        folder = resolve_source(source, owner="chat template")
        templates: dict[str, str] = {}
        if (folder / TEMPLATE_FILE).is_file():
            templates["default"] = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
        if (folder / TEMPLATE_DIR).is_dir():
            for file in sorted((folder / TEMPLATE_DIR).glob("*.jinja")):
                templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
        config = folder / CONFIG_FILE
        if not templates:
            entry = _merged(folder, (CONFIG_FILE,), "chat template").get("chat_template")
            if isinstance(entry, str):
                templates["default"] = entry
            elif isinstance(entry, list) and all(
                    isinstance(t, Mapping) and isinstance(t.get("name"), str)
                    and isinstance(t.get("template"), str) for t in entry):
                templates = {t["name"]: t["template"] for t in entry}
            elif entry is not None:
                raise UserError(f"chat template: {config} has a 'chat_template' that is neither "
                                f"a string nor a list of {{'name', 'template'}}; fix that entry.")
        if not templates:
            raise UserError(f"chat template: {folder} has none (no {TEMPLATE_FILE} and no "
                            f"'chat_template' in {CONFIG_FILE}); use a chat (instruct) model's "
                            f"folder, or add its template as {folder / TEMPLATE_FILE}.")
        return cls(templates, special_tokens=template_tokens(folder), name=name,
                   origin=f"chat template of {folder}")

    @classmethod
    def builtin(cls, name: str = "chatml") -> ChatTemplate:
        """A template shipped with mmtf (:data:`BUILTIN_TOKENS`), for a tokenizer that has its
        special tokens (``tokenizer.special_tokens`` of ``conf/tokenizer/bpe_chat.yaml``).

        Raises:
            UserError: no built-in template of that name.
        """
        if name not in BUILTIN_TOKENS:
            raise UserError(f"chat template {name!r} is not built in; the built-in ones are "
                            f"{sorted(BUILTIN_TOKENS)} (or give an LLM folder with its own).")
        source = (BUILTIN_DIR / f"{name}.jinja").read_text(encoding="utf-8")
        return cls(source, origin=f"built-in chat template {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (strings only) that :meth:`from_dict` rebuilds the template from: what a
        checkpoint stores beside its tokenizer."""
        return {"templates": dict(self.templates), "special_tokens": dict(self.special_tokens),
                "name": self.name, "origin": self.origin}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatTemplate:
        """The template :meth:`to_dict` wrote."""
        return cls(data["templates"], special_tokens=data.get("special_tokens"),
                   name=data.get("name"), origin=data.get("origin") or "chat template")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatTemplate) and (
            (self.templates, self.special_tokens, self.name)
            == (other.templates, other.special_tokens, other.name))

    __hash__ = None  # type: ignore[assignment]

    def source(self, tools: Sequence[Any] | None = None) -> str:
        """The Jinja source used for a call (``tools`` picks "tool_use" when there is one)."""
        if self.name is not None:
            return self.templates[self.name]
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" not in self.templates:
            raise UserError(f"{self.origin}: several templates and none named 'default' "
                            f"({', '.join(sorted(self.templates))}); pick one with name=.")
        return self.templates["default"]

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False,
               continue_final_message: bool | str = False, tools: Sequence[Any] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None, **extra: Any) -> str:
        """The conversation as text, byte-identical to transformers'
        ``apply_chat_template(messages, tokenize=False, ...)`` with the same arguments.

        Args:
            messages: ``{"role", "content", ...}`` mappings (left unchanged).
            add_generation_prompt: end with the header that opens an assistant turn.
            continue_final_message: end inside the last message (no end-of-turn marker), so
                the model continues it; a string names the field continued (default content).
            tools: JSON schemas of functions, for templates that describe tools.
            documents: ``{"title", "text"}`` mappings, for retrieval templates.
            **extra: more template variables (``date_string``, ``enable_thinking``, ...);
                they override the special tokens of the same name.

        Raises:
            UserError: a malformed conversation, both end options, a template that does not
                parse, or one that refuses the conversation (its ``raise_exception`` message).
        """
        if continue_final_message and add_generation_prompt:
            raise UserError(f"{self.origin}: add_generation_prompt opens a new assistant turn "
                            f"and continue_final_message continues the last one; pass one.")
        if tools is not None and not all(isinstance(t, Mapping) for t in tools):
            raise UserError(f"{self.origin}: tools must be JSON schemas (mappings); "
                            f"functions are not converted here.")
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise UserError(f"{self.origin}: documents must be mappings with 'title' and "
                            f"'text'.")
        source = self.source(tools)
        chat = _prepared_messages(messages, self.origin)
        continued = None
        if continue_final_message:
            continued = self._tag_final_message(chat, continue_final_message, source)
        text = self._render(source, messages=chat, tools=_plain(tools),
                            documents=_plain(documents),
                            add_generation_prompt=add_generation_prompt,
                            **{**self.special_tokens, **_plain(extra)})
        return text if continued is None else self._cut_at_tag(text, continued)

    # ------------------------------------------------------------------ helpers
    def _render(self, source: str, **variables: Any) -> str:
        try:
            template = _compiled(source)
        except jinja2.TemplateSyntaxError as err:
            raise UserError(f"{self.origin}: the template does not parse (line {err.lineno}: "
                            f"{_one_line(err.message)}); fix or replace it.") from None
        try:
            return template.render(**variables)
        except _TemplateRaised as err:
            raise UserError(f"{self.origin} refuses the conversation: "
                            f"{_one_line(err.message)}") from None
        except (jinja2.TemplateError, TypeError) as err:
            raise UserError(f"{self.origin}: rendering failed ({type(err).__name__}: "
                            f"{_one_line(str(err))}); check the messages' roles and "
                            f"contents.") from None

    def _tag_final_message(self, chat: list[dict[str, Any]], field: bool | str,
                           source: str) -> str:
        """Mark the end of the message to continue; return its text before the mark."""
        if not chat:
            raise UserError(f"{self.origin}: continue_final_message needs a message to continue.")
        key = field if isinstance(field, str) else "content"
        final = chat[-1].get(key)
        if final is None:
            raise UserError(f"{self.origin}: continue_final_message: the last message has no "
                            f"{key!r} to continue.")
        keys = [key]
        if key in _REASONING_FIELDS:      # tag every copy; the template reads one of them
            keys = [k for k in _REASONING_FIELDS if chat[-1].get(k) == final]
        if not any(k in source for k in keys):
            raise UserError(f"{self.origin}: continue_final_message={key!r}, a field the "
                            f"template never reads.")
        if isinstance(final, list | tuple):
            block = next((b for b in reversed(final) if isinstance(b, dict) and "text" in b),
                         None)
            if block is None:
                raise UserError(f"{self.origin}: continue_final_message: the last message has "
                                f"no text block to continue.")
            final, block["text"] = block["text"], block["text"] + _CONTINUE_TAG
            return final
        for k in keys:
            chat[-1][k] = chat[-1][k] + _CONTINUE_TAG
        return final

    def _cut_at_tag(self, text: str, final: str) -> str:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise UserError(f"{self.origin}: continue_final_message: the template drops part of "
                            f"the last message, so it cannot be continued.")
        at = text.rindex(tag)
        # A template that trims the message's trailing space trims the tag's too.
        return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else \
            text[:at].rstrip()

    def __repr__(self) -> str:
        return f"ChatTemplate({self.origin!r}, names={sorted(self.templates)})"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# ---------------------------------------------------------------------------- tokens
def backend_of(tokenizer: BackedTokenizer | HFTokenizer) -> HFTokenizer:
    """The `tokenizers.Tokenizer` of an mmtf tokenizer (or the tokenizer itself)."""
    return tokenizer.backend if isinstance(tokenizer, BackedTokenizer) else tokenizer


def encode_rendered(tokenizer: BackedTokenizer | HFTokenizer, text: str, *,
                    add_special_tokens: bool = False) -> Encoding:
    """Ids and character offsets of ``text`` as transformers' ``tokenizer(text)`` gives them:
    special tokens spelled in the text (a template's ``<|im_start|>``) are those tokens.
    ``add_special_tokens=False`` is ``apply_chat_template(tokenize=True)``: the template
    spells bos itself, so the post-processor must not add a second one."""
    backend = backend_of(tokenizer)
    # mmtf's own tokenizers encode special-token spellings as text (captions are never
    # markup); a chat rendering is markup, so that is switched off for this call.
    previous, backend.encode_special_tokens = backend.encode_special_tokens, False
    try:
        return backend.encode(text, add_special_tokens=add_special_tokens)
    finally:
        backend.encode_special_tokens = previous


def ensure_media_token(tokenizer: BackedTokenizer | HFTokenizer, token: str = "<|audio|>") -> int:
    """The id of the media placeholder ``token``, added to the tokenizer as a special token
    when it has no added token of that spelling (so it always encodes as one id).

    A new token gets the id past the vocabulary, which the LLM's embedding and head do not
    have yet: that is logged as a warning, and the prefix model grows them by one row
    (``MediaPrefixLM(grow_vocab=True)``).
    """
    backend = backend_of(tokenizer)
    found = _added_id(backend, token)
    if found is not None:
        return found
    before = backend.get_vocab_size(with_added_tokens=True)
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    new = backend.token_to_id(token)
    if new >= before:
        log.warning("media placeholder %s added to the tokenizer as id %d: the LLM's "
                    "embedding (and untied head) must grow by one row to %d.", token, new,
                    new + 1)
    return new


def end_of_turn_id(template: ChatTemplate, tokenizer: BackedTokenizer | HFTokenizer
                   ) -> int | None:
    """The id that closes an assistant turn in ``template`` (``<|im_end|>``, ``<|eot_id|>``,
    ``</s>``): the last trained token of a one-turn conversation, when it is a special token
    (:func:`encode_conversation` cuts the trained span after the turn's last special token);
    None when the template closes turns with plain text. Generation stops there."""
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    item = encode_conversation(template, tokenizer, probe, where="end_of_turn_id")
    trained = [t for t in item.labels if t != IGNORE_INDEX]
    special = {i for i, t in backend_of(tokenizer).get_added_tokens_decoder().items()
               if t.special}
    return trained[-1] if trained and trained[-1] in special else None


def _added_id(backend: HFTokenizer, token: str) -> int | None:
    return next((i for i, t in backend.get_added_tokens_decoder().items()
                 if t.content == token), None)


@dataclass(frozen=True)
class InstructionIds:
    """One conversation as a training item.

    Attributes:
        input_ids: the rendered conversation's ids (the template spells every special token).
        labels: same length, NOT shifted: ``labels[i] == input_ids[i]`` on the trained tokens
            of assistant turns (content and end-of-turn marker), ``-100`` everywhere else.
        media_positions: indices of the media placeholder in ``input_ids`` (empty without one).
    """

    input_ids: list[int]
    labels: list[int]
    media_positions: list[int]


def encode_conversation(template: ChatTemplate, tokenizer: BackedTokenizer | HFTokenizer,
                        messages: Sequence[Message], *, media_token: str | None = None,
                        where: str = "conversation", **extra: Any) -> InstructionIds:
    """Ids and loss labels of a conversation for instruction tuning.

    The trained span of an assistant turn is found from prefixes of the conversation: its
    text after the generation prompt that opens it (``render(messages[:i],
    add_generation_prompt=True)``; a template without one: from the content when a special
    token precedes it in the turn) up to the end of ``render(messages[:i + 1])``, cut after
    the last special token in it (the end-of-turn marker, ``<|eot_id|>``, ``<|im_end|>``,
    ``</s>``) so what the template adds after the marker (ChatML's newline) is not trained.
    Tokens overlapping a trained span are trained. An assistant message with ``"train":
    False`` is context only.

    Args:
        template: the model's chat template.
        tokenizer: the model's tokenizer (mmtf's or a ``tokenizers.Tokenizer``).
        messages: the conversation; ``train`` is read on assistant messages and not rendered.
        media_token: the placeholder a user message must hold (``<|audio|>``), one token of
            the tokenizer (:func:`ensure_media_token`); None: text only.
        where: the item, for messages (``"train.jsonl line 4"``).
        **extra: template variables, as in :meth:`ChatTemplate.render`.

    Raises:
        UserError: a malformed conversation, no trained assistant turn, a missing or
            misplaced media placeholder, one that is not a single token, or a template that
            rewrites earlier turns (the spans cannot be located).
    """
    chat, trained = _split_train_flags(messages, where)
    backend = backend_of(tokenizer)
    media_id = None
    if media_token is not None:
        media_id = _check_media(chat, media_token, backend, where)
    full = template.render(chat, **extra)
    special = {i: t.content for i, t in backend.get_added_tokens_decoder().items() if t.special}
    spans = []
    for i in trained:
        turn = template.render(chat[:i + 1], **extra)
        if not full.startswith(turn):
            raise UserError(f"{where}: {template.origin} renders messages 0-{i} differently "
                            f"inside the whole conversation (it rewrites earlier turns), so the "
                            f"trained span of assistant message {i} cannot be located; train on "
                            f"the conversation cut after that message instead.")
        start = _common_prefix(_generation_prompt_render(template, chat[:i], extra), turn)
        spans.append((_content_start(template, chat, i, turn, start, extra,
                                     list(special.values())), len(turn)))
    encoding = encode_rendered(backend, full)
    ids, offsets = encoding.ids, encoding.offsets
    labels = [IGNORE_INDEX] * len(ids)
    for i, (start, end) in zip(trained, spans):
        inside = [j for j, (a, b) in enumerate(offsets) if a < end and b > start]
        markers = [j for j in inside if ids[j] in special]
        for j in inside[:inside.index(markers[-1]) + 1] if markers else inside:
            labels[j] = ids[j]
        if inside:
            for j in _unprompted(backend, template, chat[:i], extra, ids, inside[0]):
                labels[j] = ids[j]
    media_positions = [j for j, t in enumerate(ids) if t == media_id]
    for j in media_positions:
        labels[j] = IGNORE_INDEX
    if media_id is not None and not media_positions:
        raise UserError(f"{where}: {template.origin} drops the media placeholder "
                        f"{media_token!r} of the user message; the media has nowhere to go.")
    if all(label == IGNORE_INDEX for label in labels):
        raise UserError(f"{where}: the trained assistant turns render to no tokens; give them "
                        f"some content.")
    return InstructionIds(input_ids=list(ids), labels=labels, media_positions=media_positions)


def _split_train_flags(messages: Sequence[Message], where: str,
                       ) -> tuple[list[dict[str, Any]], list[int]]:
    """The messages without ``train`` and the indices of the trained assistant turns."""
    if isinstance(messages, str | Mapping) or not isinstance(messages, Sequence):
        raise UserError(f"{where}: a conversation is a list of {{'role', 'content'}} messages, "
                        f"not {type(messages).__name__}.")
    chat, trained = [], []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise UserError(f"{where}: message {i} is not a {{'role', 'content'}} mapping.")
        flag = message.get("train", True)
        if not isinstance(flag, bool):
            raise UserError(f"{where}: message {i} has train={flag!r}; it must be true or false.")
        if "train" in message and message["role"] != "assistant":
            raise UserError(f"{where}: message {i} ({message['role']}) has 'train'; only "
                            f"assistant turns are trained, so drop it there.")
        if message["role"] == "assistant" and flag:
            trained.append(i)
        chat.append({k: v for k, v in message.items() if k != "train"})
    if not trained:
        raise UserError(f"{where}: no assistant message to train (every one has train: false, "
                        f"or there is none); add the answer as an assistant message.")
    return chat, trained


def _texts(content: Any) -> list[str]:
    """The text of a message's content: a string, or the ``text`` of its content blocks."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, Sequence):
        return [b["text"] for b in content if isinstance(b, Mapping)
                and isinstance(b.get("text"), str)]
    return []


def _check_media(chat: list[dict[str, Any]], token: str, backend: HFTokenizer,
                 where: str) -> int:
    """The placeholder's id, after checking it is one token, held by a user message and by
    no assistant message."""
    found = _added_id(backend, token)
    if found is None:
        raise UserError(f"{where}: the media placeholder {token!r} is not a token of the "
                        f"tokenizer (it would be split into pieces); add it with "
                        f"mmtf.text.chat.ensure_media_token(tokenizer, {token!r}) and grow the "
                        f"LLM's embedding by one row.")
    in_user = False
    for i, message in enumerate(chat):
        holds = any(token in text for text in _texts(message.get("content")))
        if holds and message["role"] == "assistant":
            raise UserError(f"{where}: assistant message {i} holds the media placeholder "
                            f"{token!r}; media goes in a user message, answers are text.")
        in_user = in_user or (holds and message["role"] == "user")
    if not in_user:
        raise UserError(f"{where}: no user message holds the media placeholder {token!r}; put "
                        f"it where the media belongs (e.g. \"{token} Describe the sound.\").")
    return found


def _unprompted(backend: HFTokenizer, template: ChatTemplate, chat: list[dict[str, Any]],
                extra: Mapping[str, Any], ids: list[int], first: int) -> range:
    """Positions before an assistant turn's first trained token that its generation prompt,
    encoded alone, does not hold: the model is prompted without them, so it must learn to
    write them. A tokenizer that strips and collapses whitespace (mmtf's BPE) encodes
    ``...assistant\n`` as ``...assistant`` while the conversation keeps the ``▁`` before a
    ``(``: left untrained, generation would start one token late, at a step never trained.
    Empty for tokenizers that keep the prompt's tokens (the Hugging Face ones), and for a
    template without a generation prompt (the turn's header is then found by its content)."""
    text = _generation_prompt_render(template, chat, extra)
    if not chat or text == template.render(chat, **extra):
        return range(0)
    prompt = encode_rendered(backend, text).ids
    n = len(prompt)
    if not prompt or n >= first or ids[:n] != prompt:
        return range(0)
    return range(n, first)


def _generation_prompt_render(template: ChatTemplate, chat: list[dict[str, Any]],
                              extra: Mapping[str, Any]) -> str:
    """The conversation before an assistant turn with the header that opens it. A template
    that cannot render an empty conversation (it reads ``messages[0]``) opens the first
    turn at the start of the text."""
    try:
        return template.render(chat, add_generation_prompt=True, **extra)
    except UserError:
        if chat:
            raise
        return ""


def _content_start(template: ChatTemplate, chat: list[dict[str, Any]], i: int, turn: str,
                   start: int, extra: Mapping[str, Any], markers: Sequence[str]) -> int:
    """Where the trained span of assistant message i begins in ``turn`` (the text up to its
    end). A template that writes no generation prompt leaves the turn's header after
    ``start``: when the text before the message's content holds a special token (a header
    such as ``<|im_start|>assistant``), the span begins at the content. Plain text there (a
    separating space) is generated by the model and stays trained; so does what precedes
    the content after a generation prompt (a reasoning block)."""
    content = chat[i].get("content")
    if not isinstance(content, str) or not content.strip():
        return start
    bare = template.render(chat[:i], **extra) if i else ""
    if start > len(bare):                 # the generation prompt covered the header
        return start
    at = turn.find(content.strip(), start)
    if at < 0 or not any(m in turn[start:at] for m in markers):
        return start
    return at


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


__all__ = ["BUILTIN_TOKENS", "IGNORE_INDEX", "MEDIA_TOKENS", "ChatTemplate", "InstructionIds",
           "backend_of", "encode_conversation", "end_of_turn_id", "encode_rendered", "ensure_media_token",
           "template_tokens"]
