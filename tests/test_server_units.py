"""Server pieces without a model: metrics, server state, error envelopes, the OpenAPI document,
requests refused at parse time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.engine.stats import EngineStats
from grammarserve.errors import GrammarError, InvalidRequestError
from grammarserve.openai.protocol import ChatCompletionRequest, CompletionRequest
from grammarserve.server.metrics import ServerMetrics


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
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize",
                 "/detokenize", "/v1/files", "/v1/batches"):
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

    from grammarserve.openai.protocol import TokenizeRequest, has_lone_surrogate
    from grammarserve.server.app import validation_response
    from grammarserve.server.batches import CreateBatchRequest

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
