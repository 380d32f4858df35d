"""The exact-match scorer of the function-calling evaluation set (``benchmarks/tool_eval.py``):
BFCL's AST-checker rules on hand-made questions, BFCL -> OpenAI tool conversion, and the shipped
set checked against its own answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tool_eval", BENCH / "tool_eval.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


te = _load()

AREA = {"name": "geometry_area", "parameters": {"type": "dict", "properties": {
    "base": {"type": "integer"}, "height": {"type": "float"}, "unit": {"type": "string"},
    "dims": {"type": "array", "items": {"type": "integer"}},
    "opts": {"type": "dict", "properties": {"round": {"type": "boolean"}}}},
    "required": ["base", "height"]}}
AREA_ANSWER = {"geometry_area": {"base": [10], "height": [5.0], "unit": ["cm", ""],
                                 "dims": [[1, 2], ""], "opts": [{"round": [True]}, ""]}}
PRIME = {"name": "primes", "parameters": {"type": "dict", "properties": {
    "count": {"type": "integer"}}, "required": ["count"]}}


@pytest.mark.parametrize(("args", "ok"), [
    ({"base": 10, "height": 5.0}, True),
    ({"base": 10, "height": 5}, True),  # an int is accepted for a float
    ({"base": 10, "height": 5, "unit": "CM"}, True),  # strings: case and punctuation ignored
    ({"base": 10, "height": 5, "unit": "c.m"}, True),
    ({"base": 10, "height": 5, "dims": [1, 2]}, True),
    ({"base": 10, "height": 5, "opts": {"round": True}}, True),
    ({"base": 10.0, "height": 5}, False),  # a float for an integer
    ({"base": 10}, False),  # a required parameter missing
    ({"base": 10, "height": 6}, False),
    ({"base": 10, "height": 5, "unit": "mm"}, False),
    ({"base": 10, "height": 5, "dims": [2, 1]}, False),
    ({"base": 10, "height": 5, "opts": {"round": False}}, False),
    ({"base": 10, "height": 5, "color": "red"}, False),  # not in the spec
    ({"base": True, "height": 5}, False),  # a bool is no integer
])
def test_one_call(args: dict[str, Any], ok: bool) -> None:
    error = te.check_calls([AREA], [("geometry_area", args)], [AREA_ANSWER], "simple")
    assert (error is None) == ok, error


def test_call_count_name_and_non_optional_answers() -> None:
    good = ("geometry_area", {"base": 10, "height": 5})
    assert te.check_calls([AREA], [good, good], [AREA_ANSWER], "simple") is not None
    assert te.check_calls([AREA], [], [AREA_ANSWER], "simple") is not None
    assert "expected 'geometry_area'" in te.check_calls(
        [AREA, PRIME], [("primes", {"count": 5})], [AREA_ANSWER], "multiple")
    # A parameter whose accepted values lack "" must be given even when not required.
    must = {"geometry_area": {**AREA_ANSWER["geometry_area"], "unit": ["cm"]}}
    assert te.check_calls([AREA], [good], [must], "simple") is not None


def test_parallel_is_order_free_but_counts_calls() -> None:
    answers = [{"primes": {"count": [5]}}, {"primes": {"count": [7]}}, AREA_ANSWER]
    calls = [("geometry_area", {"base": 10, "height": 5}), ("primes", {"count": 7}),
             ("primes", {"count": 5})]
    assert te.check_calls([AREA, PRIME], calls, answers, "parallel_multiple") is None
    assert te.check_calls([AREA, PRIME], calls[:2], answers, "parallel_multiple") is not None
    twice = [calls[1], calls[1], calls[0]]  # one expected call matched twice does not count
    assert te.check_calls([AREA, PRIME], twice, answers, "parallel_multiple") is not None


def test_parse_calls() -> None:
    calls = [{"function": {"name": "f", "arguments": '{"a": 1}'}},
             {"function": {"name": "g", "arguments": ""}}]
    assert te.parse_calls(calls) == [("f", {"a": 1}), ("g", {})]
    assert te.parse_calls([{"function": {"name": "f", "arguments": '{"a": '}}]) is None


def test_bfcl_spec_to_openai_tool() -> None:
    fn = {"name": "math.area", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float", "description": "x"}, "t": {"type": "tuple", "items": {
            "type": "any"}}, "o": {"type": "dict", "properties": {"k": {"type": "integer"}},
                                   "required": ["k"], "optional": True},
        "n": {"description": "no type"}}, "required": ["x"]}}
    tool = te.to_openai_tool(fn)
    assert tool["function"]["name"] == "math_area"
    params = tool["function"]["parameters"]
    assert params["type"] == "object" and params["required"] == ["x"]
    props = params["properties"]
    assert props["x"] == {"type": "number", "description": "x"}
    assert props["t"] == {"type": "array", "items": {"type": "string"}}
    assert props["o"] == {"type": "object", "properties": {"k": {"type": "integer"}},
                          "required": ["k"]}
    assert props["n"]["type"] == "string"


def test_the_shipped_set() -> None:
    """At least 60 questions over the four categories, each a valid tool list whose expected
    calls name its tools; the first accepted values of every answer score as a match."""
    import jsonschema

    rows = [json.loads(line) for line in (BENCH / "data" / "tool_eval.jsonl").read_text()
            .splitlines()]
    assert len(rows) >= 60
    assert {r["category"] for r in rows} == {"simple", "multiple", "parallel",
                                             "parallel_multiple"}
    for r in rows:
        names = {t["function"]["name"] for t in r["tools"]}
        assert names == {f["name"] for f in r["functions"]}
        for t in r["tools"]:
            jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
        calls = []
        for answer in r["ground_truth"]:
            (name, params), = answer.items()
            assert name in names
            spec = next(f for f in r["functions"] if f["name"] == name)["parameters"]
            required = spec.get("required", [])
            calls.append((name, {k: next(v for v in vs if v != "") if k in required else vs[0]
                                 for k, vs in params.items() if k in required or vs[0] != ""}))
        assert te.check_calls(r["functions"], calls[::-1], r["ground_truth"],
                              r["category"]) is None, r["id"]
