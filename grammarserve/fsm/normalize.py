"""Semantics-preserving rewrites applied after validation, so backends see the simplest
equivalent schema:

- count keywords written as integral floats (``"maxItems": 2.0``) become integers;
- a ``format`` no backend knows is dropped: in Draft 2020-12 ``format`` is an annotation, so
  this keeps the meaning (``strict=True`` refuses unknown formats instead);
- ``oneOf`` whose branches are provably disjoint becomes ``anyOf``, which is then equivalent
  (``rewrite_oneof.py``: different types, distinct ``const``/``enum`` values, also of a
  property both branches require — pydantic's discriminated unions —, a key one requires and
  the other forbids, numeric or length ranges that do not meet); other ``oneOf``s become the
  ``anyOf`` of their exclusive cases (``rewrite_oneof_cases.py``: branch i and not the others)
  when every branch has an exact negation, else are left for the backend to refuse.
"""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.json_schema import iter_subschemas
from grammarserve.fsm.rewrite_oneof import rewrite_oneof
from grammarserve.fsm.rewrite_oneof_cases import rewrite_oneof_cases

_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains")
#: Formats the backends enforce (llguidance's list; xgrammar supports a superset).
KNOWN_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4",
                           "ipv6", "uri", "uuid"})


def normalize(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite ``schema`` in place (it is a private copy) and return it."""
    for sub, _ in list(iter_subschemas(schema)):
        for key in _COUNTS:
            value = sub.get(key)
            if isinstance(value, float) and value.is_integer():
                sub[key] = int(value)
        if "format" in sub and sub["format"] not in KNOWN_FORMATS:
            del sub["format"]
    return rewrite_oneof_cases(rewrite_oneof(schema))

