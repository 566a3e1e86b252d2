"""Chat templates against transformers' ``apply_chat_template``, and instruction items.

Each tiny folder is a byte-level BPE built with `tokenizers`, wrapped in transformers'
``PreTrainedTokenizerFast`` and written with ``save_pretrained``, so mmtf and transformers
read the same files. The templates are hand-written copies of real ones (Llama 3.x, Qwen2.5,
SmolLM2, Llama 2) plus a multi-line one that leans on ``trim_blocks`` / ``lstrip_blocks``.
"""

from __future__ import annotations

import json
import logging

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from mmtf.errors import UserError
from mmtf.text.chat import (
    IGNORE_INDEX,
    ChatTemplate,
    encode_conversation,
    encode_rendered,
    ensure_media_token,
)
from tests.unit.pretrained.tiny_hf import CORPUS

transformers = pytest.importorskip("transformers")

LLAMA3 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# As in SmolLM2's tokenizer_config.json, whose strings hold real newlines.
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
           "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA2 = (r"{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          r"{% set system_message = messages[0]['content'] %}{% else %}"
          r"{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          r"{% for message in loop_messages %}{% if (message['role'] == 'user') != "
          r"(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
          r"user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
          r"system_message != false %}{% set content = '<<SYS>>\n' + system_message + "
          r"'\n<</SYS>>\n\n' + message['content'] %}{% else %}"
          r"{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          r"{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          r"{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
          r"eos_token }}{% endif %}{% endfor %}")

# Statements on lines of their own: trim_blocks and lstrip_blocks decide every newline.
MULTILINE = """{% for message in messages %}
    {% if message.role == 'system' %}
<<{{ message.content }}>>
    {% else %}
{{ message.role | upper }}: {{ message.content }}{{ eos_token if message.role == 'assistant' else '' }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}
"""

RAG = ("{{ bos_token }}{% for d in documents %}[{{ loop.index }}] {{ d.title }}: {{ d.text }}\n"
       "{% endfor %}{% for m in messages %}{{ m.role }}> {{ m.content }}\n{% endfor %}"
       "{% if add_generation_prompt %}assistant> {% endif %}")
TOOL_USE = ("{{ bos_token }}TOOLS {{ tools | tojson(indent=2, sort_keys=true) }}\n"
            "{% for m in messages %}{{ m.role }}> {{ m.content }}\n{% endfor %}")

# name -> (specials, tokenizer_config tokens, chat template, save as chat_template.jinja)
FAMILIES = {
    "llama3": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, LLAMA3, False),
    "qwen25": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
               {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, QWEN25, False),
    "smollm2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                 "unk_token": "<|endoftext|>"}, SMOLLM2, False),
    "llama2": (["<unk>", "<s>", "</s>"],
               {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, LLAMA2, False),
    "list": (["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>"},
             {"default": MULTILINE, "rag": RAG, "tool_use": TOOL_USE}, False),
    "jinja": (["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>"}, MULTILINE, True),
    "jinja_dir": (["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>"},
                  {"default": MULTILINE, "tool_use": TOOL_USE}, True),
}
# The trained text of an assistant turn with content c: the content and the end marker,
# spaced as each template writes them (worked out from the templates above).
TRAINED = {"llama3": "{}<|eot_id|>", "qwen25": "{}<|im_end|>", "smollm2": "{}<|im_end|>",
           "llama2": " {} </s>", "jinja": " {}</s>"}

SYSTEM_CHAT = [{"role": "system", "content": "Answer in one word."},
               {"role": "user", "content": "What barks?"},
               {"role": "assistant", "content": "A dog."},
               {"role": "user", "content": "And what falls on a tin roof?"}]
NO_SYSTEM = [{"role": "user", "content": "What barks at the cat?"}]
TWO_ANSWERS = [{"role": "user", "content": "What barks?"},
               {"role": "assistant", "content": "A dog."},
               {"role": "user", "content": "What falls?"},
               {"role": "assistant", "content": "Rain, on a tin roof."}]
PARTIAL = [{"role": "user", "content": "What sings in tall trees?"},
           {"role": "assistant", "content": "The birds "}]


def build_folder(folder, name: str):
    """Write the family's tiny tokenizer folder with save_pretrained; return the tokenizer."""
    specials, tokens, template, as_jinja = FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS + ["What barks? A dog. Rain falls."], trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(specials)
    bos = tokens.get("bos_token")
    if bos is not None:      # plain text gets bos, as Llama's tokenizers add it
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template,
                                                **tokens)
    fast.save_pretrained(folder, save_jinja_files=as_jinja)
    return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> (folder, the transformers tokenizer read from it)."""
    out = {}
    for name in FAMILIES:
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, build_folder(folder, name))
    return out


def assert_same(folder, hf, conversation, *, name=None, **kw):
    """Our text and ids equal transformers' apply_chat_template (tokenize=False and True)."""
    ours = ChatTemplate.from_folder(folder, name=name).render(conversation, **kw)
    if name is not None:
        kw["chat_template"] = name
    theirs = hf.apply_chat_template(conversation, tokenize=False, **kw)
    assert ours == theirs
    ids = hf.apply_chat_template(conversation, tokenize=True, **kw)["input_ids"]
    assert encode_rendered(hf.backend_tokenizer, ours).ids == ids
    return ours


CASES = [("system", SYSTEM_CHAT, {}), ("system_prompt", SYSTEM_CHAT,
                                        {"add_generation_prompt": True}),
         ("no_system_prompt", NO_SYSTEM, {"add_generation_prompt": True}),
         ("two_answers", TWO_ANSWERS, {}), ("continue", PARTIAL,
                                             {"continue_final_message": True})]


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("case,conversation,kw", CASES, ids=[c[0] for c in CASES])
def test_render_is_byte_identical_to_apply_chat_template(folders, name, case, conversation, kw):
    folder, hf = folders[name]
    text = assert_same(folder, hf, conversation, **kw)
    assert conversation[-1]["content"].strip() in text
    if name == "llama3":
        assert text.startswith("<|begin_of_text|><|start_header_id|>system")
        assert "Today Date: " in text           # strftime_now's date line
    if case == "continue":
        assert text.rstrip().endswith("The birds")      # no end-of-turn marker after it


def test_llama3_ids_hold_one_bos_and_date_string_overrides_the_clock(folders):
    folder, hf = folders["llama3"]
    text = assert_same(folder, hf, SYSTEM_CHAT, add_generation_prompt=True,
                       date_string="26 Jul 2024")
    assert "Today Date: 26 Jul 2024\n\n" in text
    ids = encode_rendered(hf.backend_tokenizer, text).ids
    bos = hf.convert_tokens_to_ids("<|begin_of_text|>")
    assert ids[0] == bos and ids.count(bos) == 1      # the template's bos, no second one


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_CHAT = [{"role": "user", "content": "Is it raining in Paris?"},
             {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "rain, 12 °C"}]


@pytest.mark.parametrize("name", ["qwen25", "llama3"])
def test_tools_branch_renders_as_transformers(folders, name):
    folder, hf = folders[name]
    text = assert_same(folder, hf, TOOL_CHAT, tools=TOOLS, add_generation_prompt=True)
    assert '"get_weather"' in text and "12 °C" in text      # tojson keeps non-ASCII


def test_template_list_picks_default_named_and_tool_use(folders):
    folder, hf = folders["list"]
    docs = [{"title": "Roofs", "text": "Rain falls on a tin roof."}]
    text = assert_same(folder, hf, NO_SYSTEM, name="rag", documents=docs,
                       add_generation_prompt=True)
    assert text.startswith("<s>[1] Roofs: Rain falls") and text.endswith("assistant> ")
    text = assert_same(folder, hf, NO_SYSTEM, tools=TOOLS)
    assert text.startswith('<s>TOOLS [\n  {\n    "function"')          # sorted keys, indent 2
    assert assert_same(folder, hf, NO_SYSTEM).startswith("USER: What barks")
    with pytest.raises(UserError, match=r"no chat template named 'chat'.*default, rag, "
                                        r"tool_use"):
        ChatTemplate.from_folder(folder, name="chat")


def test_jinja_files_are_read_before_tokenizer_config(folders):
    folder, hf = folders["jinja_dir"]
    assert (folder / "chat_template.jinja").is_file()
    assert (folder / "additional_chat_templates" / "tool_use.jinja").is_file()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'ignored' }}"        # the files take priority
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    assert assert_same(folder, hf, TWO_ANSWERS).startswith("USER: What barks?\nASSISTANT:")
    assert assert_same(folder, hf, NO_SYSTEM, tools=TOOLS).startswith("<s>TOOLS")


def test_template_refusal_is_one_line_with_the_templates_message(folders):
    folder, hf = folders["llama2"]
    bad = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        hf.apply_chat_template(bad, tokenize=False)
    with pytest.raises(UserError, match=r"refuses the conversation: Conversation roles must "
                                        r"alternate user/assistant/user/assistant/\.\.\.$") as e:
        ChatTemplate.from_folder(folder).render(bad)
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


def test_missing_template_names_the_folder_and_both_places(tmp_path):
    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(UserError, match=r"has none \(no chat_template\.jinja and no "
                                        r"'chat_template' in tokenizer_config\.json\)") as e:
        ChatTemplate.from_folder(tmp_path)
    assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)


def test_predict_cli_without_a_template_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    from omegaconf import OmegaConf

    from mmtf.predict import print_predictions
    from mmtf.utils.config import run_cli
    from tests.unit.pretrained.tiny_hf import write_llm

    write_llm(tmp_path, layers=1, hidden=32, heads=2, kv_heads=1)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = OmegaConf.create({"ckpt_path": str(tmp_path), "inputs": "???", "format": "json",
                            "prompts": [[{"role": "user", "content": "hi"}]], "batch_size": 1,
                            "accelerator": "cpu", "generation": {"max_new_tokens": 2}})
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)    # the tests' default shows tracebacks
    capsys.readouterr()                                       # save_pretrained's progress bar
    with pytest.raises(SystemExit) as exit_info:
        run_cli(print_predictions, cfg)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "chat_template.jinja" in err and str(tmp_path) in err


# ---------------------------------------------------------------------------- training items
HAND_CHAT = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "What barks?"},
             {"role": "assistant", "content": "A dog.", "train": False},
             {"role": "user", "content": "And rain?"},
             {"role": "assistant", "content": "It falls."}]
# HAND_CHAT under SMOLLM2, split by hand where the labels change: only the last answer and its
# <|im_end|> are trained; the first answer (train: false), the headers and the newline that
# ChatML writes after <|im_end|> are not. Each piece starts at a pre-token boundary (a special
# token or a newline), so the pieces' ids joined are the whole text's.
HAND_PIECES = [("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat barks?"
                "<|im_end|>\n<|im_start|>assistant\nA dog.<|im_end|>\n<|im_start|>user\n"
                "And rain?<|im_end|>\n<|im_start|>assistant\n", False),
               ("It falls.<|im_end|>", True), ("\n", False)]


def runs(ids: list[int], labels: list[int]) -> list[list[int]]:
    """The labelled ids as contiguous runs."""
    out, last = [], -2
    for j, label in enumerate(labels):
        if label != IGNORE_INDEX:
            assert label == ids[j]
            if j != last + 1:
                out.append([])
            out[-1].append(label)
            last = j
    return out


def test_instruction_labels_match_a_hand_worked_example(folders):
    folder, hf = folders["smollm2"]
    backend = hf.backend_tokenizer
    item = encode_conversation(ChatTemplate.from_folder(folder), backend, HAND_CHAT,
                               media_token=None)
    ids, labels = [], []
    for text, trained in HAND_PIECES:
        piece = backend.encode(text, add_special_tokens=False).ids
        ids += piece
        labels += piece if trained else [IGNORE_INDEX] * len(piece)
    assert item.input_ids == ids and item.labels == labels and item.media_positions == []
    assert backend.decode([t for t in item.labels if t != IGNORE_INDEX],
                          skip_special_tokens=False) == "It falls.<|im_end|>"


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_labelled_tokens_decode_to_the_answers_and_their_end_marker(folders, name):
    folder, hf = folders[name]
    item = encode_conversation(ChatTemplate.from_folder(folder), hf.backend_tokenizer,
                               TWO_ANSWERS)
    assert item.input_ids == hf.apply_chat_template(TWO_ANSWERS)["input_ids"]
    texts = [hf.backend_tokenizer.decode(run, skip_special_tokens=False)
             for run in runs(item.input_ids, item.labels)]
    assert texts == [TRAINED[name].format(m["content"]) for m in TWO_ANSWERS[1::2]]


@pytest.mark.parametrize("prompt", [True, False], ids=["generation_prompt", "none"])
def test_labels_equal_transformers_assistant_mask_of_a_generation_template(folders, prompt):
    """A template with transformers' {% generation %} marks: its assistant mask, from
    return_assistant_tokens_mask, is an independent reference for the trained tokens. Without
    a generation-prompt branch the header is found by the content."""
    folder, hf = folders["smollm2"]
    marked = ("{% for m in messages %}{% if m.role == 'assistant' %}"
              "{{ '<|im_start|>assistant\n' }}{% generation %}{{ m.content + '<|im_end|>' }}"
              "{% endgeneration %}{{ '\n' }}{% else %}"
              "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endif %}"
              "{% endfor %}")
    if prompt:
        marked += "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    out = hf.apply_chat_template(TWO_ANSWERS, chat_template=marked,
                                 return_assistant_tokens_mask=True)
    template = ChatTemplate(marked, origin="marked")
    item = encode_conversation(template, hf.backend_tokenizer, TWO_ANSWERS)
    assert item.input_ids == out["input_ids"] and sum(out["assistant_masks"]) > 4
    assert [int(t != IGNORE_INDEX) for t in item.labels] == out["assistant_masks"]


def test_a_template_that_rewrites_earlier_turns_is_refused(folders):
    folder, hf = folders["smollm2"]
    # Earlier answers are shortened (as reasoning templates drop old thinking).
    rewrites = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' }}"
                "{{ m.content if loop.last or m.role != 'assistant' else '...' }}"
                "{{ '<|im_end|>\n' }}{% endfor %}")
    with pytest.raises(UserError, match=r"item 7: .*renders messages 0-1 differently"):
        encode_conversation(ChatTemplate(rewrites), hf.backend_tokenizer, TWO_ANSWERS,
                            where="item 7")


def test_nothing_to_train_is_refused(folders):
    folder, hf = folders["qwen25"]
    template = ChatTemplate.from_folder(folder)
    off = [*TWO_ANSWERS[:3], {**TWO_ANSWERS[3], "train": False}]
    off[1] = {**off[1], "train": False}
    with pytest.raises(UserError, match=r"row 3: no assistant message to train"):
        encode_conversation(template, hf.backend_tokenizer, off, where="row 3")
    with pytest.raises(UserError, match=r"message 0 \(user\) has 'train'"):
        encode_conversation(template, hf.backend_tokenizer,
                            [{**NO_SYSTEM[0], "train": True}, TWO_ANSWERS[1]])


# ---------------------------------------------------------------------------- media
AUDIO_CHAT = [{"role": "user", "content": "<|audio|> What makes this sound?"},
              {"role": "assistant", "content": "A dog barks."}]


def test_ensure_media_token_adds_one_special_token_and_reports_the_growth(folders, caplog):
    _, hf = folders["qwen25"]
    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    size = backend.get_vocab_size(with_added_tokens=True)
    with caplog.at_level(logging.WARNING, logger="mmtf.text"):
        first = ensure_media_token(backend, "<|audio|>")
    assert first == size and backend.get_vocab_size(with_added_tokens=True) == size + 1
    assert "must grow by one row" in caplog.text
    caplog.clear()
    assert ensure_media_token(backend, "<|audio|>") == first and not caplog.text
    assert backend.encode("x<|audio|>y", add_special_tokens=False).ids.count(first) == 1
    # A token the tokenizer already has is used as it is.
    assert ensure_media_token(backend, "<|im_end|>") == backend.token_to_id("<|im_end|>")


def test_media_placeholder_is_one_untrained_token(folders):
    folder, hf = folders["llama3"]
    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    audio = ensure_media_token(backend, "<|audio|>")
    item = encode_conversation(ChatTemplate.from_folder(folder), backend, AUDIO_CHAT,
                               media_token="<|audio|>")
    assert item.input_ids.count(audio) == 1 and item.media_positions == [
        item.input_ids.index(audio)]
    assert item.labels[item.media_positions[0]] == IGNORE_INDEX
    texts = [backend.decode(r, skip_special_tokens=False) for r in runs(item.input_ids,
                                                                        item.labels)]
    assert texts == ["A dog barks.<|eot_id|>"]


def test_media_bad_input_is_one_line_naming_the_item_and_placeholder(folders):
    folder, hf = folders["qwen25"]
    template = ChatTemplate.from_folder(folder)
    backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    with pytest.raises(UserError, match=r"clip 2: the media placeholder '<\|audio\|>' is not a "
                                        r"token.*ensure_media_token"):
        encode_conversation(template, backend, AUDIO_CHAT, media_token="<|audio|>",
                            where="clip 2")
    ensure_media_token(backend, "<|audio|>")
    no_media = [{"role": "user", "content": "What makes this sound?"}, AUDIO_CHAT[1]]
    with pytest.raises(UserError, match=r"clip 2: no user message holds the media placeholder "
                                        r"'<\|audio\|>'") as e:
        encode_conversation(template, backend, no_media, media_token="<|audio|>",
                            where="clip 2")
    assert "\n" not in str(e.value)
    in_answer = [AUDIO_CHAT[0], {"role": "assistant", "content": "<|audio|> a dog"}]
    with pytest.raises(UserError, match=r"clip 2: assistant message 1 holds the media "
                                        r"placeholder"):
        encode_conversation(template, backend, in_answer, media_token="<|audio|>",
                            where="clip 2")


@pytest.mark.parametrize("source", ["{% set ns = namespace(_x=1) %}{{ ns }}",
                                    "{{ messages.append(messages[0]) }}",
                                    "{{ ''.__class__.__mro__ }}"])
def test_the_sandbox_refuses_what_transformers_refuses(folders, source):
    _, hf = folders["smollm2"]
    with pytest.raises(Exception):                      # noqa: B017 (jinja2's own types)
        hf.apply_chat_template(NO_SYSTEM, chat_template=source, tokenize=False)
    with pytest.raises(UserError, match=r"^unsafe: rendering failed \(") as e:
        ChatTemplate(source, origin="unsafe").render(NO_SYSTEM)
    assert "\n" not in str(e.value)


def test_named_extra_special_tokens_are_template_variables(folders, tmp_path):
    import shutil

    folder, _ = folders["smollm2"]
    shutil.copytree(folder, tmp_path / "copy")
    config = json.loads((tmp_path / "copy" / "tokenizer_config.json").read_text())
    config.update(extra_special_tokens={"media_marker": "<|endoftext|>"},
                  chat_template="{{ media_marker }}|{{ unk_token }}|{{ pad_token }}|"
                                "{{ messages[0].content }}")
    (tmp_path / "copy" / "tokenizer_config.json").write_text(json.dumps(config))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "copy")
    text = assert_same(tmp_path / "copy", hf, NO_SYSTEM)
    assert text == "<|endoftext|>|<|endoftext|>||What barks at the cat?"   # no pad_token


def test_mmtf_bpe_trains_what_follows_its_stripped_generation_prompt():
    """mmtf's BPE strips the rendered prompt's final newline, so the prompt alone encodes to
    ``... assistant`` while the conversation holds a ``▁`` before ``(b)``: that token must be
    trained, or generation starts one step late (replies lost their "(")."""
    from mmtf.text.bpe import BPETokenizer

    answers = ["(b) falling chirp", "a low tone, then a beep."]
    tok = BPETokenizer.train(["which sound? (a) low tone (b) falling chirp", *answers] * 4,
                             vocab_size=120,
                             special_tokens=["<|im_start|>", "<|im_end|>", "<|audio|>"])
    template = ChatTemplate.builtin("chatml")
    for answer in answers:
        chat = [{"role": "user", "content": "<|audio|>\nwhich sound?"},
                {"role": "assistant", "content": answer}]
        item = encode_conversation(template, tok, chat, media_token="<|audio|>")
        prompt = encode_rendered(tok, template.render(chat[:1], add_generation_prompt=True)).ids
        assert item.input_ids[:len(prompt)] == prompt
        # Everything after the prompt is trained: the answer and its end marker, and nothing
        # after the marker (ChatML's newline).
        end = max(j for j, t in enumerate(item.input_ids) if t == tok.token_to_id("<|im_end|>"))
        trained = [j for j, t in enumerate(item.labels) if t != IGNORE_INDEX]
        assert trained == list(range(len(prompt), end + 1)), (answer, item.input_ids, prompt)
        assert tok.decode(item.input_ids[len(prompt):end]).strip() == answer
