"""Structural tags end to end: the official ``openai`` SDK against the real server on the
embedded model, with vLLM's request shapes. Whatever the model writes is parsed here by the
rules of the tag (independently of the grammar): every trigger in the text starts a tagged span,
whose JSON validates against its schema (``jsonschema``) and whose end follows; streamed and not.
The model's values are not asserted, only the reply's validity."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.model

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"], "additionalProperties": False}
END = "</function>"
STRUCTURES = [{"begin": "<function=get_weather>", "schema": WEATHER, "end": END},
              {"begin": "<function=get_time>", "schema": TIME, "end": END}]
TRIGGERS = ["<function="]
LEGACY: Any = {"type": "structural_tag", "structures": STRUCTURES, "triggers": TRIGGERS}
SYSTEM = ("You can call two functions. To call one, write <function=NAME>{JSON arguments}"
          "</function>. get_weather takes {\"city\": string, \"unit\": \"celsius\" or "
          "\"fahrenheit\"}; get_time takes {\"city\": string}. Example: "
          "<function=get_time>{\"city\": \"Oslo\"}</function>")
#: One example exchange: without it SmolLM2-135M writes Python instead of the convention.
MESSAGES: Any = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": 'Let me check. <function=get_weather>{"city": "Oslo", '
                                     '"unit": "celsius"}</function>'},
    {"role": "user", "content": "What is the weather in Paris?"}]
BUDGET = 96


@pytest.fixture(scope="module")
def client(e2e_server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=e2e_server["url"] + "/v1", api_key="none", max_retries=0,
                         timeout=300)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def tagged_spans(text: str, truncated: bool) -> list[tuple[str, Any]]:
    """``(begin, value)`` of each span of ``text`` under the legacy tag's rules: the earliest
    trigger from each point on starts a span (begin, JSON valid under its schema, end); the rest
    is free text. ``truncated`` (``max_tokens`` cut the reply): the last span may be unfinished."""
    spans: list[tuple[str, Any]] = []
    pos = 0
    while True:
        hits = [(text.find(t, pos), t) for t in TRIGGERS if text.find(t, pos) >= 0]
        if not hits:
            return spans
        at, trigger = min(hits)
        rest = text[at:]
        chosen = [s for s in STRUCTURES if s["begin"].startswith(trigger)]
        found = next((s for s in chosen if rest.startswith(s["begin"])), None)
        if found is None:
            assert truncated and any(s["begin"].startswith(rest) for s in chosen), rest
            return spans
        start = _skip_ws(text, at + len(found["begin"]))
        try:
            value, stop = json.JSONDecoder().raw_decode(text, start)
        except json.JSONDecodeError:
            assert truncated and END not in text[start:], text[start:]
            return spans
        jsonschema.validate(value, found["schema"])
        close = _skip_ws(text, stop)
        if not text.startswith(END, close):
            assert truncated and END.startswith(text[close:]), text[close:]
            return spans
        spans.append((found["begin"], value))
        pos = close + len(END)


def test_legacy_structural_tag_reply_follows_the_rules(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=BUDGET,
                                           temperature=0, response_format=LEGACY)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length"), choice
    text = choice.message.content or ""
    tagged_spans(text, truncated=choice.finish_reason == "length")
    assert reply.usage is not None and reply.usage.completion_tokens <= BUDGET
    # streamed: the same greedy text in deltas, one finish reason
    chunks = list(client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=BUDGET, temperature=0, stream=True,
        response_format=LEGACY))
    streamed = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert reasons == [choice.finish_reason]
    assert streamed == text
    tagged_spans(streamed, truncated=reasons[0] == "length")


def test_format_with_at_least_one_tag_writes_a_valid_call(client: openai.OpenAI) -> None:
    fmt = {"type": "triggered_tags", "triggers": TRIGGERS, "at_least_one": True,
           "stop_after_first": True, "tags": [
               {"type": "tag", "begin": s["begin"], "end": s["end"],
                "content": {"type": "json_schema", "json_schema": s["schema"]}}
               for s in STRUCTURES]}
    # vLLM's extra_body shape works as well as the typed argument
    for stream in (False, True):
        kw: Any = {"model": "m", "messages": MESSAGES, "max_tokens": BUDGET, "temperature": 0,
                   "extra_body": {"response_format": {"type": "structural_tag", "format": fmt}}}
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
            finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
            assert len(finish) == 1
            reason = finish[0]
        else:
            choice = client.chat.completions.create(**kw).choices[0]
            text, reason = choice.message.content or "", choice.finish_reason
        assert reason in ("stop", "length")
        spans = tagged_spans(text, truncated=reason == "length")
        if reason == "stop":  # exactly one call and nothing else
            assert len(spans) == 1 and text.startswith(spans[0][0]) and text.endswith(END)
        else:
            assert text.startswith("<function=")


def test_completions_and_the_top_level_field(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model="m", prompt=SYSTEM + "\nQuestion: the weather in Rome?\nAnswer:",
        max_tokens=BUDGET, temperature=0, extra_body={"structural_tag": json.dumps(LEGACY)})
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length")
    tagged_spans(choice.text, truncated=choice.finish_reason == "length")


def test_refusals_are_400s_naming_the_path(client: openai.OpenAI) -> None:
    bad_schema = {**LEGACY, "structures": [{**STRUCTURES[0], "schema": {
        "type": "object", "properties": {"city": {"type": "strin"}}}}]}
    cases = [
        (bad_schema, "response_format.structures[0].schema", "invalid JSON Schema"),
        ({**LEGACY, "triggers": ["<function=", "<call>"]}, "response_format.triggers[1]",
         "no tag's begin starts with the trigger '<call>'"),
        ({"type": "structural_tag", "format": {"type": "token", "token": 7}},
         "response_format.format", "format type 'token' is not supported"),
        ({"type": "structural_tag", "format": {"type": "triggered_tags"}},
         "response_format.format.triggers", "must be a non-empty list of strings"),
    ]
    for rf, param, words in cases:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8,
                                               response_format=rf, stream=stream)
            err = e.value.body
            assert isinstance(err, dict), err
            assert err["param"] == param, err
            assert words in err["message"], err
