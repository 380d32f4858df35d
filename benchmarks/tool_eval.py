"""The function-calling evaluation set (BFCL questions) and its exact-match scorer.

The set (``benchmarks/data/tool_eval.jsonl``, built by ``make_tool_eval.py``) holds questions of the
Berkeley Function Calling Leaderboard (``bfcl-eval`` wheel, Apache-2.0). Each line:

- ``id`` (BFCL's), ``category`` (``simple``, ``multiple``, ``parallel``, ``parallel_multiple``),
  ``source`` (the BFCL file)
- ``messages``: the user turn, as BFCL sends it to function-calling models (no system prompt)
- ``tools``: BFCL's function specs as OpenAI ``tools`` (:func:`to_openai_tool`)
- ``functions``: the same specs with BFCL's own types (the scorer's type rules need them)
- ``ground_truth``: BFCL's possible answers, ``[{name: {param: [accepted values]}}]``

Function names with ``.`` become ``_`` in all three (OpenAI names match
``^[a-zA-Z0-9_-]{1,64}$``), as BFCL does for OpenAI-style models.

The scorer follows BFCL's AST checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``, Python
rules): the number of calls must equal the number expected (``parallel*``: matched in any order),
names equal, required parameters present, no parameter outside the spec and the answer, every
value among the accepted ones. Lenient like BFCL: an int is accepted for a ``float``; strings are
compared lower-cased without spaces and ``,./-_*^``; ``""`` among the accepted values means the
parameter may be left out.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

#: BFCL type -> JSON Schema type (BFCL's ``GORILLA_TO_OPENAPI`` for Python).
JSON_TYPES = {"integer": "integer", "number": "number", "float": "number", "string": "string",
              "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
              "dict": "object", "object": "object", "tuple": "array", "any": "string"}
#: BFCL type -> Python type of a correct value (BFCL's ``PYTHON_TYPE_MAPPING``).
PY_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                             "array": list, "tuple": list, "dict": dict, "any": str}
_NESTED = ("array", "tuple")


def oai_name(name: str) -> str:
    """BFCL's rename for OpenAI-style models: ``math.factorial`` -> ``math_factorial``."""
    return name.replace(".", "_")


# -- BFCL function specs -> OpenAI tools ----------------------------------------------------------
def _to_schema(spec: dict[str, Any]) -> dict[str, Any]:
    """One BFCL parameter spec as JSON Schema (types mapped; BFCL's ``optional`` flag and a
    boolean ``required`` dropped: neither is JSON Schema)."""
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "type":
            out["type"] = JSON_TYPES.get(value, "string")
        elif key == "properties":
            out["properties"] = {k: _to_schema(v) for k, v in value.items()}
        elif key == "items":
            out["items"] = _to_schema(value)
        elif key == "optional" or (key == "required" and not isinstance(value, list)):
            continue
        else:
            out[key] = copy.deepcopy(value)
    if "type" not in out and "enum" not in out:
        out["type"] = "string"  # as BFCL: a parameter without a type is a string
    return out


def to_openai_tool(fn: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function spec as an OpenAI ``{"type": "function", "function": {...}}`` tool."""
    params = _to_schema(fn["parameters"])
    params["type"] = "object"
    return {"type": "function", "function": {"name": oai_name(fn["name"]),
                                             "description": fn.get("description", ""),
                                             "parameters": params}}


def renamed_function(fn: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(fn)
    out["name"] = oai_name(fn["name"])
    return out


def renamed_answer(ground_truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{oai_name(name): args for name, args in call.items()} for call in ground_truth]


# -- scoring --------------------------------------------------------------------------------------
def standardize(text: str) -> str:
    """BFCL's string normalization: no spaces or ``,./-_*^``, lower case, ``'`` -> ``"``."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _answer_type(accepted: list[Any]) -> type | None:
    for value in accepted:
        if value != "":
            return type(value)
    return None


def _type_ok(value: Any, accepted: list[Any], expected: type, nested: type | None
             ) -> tuple[bool, bool]:
    """``(ok, is_variable)``: BFCL's ``type_checker`` (one level of nesting). A value of the
    answers' own type where that differs from the spec's counts as a "variable"."""
    answer_type = _answer_type(accepted)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for item_answers in accepted:  # NOTE: as BFCL, a non-list answer ("") passes
            if not isinstance(item_answers, list) or all(
                    _type_ok(v, item_answers, nested, None)[0] for v in value):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _std(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def _dict_ok(value: dict[str, Any], accepted: list[Any]) -> bool:
    for answer in accepted:
        if answer == "":
            continue
        if (all(k in answer and _std(v) in [_std(a) for a in answer[k]] for k, v in value.items())
                and all(k in value or "" in vs for k, vs in answer.items())):
            return True
    return False


def _list_dict_ok(value: list[Any], accepted: list[Any]) -> bool:
    return any(isinstance(answer, list) and len(answer) == len(value)
               and all(isinstance(v, dict) and _dict_ok(v, [a]) for v, a in zip(value, answer))
               for answer in accepted)


def _value_ok(value: Any, accepted: list[Any], expected: type, nested: type | None,
              is_variable: bool) -> bool:
    if not is_variable:
        if expected is dict:
            return isinstance(value, dict) and _dict_ok(value, accepted)
        if expected is list and nested is dict:
            return _list_dict_ok(value, accepted)
        if expected is str:
            return standardize(value) in [standardize(a) for a in accepted if isinstance(a, str)]
        if expected is list:
            return [_std(v) for v in value] in [[_std(x) for x in a] for a in accepted
                                               if isinstance(a, list)]
    return value in accepted


def check_call(fn: dict[str, Any], name: str, args: Any, answer: dict[str, Any]) -> str | None:
    """One call against one expected call (``answer``: ``{name: {param: [values]}}``); returns
    None when it matches, else why not (BFCL's ``simple_function_checker``)."""
    want = fn["name"]
    if name != want:
        return f"function {name!r}, expected {want!r}"
    if not isinstance(args, dict):
        return "arguments are not an object"
    accepted_all = answer[want]
    spec = fn["parameters"].get("properties", {})
    for param in fn["parameters"].get("required", []):
        if param not in args:
            return f"missing required parameter {param!r}"
    for param, value in args.items():
        if param not in spec or param not in accepted_all:
            return f"unexpected parameter {param!r}"
        kind = spec[param].get("type", "string")
        expected = PY_TYPES.get(kind, str)
        nested = None
        if kind in _NESTED:
            nested = PY_TYPES.get(spec[param].get("items", {}).get("type", "string"), str)
        if kind == "float" and type(value) is int:
            value = float(value)
        accepted = accepted_all[param]
        ok, is_variable = _type_ok(value, accepted, expected, nested)
        if not ok:
            return f"parameter {param!r}: wrong type {type(value).__name__} ({value!r})"
        if not _value_ok(value, accepted, expected, nested, is_variable):
            return f"parameter {param!r}: {value!r} not among {accepted!r}"
    for param, accepted in accepted_all.items():
        if param not in args and "" not in accepted:
            return f"missing parameter {param!r} (not optional in the answer)"
    return None


def check_calls(functions: list[dict[str, Any]], calls: list[tuple[str, Any]],
                ground_truth: list[dict[str, Any]], category: str) -> str | None:
    """The reply's ``calls`` (``(name, parsed arguments)``) against the expected calls; None
    when they match exactly. ``parallel*`` categories match the calls in any order."""
    if len(calls) != len(ground_truth):
        return f"{len(calls)} calls, expected {len(ground_truth)}"
    by_name = {fn["name"]: fn for fn in functions}
    if "parallel" not in category:
        answer = ground_truth[0]
        return check_call(by_name[next(iter(answer))], *calls[0], answer)
    free = list(range(len(calls)))
    for answer in ground_truth:
        fn = by_name[next(iter(answer))]
        hit = next((i for i in free if check_call(fn, *calls[i], answer) is None), None)
        if hit is None:
            return f"no call matches the expected {json.dumps(answer)[:120]}"
        free.remove(hit)
    return None


def parse_calls(tool_calls: list[Any] | None) -> list[tuple[str, Any]] | None:
    """``(name, arguments)`` of an OpenAI message's ``tool_calls`` (dicts or SDK objects); None
    when some call's arguments are not JSON."""
    out: list[tuple[str, Any]] = []
    for call in tool_calls or []:
        fn = call["function"] if isinstance(call, dict) else call.function
        name = fn["name"] if isinstance(fn, dict) else fn.name
        raw = fn["arguments"] if isinstance(fn, dict) else fn.arguments
        try:
            out.append((name, json.loads(raw or "{}")))
        except json.JSONDecodeError:
            return None
    return out
