"""Issue 33 items 1 and 2 (exact numbers): numeric keywords beyond what the backends represent
exactly (``fsm/schema/exact_numbers.py``'s table) are narrowed where that keeps every generated value
valid, else refused naming the keyword and its JSON path; never clamped, never a crash.

The front-end cases need no model; the walks and the child-process compile use the embedded
model's tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import pytest

from grammarserve.errors import GrammarError, UnsupportedSchemaError
from grammarserve.fsm.config import GrammarConfig
from grammarserve.fsm.conformance import walk
from grammarserve.fsm.frontend import SpecBuilder
from grammarserve.fsm.schema.exact_numbers import EXACT_NUMBERS, exact_numbers, exact_range

SAFE = 2**53 - 1
#: The issue's schemas: the engine died on the first two, the third returned 2**63 - 1.
CRASH_LOW = {"type": "integer", "minimum": -2**63, "maximum": -2**63 + 5}
CRASH_LOW_1 = {"type": "integer", "minimum": -2**63 + 1, "maximum": -2**63 + 6}
CLAMPED = {"type": "integer", "minimum": 2**64, "maximum": 2**64 + 1}


def _spec(schema: Any, *, open_schemas: bool = False, backend: str = "auto") -> Any:
    builder = SpecBuilder(GrammarConfig(open_schemas=open_schemas, backend=backend))  # type: ignore[arg-type]
    return json.loads(builder.json_spec(schema).source)


# (schema, keyword, JSON path): refused, open or closed
REFUSED: list[tuple[Any, str, str]] = [
    (CRASH_LOW, "maximum", "$.maximum"),
    (CRASH_LOW_1, "maximum", "$.maximum"),
    (CLAMPED, "minimum", "$.minimum"),
    ({"type": "integer", "minimum": 2**63}, "minimum", "$.minimum"),
    ({"type": "integer", "maximum": -2**64}, "maximum", "$.maximum"),
    ({"type": "integer", "exclusiveMaximum": -2**53}, "maximum", "$.maximum"),
    ({"type": "integer", "minimum": 10**400}, "minimum", "$.minimum"),
    ({"type": "number", "minimum": 1e308}, "minimum", "$.minimum"),
    ({"type": "number", "maximum": -1e308}, "maximum", "$.maximum"),
    ({"type": "number", "minimum": 1e-300}, "minimum", "$.minimum"),
    ({"type": "integer", "multipleOf": 1e308}, "multipleOf", "$.multipleOf"),
    ({"type": "integer", "multipleOf": 2**64}, "multipleOf", "$.multipleOf"),
    ({"type": "integer", "multipleOf": 2**53 + 1}, "multipleOf", "$.multipleOf"),
    ({"type": "number", "multipleOf": 1e-300}, "multipleOf", "$.multipleOf"),
    ({"const": 2**64}, "const", "$.const"),
    ({"const": 10**22 + 1}, "const", "$.const"),
    ({"enum": [1, -2**63]}, "enum", "$.enum"),
    ({"type": "object", "properties": {"n": {"const": {"id": 2.0**64}}}}, "const",
     "$.properties.n.const"),
    ({"type": "object", "properties": {"n": CLAMPED}}, "minimum", "$.properties.n.minimum"),
]


@pytest.mark.parametrize("open_schemas", [False, True])
@pytest.mark.parametrize("schema,keyword,path", REFUSED)
def test_beyond_the_exact_range_is_refused_naming_keyword_and_path(
        schema: Any, keyword: str, path: str, open_schemas: bool) -> None:
    with pytest.raises(UnsupportedSchemaError) as e:
        _spec(schema, open_schemas=open_schemas)
    assert (e.value.keyword, e.value.path) == (keyword, path)
    assert path in str(e.value) and len(str(e.value)) < 400


# (schema, what the closed front end compiles it to)
NARROWED: list[tuple[Any, Any]] = [
    ({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1},
     {"type": "integer", "minimum": -SAFE, "maximum": SAFE}),
    ({"type": "integer", "minimum": 0, "maximum": 2**64 - 1},
     {"type": "integer", "minimum": 0, "maximum": SAFE}),
    ({"type": "integer", "maximum": 2**53}, {"type": "integer", "maximum": SAFE,
                                             "minimum": -SAFE}),
    ({"type": "integer", "minimum": -1e308, "maximum": 1e308},
     {"type": "integer", "minimum": -SAFE, "maximum": SAFE}),
    ({"type": "number", "maximum": 1e308}, {"type": "number", "maximum": 10**15}),
    ({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 4.0},
     {"type": "integer", "minimum": 2, "maximum": 3}),
    ({"type": "integer", "exclusiveMinimum": -2**53, "maximum": 0},
     {"type": "integer", "minimum": -SAFE, "maximum": 0}),
]


@pytest.mark.parametrize("schema,out", NARROWED)
def test_bounds_that_cut_nothing_exact_are_narrowed(schema: Any, out: Any) -> None:
    assert _spec(schema) == out


def test_open_schemas_are_never_narrowed() -> None:
    with pytest.raises(UnsupportedSchemaError) as e:
        _spec({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1}, open_schemas=True)
    assert e.value.keyword == "minimum"
    assert _spec({"type": "integer", "minimum": 1.5, "maximum": 9}, open_schemas=True) == {
        "type": "integer", "minimum": 2, "maximum": 9}


def test_narrowing_never_widens_the_whole() -> None:
    """Under ``not``/``if``/``oneOf``/``contains`` a narrower subschema can accept more."""
    schema = {"oneOf": [{"type": "integer", "maximum": 2**63}, {"type": "integer",
                                                                "minimum": 5}]}
    with pytest.raises(UnsupportedSchemaError) as e:
        exact_numbers(schema, exact_range("auto"), narrow=True)
    assert e.value.path == "$.oneOf[0].maximum"
    props = {"type": "object", "properties": {"oneOf": {"type": "integer", "maximum": 2**63}}}
    assert exact_numbers(props, exact_range("auto"), narrow=True)[
        "properties"]["oneOf"]["maximum"] == SAFE  # a property named oneOf is a position


def test_the_table_is_the_intersection_of_the_backends_reached() -> None:
    assert exact_range("llguidance") == EXACT_NUMBERS["llguidance"]
    assert exact_range("auto").max_integer == 2**53 - 1
    assert exact_range("xgrammar").max_integer == 2**63 - 1
    assert _spec({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1},
                 backend="xgrammar") == {"type": "integer", "minimum": -(2**63 - 1),
                                         "maximum": 2**63 - 1}


_CHILD = r"""
import json, sys
from transformers import AutoTokenizer
from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.models.loader import resolve_model_folder
tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
for backend in ("llguidance", "auto"):
    compiler = GrammarCompiler(tok, backend=backend, background_upgrade=False)
    for schema in json.loads(sys.argv[1]):
        try:
            compiler.compile_json_schema(schema)
            print("compiled", flush=True)
        except GrammarError as e:
            print("refused", getattr(e, "keyword", None), flush=True)
"""


@pytest.mark.model
def test_the_crash_schemas_compile_in_a_child_without_dying() -> None:
    """Before the fix the child died with SIGSEGV (exit -11) on the first schema."""
    schemas = [CRASH_LOW, CRASH_LOW_1, {"enum": [-2**63, 1]},
               {"type": "integer", "minimum": -2**63 - 1, "maximum": -2**63}]
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(schemas)],
                          capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:-1] == ["refused maximum", "refused maximum",
                                           "refused enum", "refused maximum"] * 2


EOS = 2


def _accepts(compiler: Any, grammar: Any, tokenizer: Any, value: str) -> bool:
    ids = list(tokenizer.encode(value, add_special_tokens=False))
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))[0]


# (schema, instances walked): every accepted one must be valid, and every valid one (inside
# the range the front end keeps) accepted
WALKED: list[tuple[Any, list[str]]] = [
    ({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1},
     [str(v) for v in (-SAFE - 1, -SAFE, 0, SAFE, SAFE + 1, 2**63 - 1, -2**63)]),
    ({"type": "integer", "minimum": 2**53 - 3, "maximum": 2**64},
     [str(v) for v in (2**53 - 4, 2**53 - 3, SAFE, 2**53, 2**63 - 1)]),
    ({"type": "integer", "exclusiveMinimum": -2**53, "maximum": -2**53 + 2},
     [str(v) for v in (-2**53 - 1, -2**53, -SAFE, -2**53 + 2, -2**53 + 3)]),
    ({"type": "number", "maximum": 1e308, "minimum": 999999999999999},
     ["999999999999999", "1000000000000000", "1000000000000001", "999999999999998"]),
    ({"type": "integer", "minimum": 1.5, "maximum": 3.5}, ["1", "2", "3", "4"]),
    ({"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 1},
     ["0", "0.25", "1", "0.3", "-0.25"]),
    # llguidance took k itself here; auto falls back to xgrammar, exact there
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, ["0", "-0", "0.25", "0.5"]),
    ({"type": "number", "exclusiveMaximum": 0, "minimum": -0.5}, ["0", "-0", "-0.25"]),
    ({"type": "number", "exclusiveMinimum": 2, "maximum": 2.5}, ["2", "2.5", "2.25", "3"]),
]


@pytest.mark.model
@pytest.mark.parametrize("schema,values", WALKED)
def test_accepted_values_are_valid_and_valid_ones_accepted(tokenizer: Any, schema: Any,
                                                           values: list[str]) -> None:
    from grammarserve.fsm import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, background_upgrade=False)
    kept = json.loads(compiler.spec("json_schema", schema).source)
    grammar = compiler.compile_json_schema(schema)
    for text in values:
        value = json.loads(text)
        valid = jsonschema.Draft202012Validator(schema).is_valid(value)
        in_kept = jsonschema.Draft202012Validator(kept).is_valid(value)
        accepted = _accepts(compiler, grammar, tokenizer, text)
        assert not accepted or valid, f"{text} accepted but invalid"
        assert accepted == (valid and in_kept), f"{text}: accepted {accepted}, valid {valid}"


@pytest.mark.model
def test_the_llguidance_backend_alone_refuses_the_unit_exclusive_trap(tokenizer: Any) -> None:
    from grammarserve.fsm import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, backend="llguidance")
    with pytest.raises(GrammarError) as e:
        compiler.compile_json_schema({"type": "object", "properties": {
            "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}}})
    assert e.value.path == "$.properties.p.exclusiveMinimum"
