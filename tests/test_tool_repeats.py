"""Ending a reply at a repeated tool call: the guard on text (both formats, any chunking), the
engine's stopping logic on a byte-level tokenizer (nothing of the repeat is released, streamed
deltas add up to the final text), and end to end on the embedded model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.constraints import Constraint
from grammarserve.engine.detokenizer import IncrementalDetokenizer
from grammarserve.engine.request import Req
from grammarserve.engine.stopping import append_token
from grammarserve.fsm.repeats import CallRepeatGuard
from grammarserve.sampling_params import SamplingParams

A = '<tool_call>\n{"name": "f", "arguments": {"x": "a }</tool_call>\\" {"}}\n</tool_call>'
B = '<tool_call>\n{"name": "f", "arguments": {"x": "b"}}\n</tool_call>'
HERMES = "Let me see." + A + "\n" + B + "\n" + A + "\n" + B
ARRAY = ('[{"name": "f", "parameters": {"x": "]}\\""}}, {"name": "g", "parameters": {}}, '
         '{"name": "f", "parameters": {"x": "]}\\""}}]')


def feed_in_chunks(fmt: str, text: str, size: int) -> tuple[int | None, list[int]]:
    guard = CallRepeatGuard(fmt)
    held = []
    for i in range(0, len(text), size):
        cut = guard.feed(text[i:i + size])
        held.append(guard.held)
        if cut is not None:
            return cut, held
    return None, held


@pytest.mark.parametrize("size", [1, 2, 5, 13, 1000])
def test_guard_cuts_after_the_call_before_the_repeat(size: int) -> None:
    cut, _ = feed_in_chunks("hermes", HERMES, size)
    assert cut is not None and HERMES[:cut] == "Let me see." + A + "\n" + B
    cut, _ = feed_in_chunks("json_array", ARRAY, size)
    assert cut is not None and ARRAY[:cut] == ARRAY[:ARRAY.index(', {"name": "f"', 10)]


def test_guard_holds_only_what_may_become_a_repeat() -> None:
    guard = CallRepeatGuard("hermes")
    assert guard.feed("Hi " + A[:20]) is None and guard.held == 0  # no complete call yet
    assert guard.feed(A[20:]) is None and guard.held == 0
    assert guard.feed("\n<tool_call>\n{\"name\": \"f\"") is None
    assert guard.held == len("\n<tool_call>\n{\"name\": \"f\"")  # a prefix of A so far
    assert guard.feed(', "arguments": {"x": "b') is None and guard.held == 0  # diverged
    assert guard.feed('"}}\n</tool_call>\n') is None and guard.held == 1
    assert guard.calls == [A, B]
    array = CallRepeatGuard("json_array")
    assert array.feed('[{"name": "g", "parameters": {}}, {"na') is None and array.held == 6
    assert array.feed('me": "g", "parameters": {"a"') is None and array.held == 0
    assert array.feed(': 1}}') is None and array.held == 0  # a new call closed: nothing after it
    assert array.feed(', ') is None and array.held == 2
    assert array.feed(']') is None and array.held == 0  # the array closed: no call can follow


def test_guard_without_repeats_never_cuts() -> None:
    calls = [B.replace('"b"', f'"{i}"') for i in range(4)]
    assert feed_in_chunks("hermes", "\n".join(calls) + "\n", 3)[0] is None
    assert feed_in_chunks("hermes", "no calls at all, <tool but no trigger", 1) == (None, [0] * 37)
    with pytest.raises(ValueError, match="format"):
        CallRepeatGuard("xml")


# -- the engine's stopping logic -----------------------------------------------------------------
def _req(tokenizer: Any, fmt: str, max_tokens: int = 1000) -> Req:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, constraint=Constraint.tool_calls(
        tools, "required", tool_format=fmt))
    req = Req("r", [1], params, IncrementalDetokenizer(tokenizer), arrival=0)
    req.repeat_guard = CallRepeatGuard(fmt)
    return req


def _generate(req: Req, tokenizer: Any, text: str) -> list[str]:
    """Append ``text`` token by token as the engine does; returns the released deltas."""
    deltas = []
    for tok in tokenizer.encode(text, add_special_tokens=False):
        append_token(req, tok, 0.0, eos_ids=frozenset({0}), max_model_len=10_000)
        deltas.append(req.pending_text)
        req.pending_text = ""
        if req.finish_reason is not None:
            break
    return deltas


@pytest.mark.parametrize(("fmt", "text", "kept"), [
    ("hermes", HERMES, "Let me see." + A + "\n" + B),
    ("json_array", ARRAY, ARRAY[:ARRAY.index(', {"name": "f"', 10)]),
])
def test_stopping_ends_the_reply_at_the_repeat(hf_tokenizer: Any, fmt: str, text: str,
                                               kept: str) -> None:
    req = _req(hf_tokenizer, fmt)
    deltas = _generate(req, hf_tokenizer, text)
    assert req.finish_reason == "stop"
    assert req.text == kept and "".join(deltas) == kept  # streamed == final, repeat never sent
    assert len(req.output_ids) < len(text)  # generation stopped at the repeat's last token


def test_stopping_releases_held_text_at_the_end(hf_tokenizer: Any) -> None:
    req = _req(hf_tokenizer, "hermes")
    partial = A + "\n" + A[:30]
    deltas = _generate(req, hf_tokenizer, partial)
    assert req.finish_reason is None and "".join(deltas) == A  # the possible repeat is held
    append_token(req, 0, 0.0, eos_ids=frozenset({0}), max_model_len=10_000)  # the stop token
    assert req.finish_reason == "stop" and req.text == partial
    cut = _req(hf_tokenizer, "hermes", max_tokens=len(partial))
    _generate(cut, hf_tokenizer, partial)
    assert cut.finish_reason == "length" and cut.text == partial


# -- end to end on the embedded model ------------------------------------------------------------
#: BFCL simple_python_25 (see benchmarks/data/tool_eval.jsonl): without the repeat stop, SmolLM2
#: writes the call again and again until max_tokens.
QUESTION = {"messages": [{"role": "user", "content": "Calculate the final velocity of an object "
                                                     "falling from a 150 meter building, assuming "
                                                     "initial velocity is zero."}],
            "tools": [{"type": "function", "function": {
                "name": "calculate_final_velocity",
                "description": "Calculate the final velocity of a free falling object given the "
                               "height it's dropped from, the initial velocity and acceleration "
                               "due to gravity. Ignore air resistance.",
                "parameters": {"type": "object", "properties": {
                    "height": {"type": "integer", "description": "The height the object is "
                                                                 "dropped from, in meters."},
                    "initial_velocity": {"type": "integer", "description": "The initial "
                                         "velocity of the object in m/s. Default is zero."},
                    "gravity": {"type": "number", "description": "Acceleration due to gravity. "
                                "Default value is 9.81 m/s^2, earth's gravity."}},
                    "required": ["height"]}}}],
            "tool_choice": "required", "max_tokens": 200, "temperature": 0, "model": "m"}


@pytest.fixture(scope="module")
def engine(smollm: Any) -> Any:
    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine

    return Engine(EngineConfig(device="cpu", kv_cache_tokens=4096, max_num_reqs=4,
                               tool_call_dedupe=True), loaded=smollm)


@pytest.mark.model
@pytest.mark.parametrize("fmt", ["hermes", "json_array"])
def test_required_parallel_request_ends_without_duplicates(engine: Any, fmt: str) -> None:
    """The request path of every route (the protocol layer's prepare/render/parse): the reply ends
    within 200 tokens with finish_reason tool_calls and no call twice; the engine's streamed
    deltas parse to the same calls."""
    from grammarserve.openai import ModelContext, prepare_body, reply_body
    from grammarserve.openai.toolparse_array import make_parser

    ctx = ModelContext.create(engine.tokenizer, engine.grammar.compiler,
                              max_model_len=engine.max_model_len, max_n=1, model_name="m",
                              tool_call_format=fmt)
    prep = prepare_body(ctx, "/v1/chat/completions", QUESTION)
    engine.add_request(f"e2e-{fmt}", prep.prompts[0], prep.params[0])
    parser, final = make_parser(fmt), None
    while engine.has_unfinished():
        for out in engine.step():
            parser.feed(out.delta_text)
            final = out
    parser.finish()
    assert final is not None and final.finished
    body = reply_body(ctx, prep, [final])
    choice = body["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in choice["message"]["tool_calls"]]
    assert choice["finish_reason"] == "tool_calls", final.text
    assert body["usage"]["completion_tokens"] <= 200
    assert calls and len(set(calls)) == len(calls), calls
    assert all(json.loads(a)["height"] == 150 for _, a in calls)
    assert [(c.name, c.arguments) for c in parser.calls] == calls
