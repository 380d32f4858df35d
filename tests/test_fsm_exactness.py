"""The exactness accounting (``fsm/exactness.py``) and the key order a grammar generates
(``fsm/schema/order.py``): each cause a refused valid walk is given, on rules with known answers,
and through the compiler on the embedded tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.fsm.conformance import explain_refusal, walk
from grammarserve.fsm.exactness import (
    Cause,
    CauseKind,
    integral_ints,
    outside_number_bounds,
    plain_numbers,
    refusal_causes,
    schema_ordered,
    without_formats,
    without_raw_del,
)
from grammarserve.fsm.schema.order import own_properties_first

COMPACT = (",", ":")


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=COMPACT)


def _spells(text: str) -> bool:
    return True


# --------------------------------------------------------------------------- the rewrites


def test_rewrites() -> None:
    assert without_raw_del('{"a":"x\x7fy"}') == '{"a":"x\\u007fy"}'
    assert plain_numbers('{"p":1.5e-3,"s":"1e5","q":-2E+2}') == '{"p":0.0015,"s":"1e5","q":-200}'
    assert outside_number_bounds({"n": 2**53}, '{"n":9007199254740992}')
    assert outside_number_bounds({"n": -9007199254740992.0}, "")
    assert not outside_number_bounds({"n": 2**53 - 1, "s": "1" * 30}, '{"n":1,"s":"' + "1" * 30 + '"}')
    assert outside_number_bounds({"n": 0.1}, '{"n":0.' + "0" * 21 + "1}")
    assert _dumps(integral_ints({"a": [1.0, 1.5, -0.0], "b": True})) == '{"a":[1,1.5,0],"b":true}'
    assert without_formats({"properties": {"format": {"type": "string", "format": "uuid"}}}) == \
        {"properties": {"format": {"type": "string"}}}


def test_schema_order_follows_merges_refs_and_items() -> None:
    schema = {"$defs": {"item": {"properties": {"z": {}, "y": {}}}},
              "properties": {"b": {}, "a": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
              "allOf": [{"properties": {"c": {"properties": {"q": {}, "p": {}}}}}],
              "additionalProperties": {"properties": {"m": {}, "l": {}}}}
    got = schema_ordered({"x": {"l": 1, "m": 2}, "c": {"p": 1, "q": 2}, "a": [{"y": 1, "z": 2}],
                          "b": 0}, schema)
    assert _dumps(got) == _dumps({"b": 0, "a": [{"z": 2, "y": 1}], "c": {"q": 2, "p": 1},
                                  "x": {"m": 2, "l": 1}})


def test_schema_order_puts_required_keys_it_does_not_name_in_required_order() -> None:
    schema = {"properties": {"n": {}}, "anyOf": [{"required": ["b", "a"]}]}
    assert list(schema_ordered({"a": 1, "x": 0, "b": 2, "n": 3}, schema)) == ["n", "b", "a", "x"]


def test_causes_are_the_fewest_that_explain() -> None:
    schema = {"properties": {"a": {}, "b": {}}}
    inst = {"b": "\x7f", "a": 1}  # out of order and a raw DEL
    wanted = '{"a":1,"b":"\\u007f"}'

    def only(text: str) -> bool:
        return text == wanted

    assert refusal_causes(inst, _dumps, schema, accepts=only, spells=_spells) == \
        {Cause.KEY_ORDER, Cause.RAW_DEL}
    # the key order alone explains it: the DEL rewrite is dropped again
    assert refusal_causes(inst, _dumps, schema, accepts=lambda t: t.startswith('{"a"'),
                          spells=_spells) == {Cause.KEY_ORDER}
    assert refusal_causes(inst, _dumps, schema, accepts=lambda t: False, spells=_spells) == \
        {Cause.UNEXPLAINED}
    assert refusal_causes(inst, _dumps, schema, accepts=lambda t: False,
                          spells=lambda t: False) == {Cause.VOCABULARY}


def test_variants_name_policies() -> None:
    schema = {"properties": {"a": {}}}
    never = lambda t: False
    assert refusal_causes({"a": 1, "x": 2}, _dumps, schema, accepts=never, spells=_spells,
                          variants=[(Cause.CLOSED, lambda t: True)]) == {Cause.CLOSED}
    assert refusal_causes({"a": 2**60}, _dumps, schema, accepts=never, spells=_spells,
                          variants=[(Cause.CLOSED, lambda t: True)]) == {Cause.NUMBER_BOUNDS}
    assert refusal_causes({"a": ""}, _dumps, schema, accepts=never, spells=_spells,
                          variants=[(Cause.CLOSED, never), (Cause.FORMAT, lambda t: True)]
                          ) == {Cause.FORMAT}
    assert {c.kind for c in Cause} == set(CauseKind)


# --------------------------------------------------------------------------- key order


def test_own_properties_come_before_the_applicators() -> None:
    node = {"allOf": [{"properties": {"b": {}}}], "type": "object",
            "properties": {"a": {}, "b": {}}, "required": ["a"]}
    assert list(own_properties_first(node)) == ["properties", "allOf", "type", "required"]
    kept = {"properties": {"a": {}}, "anyOf": [{}]}
    assert list(own_properties_first(kept)) == ["properties", "anyOf"]


@pytest.mark.model
def test_the_schemas_own_order_is_generated(tokenizer: Any) -> None:
    """A document with ``allOf`` written before ``properties`` (sorted keys; the branches an
    ``if``/``then`` becomes): the object's own order is accepted, as the model writes it."""
    from grammarserve.fsm import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, background_upgrade=False, compile_timeout_s=600)
    stop, bitmask = compiler.stop_token_ids[0], compiler.allocate_bitmask(1)
    schema = {"allOf": [{"if": {"properties": {"kind": {"const": "a"}}},
                         "then": {"required": ["size"]}}],
              "properties": {"name": {"type": "string"}, "kind": {"enum": ["a", "b"]},
                             "size": {"type": "integer"}},
              "required": ["name", "kind"], "type": "object"}
    grammar = compiler.compile_json_schema(schema)

    def accepts(text: str) -> bool:
        return walk(grammar.matcher(), tokenizer.encode(text, add_special_tokens=False), stop,
                    bitmask)[0]

    assert accepts('{"name":"x","kind":"a","size":3}')
    assert accepts('{"name":"x","kind":"b"}')
    assert not accepts('{"name":"x","kind":"a"}')  # the condition still holds
    assert not accepts('{"kind":"b","name":"x"}')  # key order: the policy
    cause = explain_refusal(compiler, schema, {"kind": "b", "name": "x"}, "compact", tokenizer,
                            bitmask)
    assert cause == {Cause.KEY_ORDER}


@pytest.mark.model
def test_explain_refusal_through_the_compiler(tokenizer: Any) -> None:
    from grammarserve.fsm import GrammarCompiler

    closed = GrammarCompiler(tokenizer, background_upgrade=False, compile_timeout_s=600)
    opened = GrammarCompiler(tokenizer, background_upgrade=False, compile_timeout_s=600,
                             open_schemas=True)
    bitmask = closed.allocate_bitmask(1)

    def explain(schema: Any, instance: Any, form: str = "compact") -> frozenset[Cause]:
        return explain_refusal(closed, schema, instance, form, tokenizer, bitmask,
                               open_compiler=opened)

    obj = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert explain(obj, {"a": 1, "extra": True}) == {Cause.CLOSED}
    assert explain({"type": "integer"}, 2**60) == {Cause.NUMBER_BOUNDS}
    assert explain({"type": "string"}, "a\x7fb", "spaced") == {Cause.RAW_DEL}
    assert explain({"type": "number", "minimum": 0, "maximum": 1}, 1.5e-05) == {Cause.EXPONENT}
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string",
              "format": "uuid"}
    assert explain(draft4, "") == {Cause.FORMAT}
    assert explain({"type": "string"}, "a\U00050000b") == {Cause.VOCABULARY}
    assert explain({"type": "integer"}, 1.0) == {Cause.NUMBER_SPELLING}
    # the dependentRequired rewrite's cases require the dependents before their trigger
    deps = {"dependentRequired": {"a": ["b"]}}
    assert explain(deps, {"a": 1, "b": 2}) == {Cause.KEY_ORDER}
