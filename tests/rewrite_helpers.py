"""Shared checks for the front end's exact rewrites (``grammarserve/fsm/rewrite*.py``): a
rewritten schema must accept exactly the instances its source accepts (``jsonschema``)."""

from __future__ import annotations

from typing import Any

import jsonschema

from grammarserve.fsm.schema.prepare import prepare_schema
from grammarserve.fsm.schema.rewrites import rewrite_schema
from grammarserve.fsm.schema.tree import iter_subschemas

#: Instances of every type, with near misses of the values the tests use.
POOL: list[Any] = [
    None, True, False, 0, 1, 2, 3, -1, 2.5, 0.5, 1e30, -7.25,
    "", "a", "b", "c", "x", "y", "ab", "ac", "abc", "ba", "US", "U", "USA", "us", "PO Box 1",
    "po box", "PO B", "P", "1 Main St", "a\nb", "é", "\U0001f600", "a-b", "a.b", "[", "^",
    [], [1], [1, 2], [2, 1], [1, 1], ["x"], ["x", "y"], ["y", "x"], ["x", "x"], [True],
    [True, False], [False, True], [True, True], [None], ["x", "y", "z"], [[1]],
    {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"c": 3},
    {"a": "x"}, {"a": None}, {"kind": "cat"}, {"kind": "dog", "a": 1}, {"kind": 1},
]


def rewritten(schema: Any) -> dict[str, Any]:
    """``schema`` after the front end with the rewrites (parse, meta-validate, rewrite, check)."""
    return prepare_schema(schema, rewrite=rewrite_schema)


def assert_equivalent(schema: Any, extra: list[Any] | tuple[Any, ...] = (),
                      gone: tuple[str, ...] = ("not", "if", "dependentRequired",
                                               "uniqueItems")) -> dict[str, Any]:
    """Rewrite ``schema``, check no keyword of ``gone`` is left and that both accept the same
    instances of the pool and ``extra``; return the rewrite."""
    out = rewritten(schema)
    left = [(p, k) for sub, p in iter_subschemas(out) for k in gone if k in sub
            and not (k == "uniqueItems" and sub[k] is False)]
    assert not left, left
    before = jsonschema.Draft202012Validator(schema)
    after = jsonschema.Draft202012Validator(out)
    for instance in POOL + list(extra):
        assert before.is_valid(instance) == after.is_valid(instance), (instance, out)
    return out
