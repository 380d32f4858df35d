"""The agent tool-calling and plain-chat workloads of ``bench_serving.py``: three tools, the
requests that call them (one user request each, every second one after a finished earlier turn with
another tool's call and result), and the chat prompts."""

from __future__ import annotations

import json
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the web and return the top results.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query", "max_results"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an e-mail.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string", "description": "Recipient e-mail address"},
            "subject": {"type": "string"},
            "body": {"type": "string"}},
            "required": ["to", "subject", "body"], "additionalProperties": False}}},
]
TOOL_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

_CITIES = ["Paris", "Tokyo", "Denver", "Cairo", "Oslo", "Lima", "Pune", "Turin"]
_TOPICS = ["the history of the bicycle", "vegan lasagna recipes", "Python asyncio tutorials",
           "the tallest mountains in Europe", "how solar panels work", "jazz festivals in 2026",
           "cheap flights to Lisbon", "the rules of cricket"]
_PEOPLE = [("anna@example.com", "the budget review"), ("li.wei@example.com", "the team lunch"),
           ("omar@example.com", "the contract renewal"), ("greta@example.com", "the server outage"),
           ("ravi@example.com", "the conference talk"), ("sara@example.com", "the new office"),
           ("tom@example.com", "the quarterly report"), ("elena@example.com", "the design review")]

CHAT = ["What is the capital of France, and why is it famous?",
         "Explain photosynthesis in a few sentences.",
         "Give me three tips for writing clean Python code.",
         "Why is the sky blue?",
         "Write a short poem about the sea.",
         "What are the benefits of regular exercise?",
         "How does a refrigerator keep food cold?",
         "Describe a good breakfast for a busy morning."]

AGENT_SYSTEM = ("You are a helpful assistant with tools. Call exactly one tool to serve the "
                "user's request.")


def _ask(i: int) -> str:
    k = i // 3
    if i % 3 == 0:
        unit = "fahrenheit" if k % 2 else "celsius"
        return f"What's the weather in {_CITIES[k % len(_CITIES)]} right now, in {unit}?"
    if i % 3 == 1:
        return f"Search the web for {_TOPICS[k % len(_TOPICS)]} and give me the top 5 results."
    to, about = _PEOPLE[k % len(_PEOPLE)]
    return f"Send an e-mail to {to} about {about}; say I will be 10 minutes late."


def _prior_turn(i: int, j: int) -> list[dict[str, Any]]:
    """A finished earlier turn for request ``i``: user request ``j``, the assistant's tool call
    for it (OpenAI format: ``tool_calls`` with an id and a JSON-string ``arguments``) and the
    ``tool`` message with its result."""
    k = j // 3
    call_id = f"call_{i:04d}{j % 3}prior"
    fargs: dict[str, Any]
    result: dict[str, Any]
    if j % 3 == 0:
        city = _CITIES[k % len(_CITIES)]
        unit = "fahrenheit" if k % 2 else "celsius"
        name, fargs = "get_weather", {"city": city, "unit": unit}
        result = {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit,
                  "conditions": "partly cloudy"}
    elif j % 3 == 1:
        topic = _TOPICS[k % len(_TOPICS)]
        name, fargs = "search_web", {"query": topic, "max_results": 5}
        result = {"results": [{"title": f"{topic.capitalize()} ({n})",
                               "url": f"https://example.com/{k}/{n}"} for n in range(1, 4)]}
    else:
        to, about = _PEOPLE[k % len(_PEOPLE)]
        name = "send_email"
        fargs = {"to": to, "subject": about.capitalize(),
                 "body": "I will be 10 minutes late."}
        result = {"status": "sent", "to": to}
    return [{"role": "user", "content": _ask(j)},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": name, "arguments": json.dumps(fargs)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}]


def tool_messages(i: int, multi_turn: bool = False) -> list[dict[str, Any]]:
    """Request ``i`` of the tools workload; with ``multi_turn`` an earlier, finished turn (a
    different tool's request, call and result) comes before the new user request."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": AGENT_SYSTEM}]
    if multi_turn:
        msgs += _prior_turn(i, i + 4)  # (i + 4) % 3 != i % 3: another tool than this request's
    msgs.append({"role": "user", "content": _ask(i)})
    return msgs
