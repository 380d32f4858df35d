"""Checks on the bundled schema corpus in schemas/ (fast, no model).

Each ``schemas/<name>.json`` holds a JSON Schema (draft 2020-12), instances that must validate and
near-miss instances that must not (see schemas/README.md). Grammar tests and benchmarks use these
instances as ground truth, so this file holds them to a higher bar than "jsonschema agrees". Valid
instances follow schema key order and use no integer-valued floats. Invalid instances fail without
relying on ``format``. ``strict_compatible`` is exactly right. Keywords that grammar engines cannot
enforce appear only in the ``hard`` category.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
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


def _resolve_pointer(root: Any, pointer: str) -> Any:
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


def _validator(schema: Any, *, formats: bool) -> jsonschema.Draft202012Validator:
    return Validator(schema, format_checker=Validator.FORMAT_CHECKER if formats else None)


class _Walker:
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
        sub = _resolve_pointer(self.root, pointer)
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


# --------------------------------------------------------------------------- corpus-wide


def test_corpus_size_and_mix() -> None:
    corpus = load_corpus()
    assert len(corpus) >= 40
    cats = [e["category"] for e in corpus.values()]
    assert set(cats) <= CATEGORIES, set(cats) - CATEGORIES
    for cat in CATEGORIES - {"hard"}:
        assert cats.count(cat) >= 2, f"category {cat} has {cats.count(cat)} schemas"
    assert cats.count("pydantic") >= 6
    assert 1 <= cats.count("hard") <= MAX_HARD
    assert len(STRICT_NAMES) >= 15
    recursive = [n for n, e in corpus.items() if any("$ref" in sub for _, sub in walk(e["schema"]))]
    assert len(recursive) >= 5


def test_names_unique_and_match_files() -> None:
    names = [e["name"] for e in load_corpus().values()]
    assert len(names) == len(set(names))
    for stem, entry in load_corpus().items():
        assert entry["name"] == stem
        assert re.fullmatch(r"[a-z][a-z0-9_]*", stem), stem


def test_readme_lists_every_schema() -> None:
    readme = (SCHEMAS_DIR / "README.md").read_text(encoding="utf-8")
    for name in NAMES:
        entry = load_corpus()[name]
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"{name} missing from schemas/README.md"
        assert f"| {entry['category']} |" in row
        assert ("| yes |" in row) == entry["strict_compatible"]


def test_no_python_under_schemas() -> None:
    assert not list(SCHEMAS_DIR.rglob("*.py"))


# --------------------------------------------------------------------------- per schema


@pytest.mark.parametrize("name", NAMES)
def test_entry_format(name: str) -> None:
    entry = load_corpus()[name]
    assert REQUIRED_KEYS <= set(entry), REQUIRED_KEYS - set(entry)
    assert set(entry) <= REQUIRED_KEYS | OPTIONAL_KEYS, set(entry) - REQUIRED_KEYS - OPTIONAL_KEYS
    assert isinstance(entry["description"], str) and entry["description"].strip()
    assert entry["category"] in CATEGORIES
    assert isinstance(entry["strict_compatible"], bool)
    assert isinstance(entry["schema"], dict)
    assert isinstance(entry["valid"], list) and len(entry["valid"]) >= 3
    assert isinstance(entry["invalid"], list) and len(entry["invalid"]) >= 2
    dumped_valid = {json.dumps(v, sort_keys=True) for v in entry["valid"]}
    assert len(dumped_valid) == len(entry["valid"]), "duplicate valid instances"
    for inst in entry["invalid"]:
        assert json.dumps(inst, sort_keys=True) not in dumped_valid
    for inst in entry["valid"] + entry["invalid"]:
        assert len(json.dumps(inst)) <= MAX_INSTANCE_CHARS, f"instance too long: {inst}"
    assert ("pydantic_model" in entry) == (entry["category"] == "pydantic")


@pytest.mark.parametrize("name", NAMES)
def test_schema_is_valid_2020_12(name: str) -> None:
    schema = load_corpus()[name]["schema"]
    Validator.check_schema(schema)
    for ptr, sub in walk(schema):
        if "$ref" in sub:
            ref = sub["$ref"]
            assert ref.startswith("#"), f"{ptr}: non-local $ref {ref}"
            _resolve_pointer(schema, ref[1:])  # raises if dangling


@pytest.mark.parametrize("name", NAMES)
def test_valid_instances_validate(name: str) -> None:
    entry = load_corpus()[name]
    validator = _validator(entry["schema"], formats=True)
    for inst in entry["valid"]:
        errors = [e.message for e in validator.iter_errors(inst)]
        assert not errors, f"{inst}: {errors}"


@pytest.mark.parametrize("name", NAMES)
def test_invalid_instances_fail_without_format_checks(name: str) -> None:
    entry = load_corpus()[name]
    with_formats = _validator(entry["schema"], formats=True)
    without_formats = _validator(entry["schema"], formats=False)
    for inst in entry["invalid"]:
        assert not without_formats.is_valid(inst), f"accepted (format-free): {inst}"
        assert not with_formats.is_valid(inst), f"accepted: {inst}"


@pytest.mark.parametrize("name", NAMES)
def test_valid_instances_follow_schema_order(name: str) -> None:
    entry = load_corpus()[name]
    walker = _Walker(entry["schema"])
    for inst in entry["valid"]:
        assert walker.problems("", inst) == [], inst


@pytest.mark.parametrize("name", NAMES)
def test_hard_keywords_only_in_hard_category(name: str) -> None:
    entry = load_corpus()[name]
    used = {kw for _, sub in walk(entry["schema"]) for kw in sub if kw in HARD_KEYWORDS}
    if entry["category"] == "hard":
        assert used, "a 'hard' schema should use a keyword grammar engines cannot enforce"
    else:
        assert not used, f"uses {sorted(used)}; only category 'hard' may"


@pytest.mark.parametrize("name", NAMES)
def test_strict_compatible_flag_is_exact(name: str) -> None:
    entry = load_corpus()[name]
    problems = strict_violations(entry["schema"])
    if entry["strict_compatible"]:
        assert problems == []
    else:
        assert problems, "satisfies OpenAI strict rules: mark strict_compatible true"


@pytest.mark.parametrize("name", PYDANTIC_NAMES)
def test_pydantic_schema_is_model_output(name: str) -> None:
    pydantic = pytest.importorskip("pydantic")
    entry = load_corpus()[name]
    source = entry["pydantic_model"]
    header = re.match(r"# pydantic (\d+\.\d+)\.\S*; schema = (\w+)\.model_json_schema\(\)", source)
    assert header, "pydantic_model must start with the generating header line"
    namespace: dict[str, Any] = {}
    code = compile(source, f"schemas/{name}.json:pydantic_model", "exec", dont_inherit=True)
    exec(code, namespace)  # noqa: S102 (our own model source, from schemas/)
    model = namespace[header.group(2)]
    if pydantic.VERSION.rsplit(".", 1)[0] == header.group(1):
        assert model.model_json_schema() == entry["schema"]
    for inst in entry["valid"]:
        assert model.model_validate(inst).model_dump(mode="json", by_alias=True) == inst
    for inst in entry["invalid"]:
        with pytest.raises(pydantic.ValidationError):
            model.model_validate(inst)


def test_strict_checker_catches_violations() -> None:
    """The strict-rule checker itself rejects each rule's classic violation."""
    ok = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert strict_violations(ok) == []
    assert strict_violations({**ok, "required": []})
    assert strict_violations({k: v for k, v in ok.items() if k != "additionalProperties"})
    assert strict_violations({**ok, "properties": {"a": {"type": "string", "minLength": 1}}})
    assert strict_violations({"anyOf": [ok]})
    nested = {
        **ok,
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
        },
    }
    assert strict_violations(nested)
