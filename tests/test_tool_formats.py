"""The tool-call formats table (grammarserve/fsm/tool_formats.py) row by row: the format each
vendored chat template is detected as, the template's own rendering of a past call accepted by
that format's grammar (and wrong names or arguments refused by its mask), the one parser reading
it back (streamed at every cut == whole), and the refusals of what an encoding cannot express."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grammarserve.errors import GrammarError, InvalidRequestError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk
from grammarserve.fsm.tool_formats import FORMATS, calls_text, tool_format
from grammarserve.openai.protocol import ChatMessage
from grammarserve.openai.render import render_chat
from grammarserve.openai.tool_detect import detect_tool_format, resolve_tool_parser
from grammarserve.openai.toolparse import ToolCallArgs, ToolCallStart
from grammarserve.openai.toolparse_array import make_parser, parse_calls

TEMPLATES = Path(__file__).parent / "data" / "templates"
EOS = 2
#: Each vendored template and the format it is detected as (None: the built-in formats).
DETECTED = {
    "Qwen-Qwen3-0.6B.jinja": "hermes", "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek_v3",
    "llama-cpp-deepseek-r1.jinja": "deepseek_v3", "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek_v31",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3_json",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3_json",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral_v11",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral_v11",
    "openai-gpt-oss-120b.jinja": "harmony", "grammarserve-pythonic.jinja": "pythonic",
    "HuggingFaceTB-SmolLM3-3B.jinja": None,
}
PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Rome", "Paris"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "metric": {"type": "boolean"}}, "required": ["city"], "additionalProperties": False}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                      "parameters": PARAMS}},
    {"type": "function", "function": {"name": "ping", "description": "Ping.",
                                      "parameters": {"type": "object", "properties": {}}}}]
ARGS = {"city": "Rome", "days": 2, "metric": True}


def test_every_template_is_detected_as_its_family() -> None:
    assert sorted(DETECTED) == sorted(p.name for p in TEMPLATES.glob("*.jinja"))
    for name, fmt in DETECTED.items():
        assert detect_tool_format((TEMPLATES / name).read_text(encoding="utf-8")) == fmt, name
    nemo = (TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
    small = (TEMPLATES / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text()
    assert resolve_tool_parser("mistral", nemo) == "mistral"
    assert resolve_tool_parser("mistral", small) == "mistral_v11"
    assert resolve_tool_parser("openai", None) == "harmony"
    assert resolve_tool_parser("auto", None) is None
    with pytest.raises(InvalidRequestError, match="tool_call_parser must be one of"):
        resolve_tool_parser("granite", small)


def template_form(fmt: str, name: str, args: dict[str, Any], rendered: str) -> str:
    """The call as the family's template wrote it in ``rendered``, checked against what the
    format writes; returns the text the grammar must accept."""
    ours = calls_text(tool_format(fmt), [(name, args)])
    if fmt == "harmony":  # NOTE: the template puts the recipient before the channel
        assert (f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>"
                f"{json.dumps(args)}<|call|>") in rendered
        return ours
    if fmt == "mistral_v11" and "[CALL_ID]" in rendered:  # Small 3.2 writes the call's id
        assert f"[TOOL_CALLS]{name}[CALL_ID]" in rendered
        assert f"[ARGS]{json.dumps(args)}" in rendered
        return ours
    if fmt == "mistral":  # Nemo adds the call's id to the object
        assert ours[:-2] + ', "id": "' in rendered
        return ours
    if fmt == "llama3_json":  # no <|python_tag|> in the history
        assert ours.removeprefix("<|python_tag|>") in rendered
        return ours.removeprefix("<|python_tag|>")
    assert ours in rendered, (ours, rendered[-400:])
    return ours


def _history(args: dict[str, Any]) -> list[ChatMessage]:
    return [ChatMessage.model_validate(m) for m in [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}]]


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


def _walks(compiler: GrammarCompiler, tokenizer: Any, grammar: Any, text: str) -> bool:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))[0]


@pytest.mark.model
@pytest.mark.parametrize("template", [t for t, f in DETECTED.items() if f is not None])
def test_the_templates_past_call_is_the_formats_call(template: str, tokenizer: Any,
                                                     compiler: GrammarCompiler) -> None:
    fmt = DETECTED[template]
    assert fmt is not None
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = (TEMPLATES / template).read_text(encoding="utf-8")
    rendered = render_chat(tokenizer, _history(ARGS), tools=TOOLS, tool_format=fmt)
    text = template_form(fmt, "get_weather", ARGS, rendered)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for mode in ("required", named) + (("auto",) if tool_format(fmt).has_auto else ()):
        grammar = compiler.compile_tool_calls(TOOLS, mode, call_format=fmt)
        assert _walks(compiler, tokenizer, grammar, text), (fmt, mode, text)
        assert not _walks(compiler, tokenizer, grammar, text.replace("get_weather", "get_time"))
        assert not _walks(compiler, tokenizer, grammar, text.replace("Rome", "Oslo"))
        assert not _walks(compiler, tokenizer, grammar, text.replace("2", "12", 1))
    content, calls = parse_calls(text, fmt, {"get_weather": PARAMS})
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", ARGS)]


def _streamed(fmt: str, text: str, cut: int) -> tuple[str, list[tuple[str, str]]]:
    parser = make_parser(fmt, {"get_weather": PARAMS})
    events = []
    for i in range(0, len(text), cut):
        events += parser.feed(text[i:i + cut])
    events += parser.finish()
    names = [e.name for e in events if isinstance(e, ToolCallStart)]
    args = [""] * len(names)
    for e in events:
        if isinstance(e, ToolCallArgs):
            args[e.index] += e.text
    return parser.content, list(zip(names, args, strict=True))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_parser_reads_every_format_streamed_as_whole(fmt: str) -> None:
    form = tool_format(fmt)
    calls = [("get_weather", {"city": "Paris", "days": 3}), ("ping", {})][:1 if form.single else 2]
    text = calls_text(form, calls)
    if form.has_auto and form.trigger_anywhere:
        text = "Let me look.\n" + text
    whole = _streamed(fmt, text, len(text))
    assert whole[0] == ("Let me look." if form.has_auto and form.trigger_anywhere else "")
    assert [(n, json.loads(a)) for n, a in whole[1]] == calls
    for cut in range(1, 9):
        assert _streamed(fmt, text, cut) == whole, cut
    # cut inside the last call's arguments: what was streamed of them stays
    if form.name_key is None and form.args.value == "json":
        partial = text[:text.index('"Paris"') + 4]
        assert _streamed(fmt, partial, 3)[1] == [("get_weather", '{"city": "Par')]


@pytest.mark.parametrize("fmt", sorted(f for f in FORMATS if tool_format(f).has_auto))
def test_plain_text_is_content(fmt: str) -> None:
    assert parse_calls("It is sunny in Rome; no call needed.", fmt) == (
        "It is sunny in Rome; no call needed.", [])


def test_xml_values_decode_by_their_type() -> None:
    params = {"type": "object", "properties": {"code": {"type": "string"},
                                               "n": {"type": "integer"},
                                               "on": {"type": "boolean"},
                                               "tags": {"type": "array"}}}
    text = ("<tool_call>\n<function=f>\n<parameter=code>\n123\n</parameter>\n"
            "<parameter=n>\n7\n</parameter>\n<parameter=on>\nTrue\n</parameter>\n"
            '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>')
    _, calls = parse_calls(text, "qwen3_coder", {"f": params})
    assert json.loads(calls[0].arguments) == {"code": "123", "n": 7, "on": True,
                                              "tags": ["a", "b"]}


def test_pythonic_values_decode_as_python_literals() -> None:
    _, calls = parse_calls("[f(a='x', b=True, c=None, d=[1, 2], e=-1.5)]", "pythonic")
    assert json.loads(calls[0].arguments) == {"a": "x", "b": True, "c": None, "d": [1, 2],
                                              "e": -1.5}


def _tool(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": params}}]


@pytest.mark.model
@pytest.mark.parametrize(("fmt", "params", "keyword"), [
    ("qwen3_coder", {"type": "object", "properties": {"x": {"type": ["string", "integer"]}}},
     "'type'"),
    ("qwen3_coder", {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}},
     "'pattern'"),
    ("qwen3_coder", {"type": "object", "properties": {"x": {}}}, "'type'"),
    ("qwen3_coder", {"type": "object", "minProperties": 1, "properties": {}}, "'minProperties'"),
    ("pythonic", {"type": "object", "properties": {"x-y": {"type": "string"}}}, "'properties'"),
    ("pythonic", {"type": "object", "properties": {"x": {"type": "array",
                                                         "items": {"type": "boolean"}}}},
     "'type'"),
    ("pythonic", {"type": "object", "properties": {"a": {"type": "string"}},
                  "required": ["a", "b"]}, "'required'"),
])
def test_what_an_encoding_cannot_express_is_refused(compiler: GrammarCompiler, fmt: str,
                                                    params: dict[str, Any], keyword: str) -> None:
    with pytest.raises(GrammarError, match=f"tool 'f'.*{fmt} tool-call format.*{keyword}"):
        compiler.compile_tool_calls(_tool(params), "required", call_format=fmt)


def test_formats_without_auto_refuse_it() -> None:
    assert not tool_format("json_array").has_auto
    assert all(tool_format(f).has_auto for f in FORMATS if f != "json_array")


@pytest.mark.model
@pytest.mark.parametrize("template", ["openai-gpt-oss-120b.jinja", "llama-cpp-deepseek-r1.jinja"])
def test_tools_a_template_refuses_are_adapted(tokenizer: Any, template: str) -> None:
    """gpt-oss needs a ``description`` (an empty one is given); llama.cpp's deepseek-r1 cannot
    render ``tools`` under transformers' Jinja (the built-in block describes them)."""
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = (TEMPLATES / template).read_text(encoding="utf-8")
    bare = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
    fmt = DETECTED[template]
    assert fmt is not None
    text = render_chat(tokenizer, _history(ARGS), tools=bare, tool_format=fmt)
    assert "get_weather" in text.split("Weather in Rome?")[0]  # the tools are described
    template_form(fmt, "get_weather", ARGS, text)


@pytest.mark.model
@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "mistral_v11", "deepseek_v31",
                                 "harmony"])
def test_a_single_call_reply_ends_right_after_the_call(fmt: str, tokenizer: Any,
                                                       compiler: GrammarCompiler) -> None:
    """Nothing can follow the only call (a named choice, ``parallel_tool_calls`` false, a
    one-call format): no whitespace is allowed after it, so the stop comes at once instead of
    the model padding up to the whitespace bound; with parallel calls whitespace may follow
    (the next call's separator)."""
    template = next(t for t, f in DETECTED.items() if f == fmt)
    tok = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tok.chat_template = (TEMPLATES / template).read_text(encoding="utf-8")
    text = template_form(fmt, "get_weather", ARGS,
                         render_chat(tok, _history(ARGS), tools=TOOLS, tool_format=fmt))
    named = {"type": "function", "function": {"name": "get_weather"}}
    for mode, parallel in ((named, True), ("required", False)):
        grammar = compiler.compile_tool_calls(TOOLS, mode, parallel=parallel,
                                              call_format=fmt)
        assert _walks(compiler, tok, grammar, text)
        assert not _walks(compiler, tok, grammar, text + "\n")
    grammar = compiler.compile_tool_calls(TOOLS, "required", parallel=True,
                                          call_format=fmt)
    assert _walks(compiler, tok, grammar, text + "\n") is not tool_format(fmt).single
