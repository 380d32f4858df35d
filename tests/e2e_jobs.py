"""Test helper for tests/test_server_e2e.py: the generating requests it fires together when the
module starts (so the engine batches them), and the constants and models its checks use."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import openai
from pydantic import BaseModel, Field
from server_helpers import ROOT

#: The schemas of schemas/ are checked end to end in a rotating window (every schema of the corpus
#: but the ``hard`` ones, refused on purpose; half response_format, half tool calls, fixed per
#: schema): the corpus is dealt into windows of at most this many schemas, and a run checks one
#: (see :func:`schema_window`), so consecutive days cover all of it. All at once do not fit in one
#: batch of the 2-core machine (every reply ran past the client's 300 s timeout).
SCHEMA_WINDOW = int(os.environ.get("GRAMMARSERVE_E2E_SCHEMAS", "8"))
#: Generous, not infinite: a schema reply cut by it fails the test.
SCHEMA_MAX_TOKENS = 256
#: Schema replies that still run into SCHEMA_MAX_TOKENS today (greedy, SmolLM2-135M, this prompt
#: without an example; the request kind is fixed per schema, see schema_job): 16 of the 59, found
#: when the test went from the 8 shortest schemas to the whole corpus (2026-12-02). Strict: the
#: mark goes once a reply completes.
_STRING = "a string value runs until max_tokens (the reply is cut inside it)"
SCHEMA_CUT = {
    "comment_thread": "the tool-call reply nests replies until max_tokens",
    "medical_note": "the tool-call reply repeats one diagnosis item until max_tokens",
    "receipt": "the reply adds line items until max_tokens",
    "pydantic_tree": "the reply nests children until max_tokens",
    "send_email": "a string value of the tool-call reply repeats '.to' until max_tokens",
    **{name: _STRING for name in (
        "contract_clause", "create_github_issue", "event", "meeting_minutes", "org_chart",
        "pydantic_meeting_strict", "pydantic_order", "recipe", "search_web", "seo_metadata",
        "user_signup")},
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 20}}}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
GREETING = [{"role": "system", "content": "You are a terse assistant. " * 12},
            {"role": "user", "content": "Name the capital of France."}]


class Address(BaseModel):
    city: str = Field(max_length=20)
    country: Literal["FR", "DE", "US"]


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    address: Address


class Weather(BaseModel):
    city: str = Field(max_length=20)
    unit: Literal["C", "F"]


class Search(BaseModel):
    """instructor-style: a raw (non-strict) pydantic schema with defaults and optionals."""

    query: str = Field(max_length=24)
    limit: int = Field(default=5, ge=1, le=10)
    lang: str | None = Field(default=None, max_length=5)


def sse(url: str, body: dict[str, Any]) -> list[Any]:
    """Raw SSE events of a streamed request (``[DONE]`` kept as a string)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.headers.get_content_type() == "text/event-stream"
        for line in r.read().decode().split("\n\n"):
            if line:
                assert line.startswith("data: ")
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def schema_corpus() -> list[dict[str, Any]]:
    """The schemas of schemas/ checked end to end, by name (the ``hard`` category is left out:
    its keywords are refused on purpose, schemas/README.md)."""
    items = [json.loads(p.read_text()) for p in sorted((ROOT / "schemas").glob("*.json"))]
    return [s for s in items if s["category"] != "hard"]


def schema_windows(size: int = SCHEMA_WINDOW) -> list[list[int]]:
    """The corpus (indexes into :func:`schema_corpus`) dealt into ``ceil(n / size)`` windows:
    sorted by the length of the first example instance, then round robin, so every window
    mixes short and long replies (its batch takes about as long as any other's)."""
    items = schema_corpus()
    n = -(-len(items) // size)
    by_length = sorted(range(len(items)),
                       key=lambda i: (len(json.dumps(items[i]["valid"][0])), items[i]["name"]))
    return [sorted(by_length[w::n]) for w in range(n)]


def schema_window(windows: int) -> int:
    """The window this run checks: ``GRAMMARSERVE_E2E_WINDOW`` if set, else the UTC day number
    modulo ``windows`` (every window once in ``windows`` consecutive days; reruns on one day
    check the same schemas). The test ids name it (``window3of8-address``)."""
    if (env := os.environ.get("GRAMMARSERVE_E2E_WINDOW")) is not None:
        if not env.isdigit() or int(env) >= windows:
            raise ValueError(f"GRAMMARSERVE_E2E_WINDOW must be 0..{windows - 1}, got {env!r}")
        return int(env)
    return int(time.time() // 86400) % windows


def e2e_schemas() -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """This run's window, named (``"window3of8"``), and its schemas with their index into
    :func:`schema_corpus` (which fixes each schema's request kind, see :func:`schema_job`)."""
    windows = schema_windows()
    w = schema_window(len(windows))
    items = schema_corpus()
    return f"window{w}of{len(windows)}", [(i, items[i]) for i in windows[w]]


def fire_all(url: str, client: openai.OpenAI) -> dict[str, Future[Any]]:
    """Every generating request of tests/test_server_e2e.py, started at once (one thread each)
    so the engine batches them; the futures by name."""
    chat = client.chat.completions
    jobs: dict[str, Callable[[], Any]] = {
        "plain": lambda: chat.create(model="m", messages=GREETING, max_tokens=8, temperature=0),
        "plain_sse": lambda: sse(url + "/v1/chat/completions", {
            "model": "m", "messages": GREETING, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}),
        "parse": lambda: chat.parse(model="m", response_format=Person, max_tokens=120,
                                    temperature=0, messages=[{"role": "user", "content":
                                    "Invent a person living in Berlin."}]),
        "tool_required": lambda: chat.create(model="m", messages=ASK_WEATHER, tools=[WEATHER],
                                             tool_choice="required", max_tokens=60,
                                             temperature=0, parallel_tool_calls=False),
        "tool_required_sdk_stream": lambda: sdk_stream(client, messages=ASK_WEATHER,
                                                        tools=[WEATHER], tool_choice="required",
                                                        max_tokens=60, temperature=0,
                                                        parallel_tool_calls=False),
        "tool_required_sse": lambda: sse(url + "/v1/chat/completions", {
            "model": "m", "messages": ASK_WEATHER, "tools": [WEATHER, TIME],
            "tool_choice": "required", "max_tokens": 60, "temperature": 0, "stream": True,
            "parallel_tool_calls": False, "stream_options": {"include_usage": True}}),
        "tool_auto": lambda: chat.create(model="m", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                         max_tokens=60, temperature=0),
        "tool_named_parse": lambda: chat.parse(
            model="m", messages=ASK_WEATHER, tools=[openai.pydantic_function_tool(Weather)],
            tool_choice={"type": "function", "function": {"name": "Weather"}}, max_tokens=60,
            temperature=0),
        "tool_nonstrict_named": lambda: chat.create(
            model="m", messages=[{"role": "user", "content": "Search the web for llamas."}],
            tools=[{"type": "function", "function": {"name": "Search", "parameters":
                                                     Search.model_json_schema()}}],
            tool_choice={"type": "function", "function": {"name": "Search"}}, max_tokens=60,
            temperature=0),
        "seeded_a": lambda: chat.create(model="m", messages=GREETING, n=2, seed=3,
                                        temperature=0.9, max_tokens=6),
        "seeded_b": lambda: chat.create(model="m", messages=GREETING, n=2, seed=3,
                                        temperature=0.9, max_tokens=6),
        "completions": lambda: client.completions.create(
            model="m", prompt=["The capital of France is", "1, 2, 3,"], max_tokens=6,
            temperature=0),
        "completions_ids": lambda: client.completions.create(
            model="m", prompt=[[504, 3575, 282, 4649, 314]], max_tokens=4, temperature=0,
            echo=True),
        "completions_regex": lambda: client.completions.create(
            model="m", prompt="Call me at", max_tokens=16, temperature=0,
            extra_body={"regex": r" [0-9]{3}-[0-9]{4}"}),
        "chat_choice": lambda: chat.create(model="m", messages=[{"role": "user", "content":
                                           "Is the sky blue? Answer yes or no."}], max_tokens=4,
                                           temperature=0, extra_body={"choice": ["yes", "no"]}),
        "completions_sse": lambda: sse(url + "/v1/completions", {
            "model": "m", "prompt": "The capital of France is", "max_tokens": 6,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}),
    }
    for i, item in e2e_schemas()[1]:
        jobs[f"schema_{i}"] = schema_job(client, item, i)
    jobs["logprobs"] = lambda: chat.create(model="m", messages=GREETING, max_tokens=4,
                                           temperature=0, logprobs=True, top_logprobs=0)
    for i in range(max(0, 32 - len(jobs))):  # small mixed requests up to 32 at once
        jobs[f"mixed_{i}"] = mixed_job(client, url, i)
    pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="e2e")
    futures = {name: pool.submit(fn) for name, fn in jobs.items()}
    pool.shutdown(wait=False)
    return futures


def mixed_job(client: openai.OpenAI, url: str, i: int) -> Callable[[], Any]:
    messages = [{"role": "user", "content": f"Count from {i} to {i + 5}."}]
    if i % 3 == 0:
        return lambda: sse(url + "/v1/chat/completions", {
            "model": "m", "messages": messages, "max_tokens": 4, "stream": True, "seed": i})
    if i % 3 == 1:
        return lambda: client.chat.completions.create(
            model="m", messages=messages, max_tokens=6, extra_body={"regex": "[0-9]+( [0-9]+)*"})
    return lambda: client.completions.create(model="m", prompt=f"{i}, {i + 1},", max_tokens=4,
                                             seed=i, temperature=0.7)


def sdk_stream(client: openai.OpenAI, **kw: Any) -> Any:
    with client.chat.completions.stream(model="m", **kw) as stream:
        return stream.get_final_completion()


def schema_job(client: openai.OpenAI, item: dict[str, Any], i: int) -> Callable[[], Any]:
    """The request of schema ``item``, whose index into :func:`schema_corpus` is ``i``. Even:
    response_format json_schema; odd: a required tool call (strict flag alternating, but only
    where the schema passes strict mode). Tool parameters must be an object schema
    (OpenAI's rule), so a schema whose root is not ``type: object`` is a response_format."""
    strict = bool(item["strict_compatible"]) and i % 4 < 2
    prompt = [{"role": "user", "content": f"{item['description']} Reply with one short, "
               f"realistic example as JSON matching this schema: {json.dumps(item['schema'])}"}]
    if i % 2 == 0 or item["schema"].get("type") != "object":
        fmt = {"type": "json_schema", "json_schema": {"name": item["name"][:64],
                                                      "schema": item["schema"], "strict": strict}}
        return lambda: client.chat.completions.create(model="m", messages=prompt,
                                                      response_format=fmt,  # type: ignore[arg-type]
                                                      max_tokens=SCHEMA_MAX_TOKENS, temperature=0)
    tool = {"type": "function", "function": {"name": "emit", "parameters": item["schema"],
                                             "strict": strict}}
    return lambda: client.chat.completions.create(model="m", messages=prompt, tools=[tool],
                                                  tool_choice="required",
                                                  max_tokens=SCHEMA_MAX_TOKENS,
                                                  temperature=0, parallel_tool_calls=False)


def finish_chunks(events: list[Any]) -> list[dict[str, Any]]:
    return [c for e in events if isinstance(e, dict) for c in e.get("choices", [])
            if c.get("finish_reason")]
