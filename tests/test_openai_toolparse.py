"""Tool-call parsing of model output (grammarserve/openai/toolparse.py), whole and streamed."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from openai_helpers import CALL

from grammarserve.openai.toolparse import ContentDelta, ToolCallArgs, ToolCallStart
from grammarserve.openai.toolparse_array import ToolCallParser, parse_tool_calls

# -- tool-call parsing -----------------------------------------------------------------------
TEXTS = [
    "Just text, with a trailing space ",
    CALL,
    "Let me check.\n" + CALL + "\n" + CALL.replace("Paris", "Rome"),
    '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>',  # keys in other order
    '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>',  # string arguments
    'Cut <tool_call>\n{"name": "f", "argu',  # cut before the call head ends
    '<tool_call>\n{"name": "f", "arguments": {"a": "b',  # cut inside the arguments
    "1 < 2 and <tool_ca",
]


def _run(text: str, cuts: list[int]) -> tuple[str | None, list[tuple[str, str]]]:
    parser = ToolCallParser()
    events = []
    prev = 0
    for c in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[prev:c])
        prev = c
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index not in names and e.index == len(names)
            names[e.index], args[e.index] = e.name, ""
        elif isinstance(e, ToolCallArgs):
            args[e.index] += e.text
    return (content if content or not names else None), [(names[i], args[i]) for i in names]


def test_parse_tool_calls_whole_outputs() -> None:
    content, calls = parse_tool_calls(TEXTS[0])
    assert content == TEXTS[0] and calls == []
    content, calls = parse_tool_calls(TEXTS[2])
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert calls[0].arguments == '{"city": "Paris", "x": [1, "}"]}'  # raw text, as generated
    assert all(c.id.startswith("call_") and len(c.id) > 20 for c in calls)
    assert calls[0].id != calls[1].id
    assert [(c.name, json.loads(c.arguments)) for c in parse_tool_calls(TEXTS[3])[1]] == [
        ("f", {"a": 1})]
    assert parse_tool_calls(TEXTS[4])[1][0].arguments == '{"a": 1}'
    assert parse_tool_calls(TEXTS[5]) == ("Cut", [])  # no markup leaks into content
    assert parse_tool_calls(TEXTS[7]) == ("1 < 2 and <tool_ca", [])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(TEXTS), st.lists(st.integers(0, 200), max_size=30))
def test_streamed_parse_is_independent_of_chunking(text: str, cuts: list[int]) -> None:
    whole = _run(text, [])
    assert _run(text, [c for c in cuts if c < len(text)]) == whole
    content, calls = parse_tool_calls(text)
    assert whole == (content, [(c.name, c.arguments) for c in calls])
    assert "<tool_call>" not in (whole[0] or "") or text == TEXTS[7] or "not json" in text


def test_arguments_stream_before_the_call_ends() -> None:
    parser = ToolCallParser()
    events = parser.feed('<tool_call>\n{"name": "f", "arguments": {"city": "Pa')
    assert isinstance(events[0], ToolCallStart) and events[0].name == "f"
    assert "".join(e.text for e in events if isinstance(e, ToolCallArgs)) == '{"city": "Pa'
