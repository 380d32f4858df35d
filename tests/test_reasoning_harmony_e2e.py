"""gpt-oss's analysis channel as the reasoning span, end to end: the real server on the
embedded model with gpt-oss's chat template. With the SmolLM2 tokenizer the harmony markers
are plain text (several tokens each); the mechanics are the same: the analysis channel is
free, its budget closes it (``<|end|>``), ``<|start|>assistant<|channel|>final<|message|>``
is forced, and the final channel holds JSON valid against the ``response_format``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from server_helpers import running_server

pytestmark = pytest.mark.model

TEMPLATE = Path(__file__).parent / "data" / "templates" / "openai-gpt-oss-120b.jinja"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["name", "population"], "additionalProperties": False}


def test_the_analysis_channel_then_the_final_json(tmp_path: Path) -> None:
    with running_server(tmp_path / "server.log", "--kv-cache-tokens", "8192",
                        "--chat-template", str(TEMPLATE)) as server:
        client: Any = openai.OpenAI(base_url=server["url"] + "/v1", api_key="x",
                                    max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model="m", temperature=0, max_tokens=120, reasoning_effort="low",
            messages=[{"role": "user", "content": "Invent a city, as JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "City", "schema": SCHEMA}},
            extra_body={"thinking_token_budget": 16})
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    reasoning = message.reasoning_content
    assert reasoning and "<|channel|>" not in reasoning and "<|end|>" not in reasoning
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert r.usage.completion_tokens_details.reasoning_tokens >= 16
