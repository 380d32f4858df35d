"""One bad request, one answer: each kind of bad input goes through the HTTP server, the
``/v1/batches`` worker and the offline ``grammarserve batch`` runner, and gets the same status and
the same error body on all three (they share the protocol layer, :mod:`grammarserve.openai`)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from server_helpers import GRAMMARSERVE, ROOT, http_post, running_server
from waiting import wait_until

from grammarserve.errors import ErrorKind, GrammarError, RequestFailedError
from grammarserve.openai.errors import STATUS, error_response

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
ASK = [{"role": "user", "content": "Answer in JSON."}]
BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "strin"}}}
# NOTE: one grammar backend on every path (with "auto" the one ready first enforces the regex, and
# the two word errors differently).
SERVER_ARGS = ("--kv-cache-tokens", "16384", "--max-n", "4", "--num-threads", "1",
               "--grammar-backend", "llguidance")


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": ASK, "max_tokens": 8, "temperature": 0, **fields}


def _completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "x", "max_tokens": 8, "temperature": 0, **fields}


def _schema(schema: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "strict": strict,
                                                   "schema": schema}}


def _response(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Answer in JSON.", "max_output_tokens": 8, "temperature": 0,
            **fields}


def _tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


#: name -> (url, body, expected param): every one is a 400 for the client to fix.
CASES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "schema_keyword": (CHAT, _chat(response_format=_schema(BAD_SCHEMA)), "response_format"),
    "unsupported_keyword": (CHAT, _chat(response_format=_schema(
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}})),
        "response_format"),
    "strict_rules": (CHAT, _chat(response_format=_schema(
        {"type": "object", "properties": {"a": {"type": "string"}}}, strict=True)),
        "response_format"),
    "regex_syntax": (COMPLETIONS, _completion(regex="(unclosed"), "regex"),
    "parameter_range": (CHAT, _chat(temperature=5), "temperature"),
    "parameter_type": (COMPLETIONS, _completion(max_tokens="many"), "max_tokens"),
    "n_above_limit": (CHAT, _chat(n=9), "n"),
    "logit_bias_key": (CHAT, _chat(logit_bias={"abc": 1}), "logit_bias"),
    "foreign_field": (CHAT, _chat(guided_json={"type": "object"}), "guided_json"),
    "prompt_too_long": (CHAT, _chat(max_tokens=10**6), "messages"),
    "tool_parameters": (CHAT, _chat(tools=[_tool(BAD_SCHEMA)], tool_choice="required"),
                        "tools[0].function.parameters"),
    "tool_choice_name": (CHAT, _chat(tools=[_tool({"type": "object"})], tool_choice={
        "type": "function", "function": {"name": "g"}}), "tool_choice"),
    # the regex needs a character whose bytes have no token: it compiles, then the engine finds
    # no token to continue with (a dead end reported by the engine, not by validation)
    "constraint_dead_end": (COMPLETIONS, _completion(regex="\U00092361"), "regex"),
    # the Responses API: translated to chat, its errors name its own parameters
    "responses_stateful": (RESPONSES, _response(previous_response_id="resp_1"),
                           "previous_response_id"),
    "responses_schema": (RESPONSES, _response(text={"format": {
        "type": "json_schema", "name": "s", "schema": BAD_SCHEMA}}), "text.format"),
    "responses_tool": (RESPONSES, _response(tools=[{"type": "function", "name": "f",
                                                    "parameters": BAD_SCHEMA}],
                                            tool_choice="required"), "tools[0].parameters"),
}
#: A good Responses line rides along in the batches: its reply is a ``response`` object.
GOOD = ("responses_ok", RESPONSES, _response(input="Say hi."))


def _line(name: str) -> str:
    url, body = (GOOD[1], GOOD[2]) if name == GOOD[0] else CASES[name][:2]
    return json.dumps({"custom_id": name, "method": "POST", "url": url, "body": body})


def _names(url: str | None = None) -> list[str]:
    return [n for n, case in [*CASES.items(), (GOOD[0], GOOD[1:])]
            if url is None or case[0] == url]


def _results(*files: str) -> dict[str, tuple[int, dict[str, Any]]]:
    out = {}
    for raw in "\n".join(files).splitlines():
        if not raw.strip():
            continue
        rec = json.loads(raw)
        out[rec["custom_id"]] = (rec["response"]["status_code"], rec["response"]["body"])
    return out


def test_the_table_covers_every_kind() -> None:
    assert set(STATUS) == set(ErrorKind)
    assert error_response(RequestFailedError("the constraint cannot be completed", param="regex",
                                             kind=ErrorKind.CONSTRAINT_DEAD_END)) == (
        400, {"error": {"message": "the constraint cannot be completed",
                        "type": "invalid_request_error", "param": "regex", "code": None}})
    assert error_response(GrammarError("bad"))[0] == 400
    assert error_response(RequestFailedError("bug"))[0] == 500
    assert error_response(KeyError("x"))[1]["error"]["message"] == (
        "internal server error: KeyError")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("error_paths")
    with running_server(tmp / "server.log", *SERVER_ARGS, "--data-dir", str(tmp / "data")) as s:
        yield s


@pytest.fixture(scope="module")
def over_http(server: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    return {name: http_post(server["url"] + url, body) for name, (url, body, _) in CASES.items()}


def _finished(batch: Any) -> Any:
    """``batch`` once it reached a final status, else None."""
    return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None


@pytest.fixture(scope="module")
def batches_worker(server: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    client = openai.OpenAI(base_url=server["url"] + "/v1", api_key="none", max_retries=0)
    results: dict[str, tuple[int, dict[str, Any]]] = {}
    for url in (CHAT, COMPLETIONS, RESPONSES):  # a batch has one endpoint
        lines = "\n".join(_line(n) for n in _names(url)) + "\n"
        upload = client.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint=url,  # type: ignore[arg-type]
                                      completion_window="24h")
        bid = batch.id
        batch = wait_until(lambda: _finished(client.batches.retrieve(bid)), 600,  # noqa: B023
                           f"batch {bid} to finish", interval_s=0.2)
        assert batch.status == "completed" and batch.error_file_id, batch
        ok = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
        results.update(_results(client.files.content(batch.error_file_id).text, ok))
    return results


@pytest.fixture(scope="module")
def offline_runner(tmp_path_factory: pytest.TempPathFactory,
                   over_http: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("offline")
    inp, out, err = tmp / "in.jsonl", tmp / "out.jsonl", tmp / "err.jsonl"
    inp.write_text("\n".join(_line(n) for n in _names()) + "\n")
    run = subprocess.run([GRAMMARSERVE, "batch", str(inp), "-o",
                          str(out), "--errors", str(err), "--max-n", "4", "--no-progress",
                          *SERVER_ARGS], cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    return _results(err.read_text(), out.read_text())


@pytest.mark.model
@pytest.mark.parametrize("name", list(CASES))
def test_same_status_and_body_on_every_path(
        name: str, over_http: dict[str, tuple[int, dict[str, Any]]],
        batches_worker: dict[str, tuple[int, dict[str, Any]]],
        offline_runner: dict[str, tuple[int, dict[str, Any]]]) -> None:
    status, body = over_http[name]
    assert status == 400, body
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == CASES[name][2], error
    assert error["message"]
    assert _stable(batches_worker[name]) == _stable((status, body))
    assert _stable(offline_runner[name]) == _stable((status, body))


def _stable(result: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The result without the matcher's own words after "dead end:" (the backend words the same
    dead end differently from one request to the next, even on one path: e.g. "byte '\\u{92}'
    fails parse" or "forced bytes: got 'ò'"); every other message is compared whole."""
    status, body = result
    error = dict(body["error"])
    error["message"] = error["message"].split("dead end:")[0]
    return status, {"error": error}


@pytest.mark.model
def test_a_responses_line_is_answered_on_both_batch_paths(
        batches_worker: dict[str, tuple[int, dict[str, Any]]],
        offline_runner: dict[str, tuple[int, dict[str, Any]]]) -> None:
    for results in (batches_worker, offline_runner):
        status, body = results[GOOD[0]]
        assert status == 200 and body["object"] == "response", body
        assert body["id"].startswith("resp_") and body["status"] in ("completed", "incomplete")
        assert body["output"][0]["type"] == "message" and body["usage"]["output_tokens"] > 0
