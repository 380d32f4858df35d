"""The validated soak's reply checker (benchmarks/soak_check.py), model-free: issue 33's clamped
reply is invalid, a stream is joined before it is judged, tool arguments and regex replies are
checked, replies cut by ``max_tokens`` are not judged, ``multipleOf`` is read in decimal (stock
``jsonschema`` divides floats) and ``\\p{..}`` patterns are read by the ``regex`` module; and
the adversarial corpus holds the issue's inputs, each a schema Draft 2020-12 accepts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from soak_adversarial import CRASH_CLASS, adversarial_cases, corpus_cases, obj
from soak_check import Validator, check

N_2E64 = obj({"type": "integer", "minimum": 2**64, "maximum": 2**64 + 1})


def _req(schema: Any) -> dict[str, Any]:
    return {"messages": [], "response_format": {"type": "json_schema",
                                                "json_schema": {"name": "s", "schema": schema}}}


def _reply(content: str, finish: str = "stop") -> str:
    return json.dumps({"choices": [{"index": 0, "message": {"content": content},
                                    "finish_reason": finish}]})


def test_the_issues_clamped_reply_is_an_invalid_stop() -> None:
    verdict = check(_req(N_2E64), 200, _reply('{"n": 9223372036854775807}'))
    assert verdict.finished and verdict.stops == 1
    assert verdict.invalid == ("stop: 9223372036854775807 is less than the minimum of "
                               "18446744073709551616 at $.n")
    assert check(_req(N_2E64), 200, _reply('{"n": 18446744073709551617}')).invalid is None


def test_a_reply_cut_by_max_tokens_is_not_judged_and_a_4xx_not_finished() -> None:
    verdict = check(_req(N_2E64), 200, _reply('{"n": 5', "length"))
    assert verdict.finished and verdict.stops == 0 and verdict.invalid is None
    assert not check(_req(N_2E64), 400, '{"error": {}}').finished


def test_a_stream_is_joined_before_it_is_judged() -> None:
    events = [{"choices": [{"index": 0, "delta": {"content": '{"n"'}}]},
              {"choices": [{"index": 0, "delta": {"content": ": 5}"}, "finish_reason": "stop"}]}]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    verdict = check(_req(N_2E64), 200, text)
    assert verdict.invalid == "stop: 5 is less than the minimum of 18446744073709551616 at $.n"
    error = 'data: {"error": {"type": "invalid_request_error", "message": "no"}}\n\n'
    assert check(_req(N_2E64), 200, error).stream_error == "invalid_request_error: no"


def test_tool_arguments_and_regex_replies_are_checked() -> None:
    req = {"messages": [], "tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": obj({"type": "integer", "maximum": 3}, "a")}}]}

    def call(name: str, args: str) -> str:
        return json.dumps({"choices": [{"finish_reason": "tool_calls", "message": {
            "content": None, "tool_calls": [{"function": {"name": name, "arguments": args}}]}}]})

    assert check(req, 200, call("f", '{"a": 3}')).invalid is None
    assert check(req, 200, call("f", '{"a": 4}')).invalid == (
        "tool_calls: tool 'f' arguments: 4 is greater than the maximum of 3 at $.a")
    assert check(req, 200, call("g", "{}")).invalid == (
        "tool_calls: tool call names 'g', not a tool sent")
    assert check(req, 200, _reply("hello")).invalid == (
        "stop: tool_choice 'required' and no tool call")
    rx = {"messages": [], "regex": r"(a)\1"}
    assert check(rx, 200, _reply("aa")).invalid is None
    assert check(rx, 200, _reply("aab")).invalid == "stop: 'aab' is not a full match of '(a)\\\\1'"


@pytest.mark.parametrize("value,divisor,valid", [
    (1.0, 1e-9, True), (0.3, 0.1, True), (0.35, 0.1, False), (5, 1e-300, True),
    (1e308, 1e-300, True), (1.5, 1e308, False), (2**64 + 1, 2**64, False), (2**65, 2**64, True),
])
def test_multiple_of_is_read_in_decimal(value: Any, divisor: Any, valid: bool) -> None:
    assert Validator({"multipleOf": divisor}).is_valid(value) is valid


def test_a_reply_stock_jsonschema_calls_invalid_only_by_float_division_is_reported() -> None:
    verdict = check(_req({"type": "number", "multipleOf": 1e-9}), 200, _reply("1.0"))
    assert verdict.invalid is None
    assert verdict.float_disagreement == "stock jsonschema: 1.0 is not a multiple of 1e-09 at $"


def test_unicode_property_patterns_are_read_by_the_regex_module() -> None:
    schema = {"type": "string", "pattern": r"^\p{L}+$"}
    assert Validator(schema).is_valid("abé") and not Validator(schema).is_valid("ab1")


def test_the_corpus_holds_the_issues_inputs_as_valid_draft_2020_12_schemas() -> None:
    cases = {c.name: c for c in adversarial_cases()}
    sent = json.dumps([c.body for c in cases.values()])
    for needle in ('"minimum": -9223372036854775808, "maximum": -9223372036854775803',
                   '"minimum": 18446744073709551616, "maximum": 18446744073709551617',
                   '"contains": {"const": "lang:en"}', '"^(?!x)[a-z]{2}$"', '"(?<=a)b"',
                   '"(?=\\\\d)"', '"(a)\\\\1"', '"p1999"', "1e+308", "1e-300",
                   "9007199254740992", "-9007199254740992", "9223372036854775808",
                   "-18446744073709551616"):
        assert needle in sent, needle
    assert len(CRASH_CLASS) == 3 and all(cases[f"crash_{n}"].expect == frozenset(range(400, 500))
                                         for n, _ in CRASH_CLASS)
    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)  # patterns beyond ECMA too
    for case in [*cases.values(), *corpus_cases()]:
        rf = case.body.get("response_format")
        if rf is not None:
            meta.validate(rf["json_schema"]["schema"])
        assert case.body["temperature"] == 0.7
    assert len(corpus_cases()) == len(list(Path("schemas").glob("*.json")))
