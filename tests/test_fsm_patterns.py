"""Unicode property escapes in patterns (``fsm/patterns.py``): taken by the front end (the
meta-schema's ``format: regex``), read by llguidance and the value checks, never negated by
``schema/algebra/regex_complement.py``."""

from __future__ import annotations

import pytest
from check_helpers import passes, prepared

from grammarserve.errors import SchemaValidationError
from grammarserve.fsm.patterns import is_pattern
from grammarserve.fsm.schema.algebra.regex_complement import pattern_complement
from grammarserve.fsm.schema.read.metavalidate import meta_validate


@pytest.mark.parametrize("pattern, ok", [
    ("^[a-z]+$", True), (r"^\p{Letter}+$", True), (r"^\P{L}$", True), (r"\pL", True),
    (r"^[\p{L}\d_]+$", True), (r"\p{Script=Greek}", True), ("[", False), (r"\p{", False),
    (r"\p{NoSuchProperty}", False), (r"(\p{L}", False), (1, True),
])
def test_which_patterns_are_taken(pattern: object, ok: bool) -> None:
    assert is_pattern(pattern) is ok


def test_meta_validation_takes_property_escapes_and_refuses_bad_patterns() -> None:
    meta_validate({"type": "string", "pattern": r"^\p{Letter}+$"})
    meta_validate({"patternProperties": {r"^\p{Lu}": {}}})
    with pytest.raises(SchemaValidationError):
        meta_validate({"type": "string", "pattern": r"^\p{Letter"})


def test_property_escapes_are_never_complemented() -> None:
    assert pattern_complement(r"^[\p{L}]") is None
    assert pattern_complement(r"^\p{L}") is None


def test_a_negated_property_pattern_is_a_check() -> None:
    schema = {"type": "string", "not": {"pattern": r"^\p{Lu}"}}
    out, checks = prepared(schema)
    assert [c.keyword for c in checks] == ["not"]
    for doc, valid in [("abc", True), ("Abc", False), ("Ωmega", False), ("ωmega", True),
                       ("", True), ("1", True)]:
        assert passes(doc, out, checks) is valid, doc
