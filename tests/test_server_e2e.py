"""End to end: the real server (``python -m grammarserve.cli serve --model default``) on a free
port, driven with the official ``openai`` SDK and raw HTTP: chat, streaming, structured outputs,
tool calls, completions, metrics, client disconnects. (Bad requests, other routes and fuzzing:
tests/test_server_errors_e2e.py.)

The generating requests are fired together when the module starts (one thread each, see
tests/e2e_jobs.py), so the engine batches them and the module costs about one long request; each
test then checks its own replies.
"""

from __future__ import annotations

import http.client
import json
import re
from concurrent.futures import Future
from typing import Any

import jsonschema
import openai
import pytest
from e2e_jobs import (
    ASK_WEATHER,
    GREETING,
    SCHEMA_CUT,
    TIME,
    WEATHER,
    Address,
    Person,
    Search,
    Weather,
    e2e_schemas,
    finish_chunks,
    fire_all,
    schema_corpus,
)
from grammarserve_kernels.quant_q8 import ISAS, cpu_isa
from server_helpers import http_get, http_post
from waiting import wait_until

pytestmark = pytest.mark.model


# -- server and client -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(e2e_server: dict[str, Any]) -> dict[str, Any]:
    return e2e_server


@pytest.fixture(scope="module")
def client(server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


@pytest.fixture(scope="module")
def fired(server: dict[str, Any], client: openai.OpenAI) -> dict[str, Future[Any]]:
    """Every generating request, started at once so the engine batches them."""
    return fire_all(server["url"], client)


# -- plain chat, streaming, usage, cache -----------------------------------------------------------
def test_health_was_503_while_loading_then_200(server: dict[str, Any]) -> None:
    assert server["health"][-1] == 200
    assert set(server["health"]) <= {503, 200}
    assert http_get(server["url"] + "/health") == (200, b'{"status":"ok"}')


def test_streamed_text_equals_non_streamed(fired: dict[str, Future[Any]]) -> None:
    plain = fired["plain"].result()
    events = fired["plain_sse"].result()
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    chunks = events[:-2]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == plain.choices[0].message.content and text
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum("role" in c["choices"][0]["delta"] for c in chunks) == 1
    finishes = finish_chunks(events)
    assert len(finishes) == 1 and finishes[0]["finish_reason"] == plain.choices[0].finish_reason
    assert all(c["usage"] is None for c in chunks) and all(
        c["object"] == "chat.completion.chunk" for c in events[:-1])
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == plain.usage.completion_tokens == 8
    assert usage["prompt_tokens"] == plain.usage.prompt_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    assert plain.id.startswith("chatcmpl-") and plain.object == "chat.completion"


def test_second_request_with_the_same_prefix_reports_cached_tokens(
        fired: dict[str, Future[Any]], client: openai.OpenAI) -> None:
    fired["plain"].result()
    again = client.chat.completions.create(model="m", messages=GREETING, max_tokens=1,
                                           temperature=0)
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens >= again.usage.prompt_tokens - 2 > 50
    isolated = client.chat.completions.create(model="m", messages=GREETING, max_tokens=1,
                                              extra_body={"cache_namespace": "tenant-b"})
    assert isolated.usage.prompt_tokens_details.cached_tokens == 0


def test_seeded_sampling_is_reproducible(fired: dict[str, Future[Any]]) -> None:
    a, b = fired["seeded_a"].result(), fired["seeded_b"].result()
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == 12


def test_thirty_two_concurrent_mixed_requests_complete(fired: dict[str, Future[Any]]) -> None:
    assert len(fired) >= 32
    for name, future in fired.items():
        assert future.exception() is None, name
    for i in range(sum(name.startswith("mixed_") for name in fired)):
        reply = fired[f"mixed_{i}"].result()
        if i % 3 == 0:
            assert reply[-1] == "[DONE]" and len(finish_chunks(reply)) == 1
        elif i % 3 == 1:
            content = reply.choices[0].message.content
            assert re.fullmatch(r"[0-9]+( [0-9]+)*", content) or (
                reply.choices[0].finish_reason == "length" and re.fullmatch(r"[0-9 ]*", content))
        else:
            assert reply.usage.completion_tokens == 4


def test_logprobs(fired: dict[str, Future[Any]]) -> None:
    choice = fired["logprobs"].result().choices[0]
    tokens = choice.logprobs.content
    assert len(tokens) == 4 and all(t.logprob <= 0 and t.top_logprobs == [] for t in tokens)
    assert b"".join(bytes(t.bytes) for t in tokens).decode() == choice.message.content
    assert fired["plain"].result().choices[0].logprobs is None


# -- structured outputs ----------------------------------------------------------------------------
def test_parse_with_nested_pydantic_model(fired: dict[str, Future[Any]]) -> None:
    reply = fired["parse"].result()
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    person = choice.message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert person.address.country in ("FR", "DE", "US") and 0 <= person.age <= 120


def test_choice_and_regex_extensions(fired: dict[str, Future[Any]]) -> None:
    assert fired["chat_choice"].result().choices[0].message.content in ("yes", "no")
    text = fired["completions_regex"].result().choices[0].text
    assert re.fullmatch(r" [0-9]{3}-[0-9]{4}", text), text


_WINDOW, _SCHEMAS = e2e_schemas()  # this run's window of the rotation over schemas/


@pytest.mark.parametrize("i", [
    pytest.param(i, id=f"{_WINDOW}-{item['name']}", marks=[pytest.mark.xfail(
        strict=True, reason=SCHEMA_CUT[item["name"]])] if item["name"] in SCHEMA_CUT else [])
    for i, item in _SCHEMAS])
def test_schema_reply_completes_and_validates(fired: dict[str, Future[Any]], i: int) -> None:
    """A rotating window of schemas/ (the id names it: ``window3of8-address``; every schema in
    as many consecutive days as there are windows, see tests/e2e_jobs.py). Even corpus index:
    response_format, odd: a required tool call (a response_format if the schema is not an
    object schema, which tool parameters must be). A reply cut by max_tokens fails."""
    item = schema_corpus()[i]
    choice = fired[f"schema_{i}"].result().choices[0]
    validator = jsonschema.Draft202012Validator(
        item["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    if i % 2 == 0 or item["schema"].get("type") != "object":
        assert choice.finish_reason == "stop", choice
        validator.validate(json.loads(choice.message.content))
    else:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "emit" and call.id.startswith("call_")
        validator.validate(json.loads(call.function.arguments))
        assert choice.message.content is None


# -- tool calls ------------------------------------------------------------------------------------
def _calls(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def test_tool_choice_required(fired: dict[str, Future[Any]]) -> None:
    reply = fired["tool_required"].result()
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [(name, args)] = _calls(choice.message)
    assert name == "get_weather" and args["unit"] in ("C", "F")
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    streamed = fired["tool_required_sdk_stream"].result().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert streamed.message.tool_calls[0].function.parsed_arguments == args
    assert not streamed.message.content


def test_streamed_tool_call_chunks(fired: dict[str, Future[Any]]) -> None:
    events = fired["tool_required_sse"].result()
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    deltas = [c["choices"][0]["delta"] for c in events[:-2]]
    assert deltas[0]["role"] == "assistant" and deltas[0]["content"] is None
    parts = [tc for d in deltas for tc in d.get("tool_calls", [])]
    heads = [tc for tc in parts if "id" in tc]
    assert len(heads) == 1 and heads[0]["id"].startswith("call_")
    assert heads[0]["type"] == "function" and heads[0]["function"]["arguments"] == ""
    assert all(tc["index"] == 0 for tc in parts)
    assert all("name" not in tc["function"] for tc in parts if "id" not in tc)
    arguments = "".join(tc["function"].get("arguments", "") for tc in parts)
    assert len([tc for tc in parts if "id" not in tc]) > 1  # arguments arrive in pieces
    json.loads(arguments)
    assert not any("content" in d and d["content"] for d in deltas)
    assert [c["finish_reason"] for c in finish_chunks(events)] == ["tool_calls"]


def test_tool_choice_auto(fired: dict[str, Future[Any]]) -> None:
    choice = fired["tool_auto"].result().choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for name, args in _calls(choice.message):
            schema = {"get_weather": WEATHER, "get_time": TIME}[name]["function"]["parameters"]
            jsonschema.validate(args, schema)
    else:
        assert choice.finish_reason in ("stop", "length")
    assert "<tool_call>" not in (choice.message.content or "")


def test_named_strict_tool_parses_arguments(fired: dict[str, Future[Any]]) -> None:
    choice = fired["tool_named_parse"].result().choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "Weather" and isinstance(call.function.parsed_arguments, Weather)


def test_non_strict_tool_arguments_are_constrained(fired: dict[str, Future[Any]]) -> None:
    choice = fired["tool_nonstrict_named"].result().choices[0]
    assert choice.finish_reason == "tool_calls"
    [(name, args)] = _calls(choice.message)
    assert name == "Search"
    jsonschema.validate(args, Search.model_json_schema())
    Search.model_validate(args)


def test_tool_history_round_trip(client: openai.OpenAI, fired: dict[str, Future[Any]]) -> None:
    first = fired["tool_required"].result().choices[0].message
    call = first.tool_calls[0]
    reply = client.chat.completions.create(model="m", max_tokens=4, temperature=0, messages=[
        *ASK_WEATHER, first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}],
        tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


# -- completions -----------------------------------------------------------------------------------
def test_completions(fired: dict[str, Future[Any]]) -> None:
    reply = fired["completions"].result()
    assert reply.object == "text_completion" and [c.index for c in reply.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage.completion_tokens == 12
    echoed = fired["completions_ids"].result().choices[0].text
    assert echoed.startswith("The capital of France")
    events = fired["completions_sse"].result()
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    streamed = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert streamed == reply.choices[0].text
    assert len(finish_chunks(events)) == 1


def test_metrics(server: dict[str, Any], fired: dict[str, Future[Any]]) -> None:
    for f in fired.values():
        f.result()
    bad = http_post(server["url"] + "/v1/chat/completions", {"model": "m", "messages": []})
    assert bad[0] == 400  # one refused request, counted by route and status below
    status, body = http_get(server["url"] + "/metrics")
    text = body.decode()
    assert status == 200

    def value(name: str) -> float:
        m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        assert m, name
        return float(m.group(1))

    assert value("grammarserve_time_to_first_token_seconds_count") >= len(fired)
    assert value("grammarserve_inter_token_latency_seconds_count") > 0
    assert value("grammarserve_prompt_tokens_total") > 1000
    assert value("grammarserve_generated_tokens_total") > 100
    assert value("grammarserve_cached_prompt_tokens_total") > 0
    assert value("grammarserve_running_requests") == 0
    assert value("grammarserve_waiting_requests") == 0
    assert 0 < value("grammarserve_kv_usage_ratio") < 1
    assert value("grammarserve_grammar_compile_seconds_total") > 0
    assert value("grammarserve_grammar_cache_hits_total") >= 0
    assert value("grammarserve_jump_forward_tokens_total") > 0
    assert value("grammarserve_loop_guard_cuts_total") >= 0
    assert value("grammarserve_server_grammar_refused_total") >= 0  # front end only there
    assert value("grammarserve_prefill_cap_tokens") >= 0
    built = cpu_isa()  # the int8 kernels' build here, measured at the server's start
    assert value("grammarserve_cpu_kernel_isa_level") == (ISAS.index(built) + 1 if built else 0)
    assert (value("grammarserve_cpu_gemm_gops") > 0) is (built is not None)
    assert 'grammarserve_http_requests_total{route="/v1/chat/completions",status="400"}' in text


def _metric(server: dict[str, Any], name: str) -> float:
    text = http_get(server["url"] + "/metrics")[1].decode()
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, name
    return float(m.group(1))


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_the_request(server: dict[str, Any], stream: bool,
                                              fired: dict[str, Future[Any]]) -> None:
    for f in fired.values():
        f.result()
    aborted = _metric(server, "grammarserve_aborted_requests_total")
    host, port = server["url"].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 4000, "stream": stream, "ignore_eos": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200
        resp.fp.readline()  # the first event
    wait_until(lambda: _metric(server, "grammarserve_running_requests") >= 1, 300,
               "the request to run")
    conn.sock.close()  # type: ignore[union-attr]
    conn.close()
    # NOTE: the engine counts the abort itself; the wait bounds a hang, not the work (the
    # request would run for minutes if the disconnect were missed: 4000 tokens, no EOS).
    wait_until(lambda: _metric(server, "grammarserve_aborted_requests_total") > aborted, 300,
               "the request to be aborted")
    assert _metric(server, "grammarserve_aborted_requests_total") == aborted + 1
    wait_until(lambda: _metric(server, "grammarserve_requests_in_flight") == 0, 300,
               "the server to release the request")
    assert _metric(server, "grammarserve_running_requests") == 0
