"""Test helper: the rules the bundled schema corpus (schemas/) is held to, and the tools that check
them: the loader, a subschema walker, OpenAI strict-mode violations, and a checker that a valid
instance is exactly what a schema-order grammar would emit (tests/test_schemas_corpus.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"

CATEGORIES = {
    "tool_args",
    "extraction",
    "nested",
    "enum",
    "numeric",
    "string",
    "optional",
    "union",
    "recursive",
    "pydantic",
    "hard",
}
REQUIRED_KEYS = {
    "name",
    "description",
    "category",
    "strict_compatible",
    "schema",
    "valid",
    "invalid",
}
OPTIONAL_KEYS = {"pydantic_model"}

# Keywords that grammar engines usually cannot enforce. Only the "hard" category may use them.
HARD_KEYWORDS = {
    "not",
    "if",
    "then",
    "else",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "dependentSchemas",
    "dependentRequired",
    "patternProperties",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
}
MAX_HARD = 2

# OpenAI strict mode (../shared/reference/openai-api.md section 3). These are the only keywords
# allowed. Keywords that OpenAI leaves undocumented (const, minLength, ...) count as unsupported.
STRICT_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "anyOf",
    "$ref",
    "$defs",
    "description",
    "title",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
}
STRICT_FORMATS = {
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
}

MAX_INSTANCE_CHARS = 600  # keeps every instance well under ~150 tokens

Validator = jsonschema.Draft202012Validator

# Keywords whose value is a subschema, a list of them, or a name -> subschema map.
_SUB_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SUB_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUB_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


# --------------------------------------------------------------------------- loader


@lru_cache(maxsize=1)
def load_corpus() -> dict[str, dict[str, Any]]:
    """All corpus entries, keyed by file stem (which equals the entry's ``name``)."""
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(SCHEMAS_DIR.glob("*.json"))
    }


NAMES = sorted(load_corpus())
STRICT_NAMES = [n for n in NAMES if load_corpus()[n].get("strict_compatible") is True]
PYDANTIC_NAMES = [n for n in NAMES if load_corpus()[n].get("category") == "pydantic"]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def resolve_pointer(root: Any, pointer: str) -> Any:
    node = root
    for raw in pointer.split("/")[1:] if pointer else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def walk(schema: Any, pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (JSON pointer, subschema) for every object-form schema in ``schema``."""
    if not isinstance(schema, dict):
        return
    yield pointer, schema
    for kw in _SUB_ONE:
        if kw in schema:
            yield from walk(schema[kw], f"{pointer}/{kw}")
    for kw in _SUB_LIST:
        for i, sub in enumerate(schema.get(kw, [])):
            yield from walk(sub, f"{pointer}/{kw}/{i}")
    for kw in _SUB_MAP:
        for key, sub in schema.get(kw, {}).items():
            yield from walk(sub, f"{pointer}/{kw}/{_escape(key)}")


def strict_violations(schema: dict[str, Any]) -> list[str]:
    """Ways ``schema`` breaks OpenAI strict-mode rules (empty list: strict-compatible)."""
    problems = []
    if schema.get("type") != "object":
        problems.append("root: type must be 'object'")
    if "anyOf" in schema:
        problems.append("root: must not be anyOf")
    for ptr, sub in walk(schema):
        where = ptr or "root"
        extra = set(sub) - STRICT_KEYWORDS
        if extra:
            problems.append(f"{where}: unsupported keywords {sorted(extra)}")
        if "$ref" in sub and len(sub) > 1:
            problems.append(f"{where}: $ref with sibling keywords")
        if "format" in sub and sub["format"] not in STRICT_FORMATS:
            problems.append(f"{where}: format {sub['format']!r} not supported")
        types = sub.get("type")
        types = types if isinstance(types, list) else [types]
        if "object" in types or "properties" in sub:
            if sub.get("additionalProperties") is not False:
                problems.append(f"{where}: additionalProperties must be false")
            props = list(sub.get("properties", {}))
            if sorted(sub.get("required", [])) != sorted(props):
                problems.append(f"{where}: every property must be required")
    return problems


def corpus_validator(schema: Any, *, formats: bool) -> jsonschema.Draft202012Validator:
    return Validator(schema, format_checker=Validator.FORMAT_CHECKER if formats else None)


class SchemaOrderWalker:
    """Checks that a valid instance is exactly what a schema-order grammar would emit.

    Object keys come in ``properties`` order, and an integer-typed value is never a float. Union
    branches count only where the instance validates against them.
    """

    URI = "urn:grammarserve:corpus"

    def __init__(self, root: Any) -> None:
        self.root = root
        resource = Resource.from_contents(root, default_specification=DRAFT202012)
        self.registry = Registry().with_resource(self.URI, resource)

    def is_valid(self, pointer: str, instance: Any) -> bool:
        v = Validator({"$ref": f"{self.URI}#{pointer}"}, registry=self.registry)
        return v.is_valid(instance)

    def problems(self, pointer: str, instance: Any, depth: int = 0) -> list[str]:
        sub = resolve_pointer(self.root, pointer)
        if not isinstance(sub, dict) or depth > 64:
            return []
        out: list[str] = []
        where = pointer or "root"
        if "$ref" in sub:
            ref = sub["$ref"]
            assert ref.startswith("#"), ref
            out += self.problems(ref[1:], instance, depth + 1)
        for kw in ("anyOf", "oneOf"):
            if kw in sub:
                branch_results = [
                    self.problems(f"{pointer}/{kw}/{i}", instance, depth + 1)
                    for i in range(len(sub[kw]))
                    if self.is_valid(f"{pointer}/{kw}/{i}", instance)
                ]
                if not any(r == [] for r in branch_results):
                    out.append(f"{where}: no {kw} branch fits cleanly: {branch_results}")
        types = sub.get("type")
        types = types if isinstance(types, list) else [types] if types else []
        if isinstance(instance, float) and types and "number" not in types:
            out.append(f"{where}: float {instance!r} where only {types} allowed")
        if isinstance(instance, dict):
            props = sub.get("properties", {})
            got = [k for k in instance if k in props]
            want = [k for k in props if k in instance]
            if got != want:
                out.append(f"{where}: keys {got} not in schema order {want}")
            extra_schema = sub.get("additionalProperties")
            for key, value in instance.items():
                if key in props:
                    out += self.problems(f"{pointer}/properties/{_escape(key)}", value, depth + 1)
                elif isinstance(extra_schema, dict):
                    out += self.problems(f"{pointer}/additionalProperties", value, depth + 1)
        if isinstance(instance, list):
            prefix = sub.get("prefixItems", [])
            for i, item in enumerate(instance):
                if i < len(prefix):
                    out += self.problems(f"{pointer}/prefixItems/{i}", item, depth + 1)
                elif isinstance(sub.get("items"), dict):
                    out += self.problems(f"{pointer}/items", item, depth + 1)
        return out
