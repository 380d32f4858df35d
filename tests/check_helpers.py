"""What generation accepts, model-free: the schema the grammar is compiled from (checked with
``jsonschema``) and the run-time value checks at their locations (``fsm/schema/checks/split.py``)."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema

from grammarserve.fsm.check_set import make_validator
from grammarserve.fsm.schema.normalize import normalize
from grammarserve.fsm.schema.prepare import prepare_schema
from grammarserve.fsm.schema.rewrites import rewrite_schema
from grammarserve.fsm.value_check import ValueCheck, identity


def prepared(schema: Any) -> tuple[dict[str, Any], list[ValueCheck]]:
    """The grammar's schema and the checks, as ``GrammarCompiler`` makes them (before the
    backend's own ``oneOf`` handling: ``normalize`` runs too)."""
    checks: list[ValueCheck] = []
    out = prepare_schema(schema, rewrite=functools.partial(rewrite_schema, checks=checks),
                         checked=True)
    return normalize(out), checks


def values(doc: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...],
                                                                    Any]]:
    """Every value of ``doc`` with its path, the document first."""
    out = [(path, doc)]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += values(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += values(v, path + (i,))
    return out


def passes(doc: Any, grammar_schema: dict[str, Any], checks: list[ValueCheck]) -> bool:
    """What generation accepts: the grammar's schema, then every check at its values."""
    try:
        if not jsonschema.Draft202012Validator(grammar_schema).is_valid(doc):
            return False
    except re.error:  # a pattern Python's re cannot read (\p{...}): the checks' validator can
        if make_validator(json.dumps(grammar_schema))(doc) is not None:
            return False
    for path, value in values(doc):
        for c in checks:
            if not c.matches(path):
                continue
            if c.kind == "unique" and isinstance(value, list):
                keys = [identity(v) for v in value]
                if len(set(keys)) != len(keys):
                    return False
            elif c.kind != "unique" and make_validator(c.schema)(value) is not None:
                return False
    return True
