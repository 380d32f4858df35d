"""Everyday clients against the real server on the embedded model: the ``openai`` SDK's
``parse()``, instructor's JSON / JSON_SCHEMA / TOOLS modes and LangChain's
``with_structured_output`` (json_schema / json_mode / function_calling) each get a parsed object
back for a short prompt and a 3-field Pydantic model, greedy, within 200 tokens. A reply cut by
``max_tokens`` fails the test (each client raises or reports it), as it fails a user.
"""

from __future__ import annotations

from typing import Any, Literal

import instructor
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

pytestmark = pytest.mark.model

MAX_TOKENS = 200
ASK = "Invent a city in France."
# NOTE: a json_object request carries no schema, so the prompt has to name the keys (LangChain
# says so for json_mode; instructor's JSON mode puts the schema into a system message, which
# SmolLM2-135M copies back instead of filling in unless the user message names the keys too).
ASK_JSON_INSTRUCTOR = ("Invent a city in France. Answer in JSON with the keys name, country and "
                       "population (an integer).")
ASK_JSON_LANGCHAIN = "Invent a city in France and reply in JSON: name, country, population."


class City(BaseModel):
    name: str
    country: str
    population: int


def _messages(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def base_url(e2e_server: dict[str, Any]) -> str:
    return str(e2e_server["url"]) + "/v1"


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=300)


def test_sdk_parse(client: openai.OpenAI) -> None:
    completions = client.chat.completions
    parse = completions.parse if hasattr(completions, "parse") else (
        client.beta.chat.completions.parse)
    reply = parse(model="m", messages=_messages(ASK), response_format=City,
                  max_tokens=MAX_TOKENS, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City), choice.message.content


@pytest.mark.parametrize("mode, ask", [
    (instructor.Mode.JSON, ASK_JSON_INSTRUCTOR),
    (instructor.Mode.JSON_SCHEMA, ASK),
    (instructor.Mode.TOOLS, ASK),
], ids=["json", "json_schema", "tools"])
def test_instructor(client: openai.OpenAI, mode: instructor.Mode, ask: str) -> None:
    patched = instructor.from_openai(client, mode=mode)
    city, completion = patched.chat.completions.create_with_completion(
        model="m", response_model=City, messages=_messages(ask), max_tokens=MAX_TOKENS,
        temperature=0, max_retries=0)  # one attempt: the first reply must parse
    assert isinstance(city, City)
    assert completion.choices[0].finish_reason in ("stop", "tool_calls")


@pytest.mark.parametrize("method, ask", [
    ("json_schema", ASK),
    ("json_mode", ASK_JSON_LANGCHAIN),
    ("function_calling", ASK),
])
def test_langchain_with_structured_output(
        base_url: str, method: Literal["json_schema", "json_mode", "function_calling"],
        ask: str) -> None:
    llm = ChatOpenAI(model="m", base_url=base_url, api_key="x",  # type: ignore[arg-type]
                     temperature=0, max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
                     max_retries=0, timeout=300)
    out = llm.with_structured_output(City, method=method, include_raw=True).invoke(ask)
    raw = out["raw"]
    detail = (raw.content, raw.tool_calls, raw.response_metadata.get("finish_reason"))
    assert out["parsing_error"] is None, detail
    assert isinstance(out["parsed"], City), detail
    assert raw.response_metadata.get("finish_reason") in ("stop", "tool_calls"), detail
