"""Tokens a one-call tool reply spends after its call, per model family's format.

For each family's vendored template (``tests/data/templates``), the in-process engine on the
embedded model answers a few questions with ``tool_choice`` naming a tool and with
``required`` + ``parallel_tool_calls: false`` (greedy). Prints one JSON line: per format, the
replies, how many hold a valid call (jsonschema) and end with ``finish_reason: tool_calls``, the
completion tokens in all, and the tokens after the call's last character (whitespace the model
wrote before the reply could end).

    .venv/bin/python benchmarks/bench_tool_tail.py

(``package`` in the line says which ``grammarserve`` ran: the installed one unless
``PYTHONPATH`` names another checkout.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name, revision

import grammarserve
from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.models.loader import load_tokenizer, resolve_model_folder
from grammarserve.openai.context import ModelContext
from grammarserve.openai.prepare import prepare_chat
from grammarserve.openai.protocol import ChatCompletionRequest
from grammarserve.openai.replies import completion_body

TEMPLATES = Path(__file__).resolve().parents[1] / "tests" / "data" / "templates"
FAMILIES = {"hermes": "Qwen-Qwen2.5-7B-Instruct.jinja", "qwen3_coder": "Qwen3-Coder.jinja",
            "llama3_json": "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            "deepseek_v31": "deepseek-ai-DeepSeek-V3.1.jinja",
            "pythonic": "grammarserve-pythonic.jinja"}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"},
                                           "days": {"type": "integer", "minimum": 1,
                                                    "maximum": 14}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS,
                                           "description": "The weather forecast of a city."}},
         {"type": "function", "function": {
             "name": "get_time", "description": "The time in a city.",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"], "additionalProperties": False}}}]
QUESTIONS = ["What is the weather in Rome for 3 days?", "Forecast for Oslo, next week?",
             "Will it rain in Lima in the next 2 days?", "Weather in Cairo for 5 days please."]
CHOICES: list[Any] = [{"type": "function", "function": {"name": "get_weather"}}, "required"]


def _one(engine: Engine, ctx: ModelContext, question: str, choice: Any) -> dict[str, Any]:
    req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": question}], "tools": TOOLS,
        "tool_choice": choice, "parallel_tool_calls": False, "max_tokens": 200,
        "temperature": 0})
    prep = prepare_chat(ctx, req)
    prep.check_constraint()
    engine.add_request(prep.id, prep.prompts[0], prep.params[0])
    last = None
    while engine.has_unfinished():
        for out in engine.step():
            last = out
    assert last is not None
    body = completion_body(ctx, prep, [last])
    choice_out = body["choices"][0]
    calls = choice_out["message"].get("tool_calls") or []
    valid = choice_out["finish_reason"] == "tool_calls" and len(calls) == 1
    if valid:
        try:
            args = json.loads(calls[0]["function"]["arguments"])
            schema = next(t["function"]["parameters"] for t in TOOLS
                          if t["function"]["name"] == calls[0]["function"]["name"])
            jsonschema.validate(args, schema)
        except (ValueError, jsonschema.ValidationError):
            valid = False
    ids = list(last.token_ids)
    while ids and ids[-1] == ctx.tokenizer.eos_token_id:
        ids.pop()
    tail_ids = 0
    while tail_ids < len(ids) and not ctx.tokenizer.decode([ids[-1 - tail_ids]]).strip():
        tail_ids += 1
    return {"valid": valid, "tokens": len(last.token_ids), "tail_tokens": tail_ids}


def main() -> None:
    folder = resolve_model_folder("default")
    engine = Engine(EngineConfig(device="cpu", kv_cache_tokens=8192, max_num_reqs=8))
    out: dict[str, Any] = {}
    start = time.perf_counter()
    for fmt, template in FAMILIES.items():
        tok = load_tokenizer(folder, str(TEMPLATES / template))
        ctx = ModelContext.create(tok, engine.grammar.compiler, max_model_len=engine.max_model_len,
                                  max_n=4, model_name="m")
        runs = [_one(engine, ctx, q, c) for q in QUESTIONS for c in CHOICES]
        out[fmt] = {"replies": len(runs), "valid": sum(r["valid"] for r in runs),
                    "tokens": sum(r["tokens"] for r in runs),
                    "tail_tokens": sum(r["tail_tokens"] for r in runs)}
    print(json.dumps({"bench": "tool_tail", "git": revision(), "cpu": cpu_name(),
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "package": str(Path(grammarserve.__file__).parent),
                      "wall_s": round(time.perf_counter() - start, 1), "formats": out}))


if __name__ == "__main__":
    main()
