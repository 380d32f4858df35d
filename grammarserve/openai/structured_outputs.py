"""vLLM's ``structured_outputs`` request field (vLLM >= 0.10.2), read as our constraints.

``structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object" |
"structural_tag": ..., options}`` holds exactly one constraint, like vLLM's
``StructuredOutputsParams``. ``grammar`` is GBNF/EBNF when it has a ``::=`` rule (xgrammar's
syntax, vLLM's default), else Lark. Of the options, those that can only make the output stricter
than the server's own JSON settings are accepted (``disable_additional_properties``: our schemas
are closed unless the server runs with ``--open-schemas``; ``disable_fallback``: there is no
fallback backend to disable); ``whitespace_pattern`` and ``disable_any_whitespace: true`` would
change what the grammar allows and are refused, naming them, rather than silently ignored.
"""

from __future__ import annotations

import json
from typing import Any

from grammarserve.constraints import Constraint, GrammarSyntax
from grammarserve.errors import InvalidRequestError

FIELD = "structured_outputs"
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_HARMLESS = ("disable_additional_properties", "disable_fallback")
_REFUSED = ("whitespace_pattern", "disable_any_whitespace")


def structured_outputs_constraint(value: Any) -> tuple[Constraint, str] | None:
    """The constraint of a ``structured_outputs`` value and the ``param`` of its errors;
    ``None`` when the value is None or names no constraint. Bad shapes are 400s."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"'{FIELD}' must be an object with one of "
                                  f"{', '.join(_KINDS)}", param=FIELD)
    unknown = [k for k in value if k not in _KINDS + _HARMLESS + _REFUSED and k != "_backend"]
    if unknown:
        raise InvalidRequestError(f"'{FIELD}.{unknown[0]}' is not a structured_outputs field "
                                  f"(known: {', '.join(_KINDS + _HARMLESS + _REFUSED)})",
                                  param=f"{FIELD}.{unknown[0]}")
    for key in _REFUSED:
        if value.get(key) not in (None, False):
            raise InvalidRequestError(f"'{FIELD}.{key}' is not supported: the JSON whitespace "
                                      "this server allows is set by its --json-style and "
                                      "--grammar-max-whitespace", param=f"{FIELD}.{key}")
    kinds = [k for k in _KINDS if value.get(k) not in (None, False)]
    if len(kinds) > 1:
        raise InvalidRequestError(f"'{FIELD}' takes one constraint, got {', '.join(kinds)}",
                                  param=f"{FIELD}.{kinds[1]}")
    if not kinds:
        return None
    kind = kinds[0]
    param = f"{FIELD}.{kind}"
    spec = value[kind]
    if kind == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"'{param}' is not valid JSON: {e}",
                                          param=param) from None
        if not isinstance(spec, (dict, bool)):
            raise InvalidRequestError(f"'{param}' must be a JSON schema (an object)",
                                      param=param)
        return Constraint.json_schema(spec if isinstance(spec, dict) else {}), param
    if kind == "json_object":
        if spec is not True:
            raise InvalidRequestError(f"'{param}' must be true", param=param)
        return Constraint.json_object(), param
    if kind == "choice":
        if (not isinstance(spec, list) or not spec
                or not all(isinstance(c, str) for c in spec)):
            raise InvalidRequestError(f"'{param}' must be a non-empty list of strings",
                                      param=param)
        return Constraint.choice(spec), param
    if kind == "structural_tag":
        if not isinstance(spec, (str, dict)):
            raise InvalidRequestError(f"'{param}' must be a structural tag (its JSON text or "
                                      "an object)", param=param)
        return Constraint.structural_tag(spec), param
    if not isinstance(spec, str) or not spec:
        raise InvalidRequestError(f"'{param}' must be a non-empty string", param=param)
    if kind == "regex":
        return Constraint.regex(spec), param
    syntax = GrammarSyntax.EBNF if "::=" in spec else GrammarSyntax.LARK
    return Constraint.grammar(spec, syntax), param
