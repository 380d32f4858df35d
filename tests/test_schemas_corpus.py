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
from typing import Any

import pytest
from corpus_rules import (
    CATEGORIES,
    HARD_KEYWORDS,
    MAX_HARD,
    MAX_INSTANCE_CHARS,
    NAMES,
    OPTIONAL_KEYS,
    PYDANTIC_NAMES,
    REQUIRED_KEYS,
    SCHEMAS_DIR,
    STRICT_NAMES,
    SchemaOrderWalker,
    Validator,
    corpus_validator,
    load_corpus,
    resolve_pointer,
    strict_violations,
    walk,
)

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
            resolve_pointer(schema, ref[1:])  # raises if dangling


@pytest.mark.parametrize("name", NAMES)
def test_valid_instances_validate(name: str) -> None:
    entry = load_corpus()[name]
    validator = corpus_validator(entry["schema"], formats=True)
    for inst in entry["valid"]:
        errors = [e.message for e in validator.iter_errors(inst)]
        assert not errors, f"{inst}: {errors}"


@pytest.mark.parametrize("name", NAMES)
def test_invalid_instances_fail_without_format_checks(name: str) -> None:
    entry = load_corpus()[name]
    with_formats = corpus_validator(entry["schema"], formats=True)
    without_formats = corpus_validator(entry["schema"], formats=False)
    for inst in entry["invalid"]:
        assert not without_formats.is_valid(inst), f"accepted (format-free): {inst}"
        assert not with_formats.is_valid(inst), f"accepted: {inst}"


@pytest.mark.parametrize("name", NAMES)
def test_valid_instances_follow_schema_order(name: str) -> None:
    entry = load_corpus()[name]
    walker = SchemaOrderWalker(entry["schema"])
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
