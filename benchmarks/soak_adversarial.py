"""The validated soak's traffic (issue 33): the adversarial corpus (integer and number bounds
where the backends stop representing numbers exactly, huge and tiny ``multipleOf``, ``contains``,
look-around and back-reference patterns and the other regex constructs of the dialect, 2,000
optional properties, pathological combinations), the corpus schemas of ``schemas/`` as healthy
traffic, and the crash-class requests sent six in a row before the soak starts.

Every request here is sent at temperature 0.7. An adversarial case may get a clean 4xx or a 200
(then a reply valid under the schema as sent, when it says ``finish_reason: "stop"``); a corpus
schema must get a 200. :mod:`soak_check` validates the replies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from soak_corpus import CHAT, FOUR_XX, OK, Case, fmt, tool

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"
TEMPERATURE = 0.7
#: A clean refusal or a served reply: what every adversarial case may get.
FOUR_XX_OR_OK = FOUR_XX | OK
#: The reply budget of an adversarial request (numbers and short strings) and a corpus one.
ADVERSARIAL_TOKENS = 48
CORPUS_TOKENS = 384


def obj(value: Any, key: str = "n") -> dict[str, Any]:
    """``{"key": value}``, required, nothing else."""
    return {"type": "object", "properties": {key: value}, "required": [key],
            "additionalProperties": False}


def body(schema: Any, content: str = "Give me the value as JSON.", *,
         max_tokens: int = ADVERSARIAL_TOKENS, **extra: Any) -> dict[str, Any]:
    """A chat body at :data:`TEMPERATURE`; ``schema`` (unless None) as ``response_format``."""
    return {"model": "default", "max_tokens": max_tokens, "temperature": TEMPERATURE,
            "messages": [{"role": "user", "content": content}],
            **(fmt(schema) if schema is not None else {}), **extra}


#: Issue 33 item 1 and 2: the engine died on the first two (SIGSEGV in llguidance), the third
#: came back clamped with ``finish_reason: "stop"``. Sent six in a row before the soak.
CRASH_CLASS: list[tuple[str, Any]] = [
    ("int_min_neg2e63", obj({"type": "integer", "minimum": -2**63, "maximum": -2**63 + 5})),
    ("int_min_neg2e63_plus1", obj({"type": "integer", "minimum": -2**63 + 1,
                                   "maximum": -2**63 + 6})),
    ("int_min_2e64", obj({"type": "integer", "minimum": 2**64, "maximum": 2**64 + 1})),
]


def crash_class_cases() -> list[Case]:
    """The crash-class schemas as ``response_format``, each also at the root, then streamed."""
    out = [Case(f"crash_{name}", CHAT, body(schema), expect=FOUR_XX)
           for name, schema in CRASH_CLASS]
    out += [Case(f"crash_{name}_root", CHAT, body(schema["properties"]["n"]), expect=FOUR_XX)
            for name, schema in CRASH_CLASS]
    out += [Case(f"crash_{name}_stream", CHAT, body(schema, stream=True),
                 expect=FOUR_XX_OR_OK)  # a stream's status may come before its refusal
            for name, schema in CRASH_CLASS]
    return out


def _bounds() -> list[tuple[str, Any]]:
    """Bounds at +-2**53, +-2**63, +-2**64 (and one past), 1e308 and the largest double."""
    out: list[tuple[str, Any]] = []
    for label, x in (("2e53", 2**53), ("2e63", 2**63), ("2e64", 2**64)):
        for sign, v in (("", x), ("neg", -x)):
            tag = sign + label
            out += [
                (f"int_range_{tag}", {"type": "integer", "minimum": v, "maximum": v + 5}),
                (f"int_range_below_{tag}", {"type": "integer", "minimum": v - 3,
                                            "maximum": v - 1}),
                (f"int_exclusive_{tag}", {"type": "integer", "exclusiveMinimum": v - 1,
                                          "exclusiveMaximum": v + 1}),
                (f"int_min_{tag}", {"type": "integer", "minimum": v}),
                (f"int_max_{tag}", {"type": "integer", "maximum": v}),
                (f"num_min_{tag}", {"type": "number", "minimum": v}),
                (f"num_excl_max_{tag}", {"type": "number", "exclusiveMaximum": v}),
                (f"int_const_{tag}", {"type": "integer", "const": v}),
            ]
    big = 1.7976931348623157e308
    out += [
        ("num_min_1e308", {"type": "number", "minimum": 1e308}),
        ("num_max_neg1e308", {"type": "number", "maximum": -1e308}),
        ("num_range_1e308_max_double", {"type": "number", "minimum": 1e308, "maximum": big}),
        ("num_excl_min_1e308", {"type": "number", "exclusiveMinimum": 1e308}),
        ("int_min_1e308", {"type": "integer", "minimum": 1e308}),
        ("num_range_neg1e308_1e308", {"type": "number", "minimum": -1e308, "maximum": 1e308}),
        ("int_enum_edges", {"enum": [2**64, -2**63, 2**53 + 1, 1e308]}),
        ("int_int64_format", {"type": "integer", "format": "int64", "minimum": 2**63 - 2}),
    ]
    return out


def _multiple_of() -> list[tuple[str, Any]]:
    return [
        ("mult_int_2e64", {"type": "integer", "multipleOf": 2**64}),
        ("mult_int_2e63_min1", {"type": "integer", "multipleOf": 2**63, "minimum": 1}),
        ("mult_num_1e308", {"type": "number", "multipleOf": 1e308}),
        ("mult_num_1e-300", {"type": "number", "multipleOf": 1e-300}),
        ("mult_num_1e-9_range", {"type": "number", "multipleOf": 1e-9, "minimum": 0,
                                 "maximum": 1}),
        ("mult_num_0.1", {"type": "number", "multipleOf": 0.1, "minimum": 0, "maximum": 1}),
        ("mult_int_7_at_2e53", {"type": "integer", "multipleOf": 7, "minimum": 2**53,
                                "maximum": 2**53 + 20}),
        ("mult_num_0.01_max_2e53", {"type": "number", "multipleOf": 0.01, "maximum": 2**53}),
        ("mult_int_3_none_between", {"type": "integer", "multipleOf": 3, "minimum": 4,
                                     "maximum": 5}),
    ]


_CONTAINS = {"type": "array", "items": {"type": "string"}, "contains": {"const": "lang:en"}}


def _arrays() -> list[tuple[str, Any]]:
    return [
        ("contains_lang_en", _CONTAINS),
        ("contains_lang_en_in_object", obj(_CONTAINS, "tags")),
        ("contains_min2_max3", {**_CONTAINS, "minContains": 2, "maxContains": 3}),
        ("contains_unique_max3", {**_CONTAINS, "uniqueItems": True, "maxItems": 3}),
        ("contains_int", {"type": "array", "items": {"type": "integer"},
                          "contains": {"minimum": 2**63}}),
        ("contains_prefix_items", {"type": "array", "prefixItems": [{"type": "integer"}],
                                   "items": {"type": "string"}, "contains": {"const": "z"}}),
        ("unique_enum_unsatisfiable", {"type": "array", "items": {"enum": ["a", "b"]},
                                       "uniqueItems": True, "minItems": 3}),
        ("min_items_1e6", {"type": "array", "items": {"type": "integer"},
                           "minItems": 1_000_000}),
    ]


#: Look-around, back-references and the other constructs a ``pattern`` may use.
PATTERNS = [
    "^(?!x)[a-z]{2}$", "(?<=a)b", r"(?=\d)", r"(a)\1", r"^(a|b)\1$", "(?<!a)b$",
    "^(?=.*[A-Z])(?=.*[0-9]).{4,8}$", r"\bfoo\b", "^a*+b$", "(?m)^b$", "^(?>a+)b$",
    r"^(?P<q>a)(?P=q)$", "^[[:alpha:]]$", r"^\p{L}+$", "^(?i)abc$", "(?x)^a b$",
    r"^\u00e9+$", "^(a)?(?(1)b|c)$", r"^\d{3}-\d{4}$", r"^[^\x00-\x1f]*$", "(?!)", "^$",
]


def _patterns() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [(f"pattern_{i}", obj({"type": "string", "pattern": p}, "v"))
                                  for i, p in enumerate(PATTERNS)]
    out += [
        ("pattern_lookaround_anyof", obj({"anyOf": [
            {"type": "string", "pattern": "^(?!x)[a-z]{2}$"},
            {"type": "string", "pattern": r"(a)\1"}]}, "v")),
        ("pattern_properties_lookbehind", {"type": "object", "patternProperties": {
            "(?<=a)b": {"type": "integer"}}, "additionalProperties": False}),
        ("property_names_lookahead", {"type": "object",
                                      "propertyNames": {"pattern": "^(?!x)[a-z]{2}$"},
                                      "additionalProperties": {"type": "integer"}}),
        ("pattern_min_length_contradiction", obj({"type": "string", "pattern": "^[a-z]{2}$",
                                                  "minLength": 5}, "v")),
        ("pattern_with_format", obj({"type": "string", "format": "email",
                                     "pattern": "(?<=@)example"}, "v")),
        ("pattern_invalid", obj({"type": "string", "pattern": "a{2,1}"}, "v")),
    ]
    return out


def _combinations() -> list[tuple[str, Any]]:
    deep: Any = {"type": "integer", "minimum": -2**63}
    for _ in range(60):
        deep = {"type": "array", "items": deep, "maxItems": 1}
    return [
        ("props_2000_optional", {"type": "object", "properties": {
            f"p{i}": {"type": "string"} for i in range(2000)}}),
        ("props_2000_optional_ints", {"type": "object", "properties": {
            f"p{i}": {"type": "integer", "minimum": 2**63} for i in range(2000)}}),
        ("enum_500_strings", obj({"enum": [f"value-{i}" for i in range(500)]}, "v")),
        ("allof_contradictory_ints", obj({"allOf": [{"type": "integer", "minimum": 10},
                                                    {"maximum": 5}]})),
        ("anyof_50_huge_bounds", obj({"anyOf": [
            {"type": "integer", "minimum": 2**63 + i, "maximum": 2**63 + i + 1}
            for i in range(50)]})),
        ("oneof_overlapping_2e53", obj({"oneOf": [{"type": "integer", "maximum": 2**53},
                                                  {"type": "integer", "minimum": 2**53}]})),
        ("not_integer_number_2e64", obj({"type": "number", "not": {"type": "integer"},
                                         "minimum": 2**64})),
        ("if_then_else_bounds", obj({"type": "integer", "if": {"minimum": 0},
                                     "then": {"maximum": 2**64}, "else": {"minimum": -2**63}})),
        ("max_length_1e9", obj({"type": "string", "maxLength": 10**9}, "v")),
        ("min_length_1e6", obj({"type": "string", "minLength": 10**6}, "v")),
        ("nested_60_arrays_neg2e63", deep),
        ("ref_recursive_contains", {"$defs": {"t": {"type": "object", "properties": {
            "tags": _CONTAINS, "kids": {"type": "array", "items": {"$ref": "#/$defs/t"},
                                        "maxItems": 2}}, "required": ["tags"]}},
            "$ref": "#/$defs/t"}),
        ("dependent_required_bounds", {"type": "object", "properties": {
            "a": {"type": "integer", "maximum": -2**63}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]}}),
        ("nullable_huge_const", obj({"type": ["integer", "null"], "const": 2**64})),
        ("empty_enum", obj({"enum": []})),
    ]


def _other_routes() -> list[Case]:
    """The same inputs as tool parameters and a regex constraint."""
    bound = obj({"type": "integer", "minimum": -2**63, "maximum": -2**63 + 5})
    base = body(None)
    return [
        Case("tool_neg2e63", CHAT, {**base, "tools": [tool(bound)], "tool_choice": "required"},
             expect=FOUR_XX_OR_OK),
        Case("tool_contains", CHAT, {**base, "tools": [tool(obj(_CONTAINS, "tags"))],
                                     "tool_choice": "required"}, expect=FOUR_XX_OR_OK),
        Case("tool_lookahead", CHAT, {**base, "tools": [tool(obj(
            {"type": "string", "pattern": "^(?!x)[a-z]{2}$"}, "v"))],
            "tool_choice": "required"}, expect=FOUR_XX_OR_OK),
        Case("regex_lookahead", CHAT, {**base, "regex": "^(?!x)[a-z]{2}$"},
             expect=FOUR_XX_OR_OK),
        Case("regex_backref", CHAT, {**base, "regex": r"(a)\1"}, expect=FOUR_XX_OR_OK),
    ]


def adversarial_cases() -> list[Case]:
    """Every adversarial schema wrapped in an object (``n`` or ``v``) where it is a value,
    plus the crash class, tool and regex routes; a 4xx or a valid reply."""
    wrapped = [(f"adv_{name}", obj(s)) for name, s in _bounds() + _multiple_of()]
    wrapped += [(f"adv_{name}", s) for name, s in _arrays() + _patterns() + _combinations()]
    out = [Case(name, CHAT, body(schema), expect=FOUR_XX_OR_OK) for name, schema in wrapped]
    return out + crash_class_cases() + _other_routes()


def corpus_cases() -> list[Case]:
    """Each schema of ``schemas/`` as ``response_format``, prompted as ``tests/test_constrained``
    prompts it (its description and first valid example); healthy: must get a 200."""
    out = []
    for path in sorted(SCHEMAS_DIR.glob("*.json")):
        item = json.loads(path.read_text(encoding="utf-8"))
        req = body(item["schema"], max_tokens=CORPUS_TOKENS)
        req["messages"] = [
            {"role": "system", "content": "You write JSON that follows the given schema."},
            {"role": "user", "content": f"Task: {item['description']}\nExample: "
                                        f"{json.dumps(item['valid'][0])}\nWrite another "
                                        f"realistic example as JSON."}]
        out.append(Case(f"corpus_{path.stem}", CHAT, req, expect=OK))
    return out
