"""Conformance of the grammar layer on real schemas, with the SmolLM2 tokenizer:
the JSON-Schema-Test-Suite (draft 2020-12), the schemas/ corpus, pydantic models and
jump-forward equivalence."""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Any, Literal

import pytest
from walk_helpers import walk_jump_forward

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import (
    FORMS,
    SuiteCase,
    explain_refusal,
    instance_texts,
    load_corpus,
    load_suite,
    walk,
)
from grammarserve.fsm.conformance import refusal_keyword as conformance_refusal_keyword
from grammarserve.fsm.exactness import Cause, Refusal, tally

pytestmark = pytest.mark.model  # every test here uses the embedded model


REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"
CORPUS = REPO / "schemas"
# What each backend refuses in the suite, keyword by keyword, and the walk counts of the rest.
# A change (a backend upgrade, a new keyword handled) shows up as a diff against this file;
# GRAMMARSERVE_WRITE_SUITE_EXPECTED=1 rewrites it from the current run, to review and commit.
SUITE_EXPECTED = REPO / "tests" / "data" / "suite_expected.json"
# The corpus schemas auto refuses on purpose (schemas/README.md), by keyword: none.
# (hard_shipping_conditional.json compiles: its ``not`` and ``if`` are rewritten exactly;
# hard_unique_tags.json's ``uniqueItems`` and ``contains`` are value checks, fsm/checked_matcher.py.)
CORPUS_REFUSED_AUTO: dict[str, list[str]] = {}

# Valid instances refused are explained by a documented rule (fsm/exactness.py's causes: key
# order, integers without a fraction, ``format`` asserted in every draft...), found by rewriting
# the instance or compiling the schema without the rule; an unexplained refusal fails the test.


@pytest.fixture(scope="module")
def compilers(tokenizer: Any) -> dict[str, GrammarCompiler]:
    # NOTE: the language checks need everything a schema allows (open_schemas); the default
    # narrowing to named properties is tested in test_fsm_closed.py.
    # xgrammar has no ``indented`` style (see XGrammarBackend), so alone it walks the three
    # forms with flexible whitespace.
    # The compile timeout is lifted: these tests say what is refused, and a loaded machine must
    # not turn a slow compile into a refusal.
    # Upgrades at normal priority: a test waits for one, and beside busy processes the default
    # niceness 19 starves it for tens of minutes.
    auto = GrammarCompiler(tokenizer, open_schemas=True, compile_timeout_s=600,
                           upgrade_niceness=0)
    return {"auto": auto, "llguidance": auto.with_backend("llguidance"),
            "xgrammar": GrammarCompiler(tokenizer, backend="xgrammar", json_style="flexible",
                                        open_schemas=True, compile_timeout_s=600)}


# How a backend's own message names the keyword it refused (llguidance gives no JSON path).
_NAMED = [
    (r'Unimplemented keys: \["([^"]+)"', None), (r"(\w+) constraints are not supported", None),
    (r"Value for '(\w+)'", None), (r"patternProperty regexes", "patternProperties"),
    (r"Unsatisfiable schema", "(no instance)"), (r"is not present in a registry", "$schema"),
    (r"Schema 'false' cannot accept", "(no instance)"), (r"(\w+) array must not be empty", None),
    (r"(\w+) must be an array", None), (r"Cannot find field", "$ref"),
]


def refusal_keyword(e: GrammarError) -> str:
    """The keyword a refusal names (see ``conformance.refusal_keyword``), with this corpus's
    table of backend messages."""
    return conformance_refusal_keyword(e, _NAMED)


def _run_cases(compiler: GrammarCompiler, tokenizer: Any, cases: list[SuiteCase],
               explain: bool) -> dict[str, Any]:
    """Compile and walk ``cases``; with ``explain``, a refused valid walk a documented cause
    explains is counted under it (``valid_documented``), else every one is a failure."""
    bitmask = compiler.allocate_bitmask(1)
    stop = compiler.stop_token_ids[0]
    counts: dict[str, Any] = {"schemas_ok": 0, "schemas_refused": 0, "valid_ok": 0,
                              "valid_documented": 0, "invalid_refused": 0}
    causes: list[Refusal] = []
    refused: dict[str, list[str]] = {}  # keyword -> "file | schema description"
    failures: list[str] = []
    for case in cases:
        try:
            grammar = compiler.compile_json_schema(case.schema)
        except GrammarError as e:
            counts["schemas_refused"] += 1
            refused.setdefault(refusal_keyword(e), []).append(f"{case.file} | {case.description}")
            continue
        counts["schemas_ok"] += 1
        for desc, instance, valid in case.tests:
            texts = instance_texts(instance) if valid else instance_texts(instance)[:1]
            for form, text in zip(FORMS, texts):
                ids = tokenizer.encode(text, add_special_tokens=False)
                ok, why = walk(grammar.matcher(), ids, stop, bitmask)
                found = frozenset({Cause.UNEXPLAINED})
                if valid and not ok and explain:
                    found = explain_refusal(compiler, case.schema, instance, form, tokenizer,
                                            bitmask)
                if valid and ok:
                    counts["valid_ok"] += 1
                elif valid and Cause.UNEXPLAINED not in found:
                    counts["valid_documented"] += 1
                    causes.append(Refusal(f"{case.file} | {case.description}", desc, form, found))
                elif valid:
                    failures.append(f"valid refused: {case.file} | {case.description} | "
                                    f"{desc} | {text!r}: {why}")
                elif not ok:
                    counts["invalid_refused"] += 1
                else:
                    failures.append(f"INVALID ACCEPTED: {case.file} | {case.description} | "
                                    f"{desc} | {text!r}")
    counts["failures"] = failures
    counts["refused"] = {k: sorted(v) for k, v in sorted(refused.items())}
    counts["valid_documented_by_cause"] = tally(causes)
    return counts


def _diff(expected: dict[str, list[str]], got: dict[str, list[str]]) -> list[str]:
    def pairs(d: dict[str, list[str]]) -> set[tuple[str, str]]:
        return {(k, name) for k, names in d.items() for name in names}

    return ([f"now refused ({k}): {n}" for k, n in sorted(pairs(got) - pairs(expected))]
            + [f"no longer refused ({k}): {n}" for k, n in sorted(pairs(expected) - pairs(got))])


@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar"])
def test_json_schema_test_suite(backend: str, compilers: dict[str, GrammarCompiler],
                                tokenizer: Any) -> None:
    """Every valid instance of a compiled schema is accepted (or refused for a documented
    reason), every invalid one refused; the schemas refused at compile time are exactly the
    expected list, keyword by keyword (tests/data/suite_expected.json), and so are the counts."""
    counts = _run_cases(compilers[backend], tokenizer, list(load_suite(SUITE)), explain=True)
    failures, refused = counts.pop("failures"), counts.pop("refused")
    print(f"\n{backend}: {counts}; refused per keyword: "
          f"{ {k: len(v) for k, v in refused.items()} }")
    assert failures == [], "\n".join(failures[:20])
    assert counts["schemas_ok"] + counts["schemas_refused"] == 383
    expected = json.loads(SUITE_EXPECTED.read_text()) if SUITE_EXPECTED.exists() else {}
    if os.environ.get("GRAMMARSERVE_WRITE_SUITE_EXPECTED"):
        expected[backend] = {"counts": counts, "refused": refused}
        SUITE_EXPECTED.write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    assert _diff(expected[backend]["refused"], refused) == []
    assert counts == expected[backend]["counts"]


@pytest.mark.skipif(not CORPUS.is_dir(), reason="schemas/ not present")
@pytest.mark.parametrize("backend", ["auto", "xgrammar"])
def test_schemas_corpus(backend: str, compilers: dict[str, GrammarCompiler],
                        tokenizer: Any) -> None:
    cases = list(load_corpus(CORPUS))
    counts = _run_cases(compilers[backend], tokenizer, cases, explain=False)
    failures, refused = counts.pop("failures"), counts.pop("refused")
    print(f"\n{backend}: {counts}; refused: {refused}")
    assert failures == [], "\n".join(failures[:20])
    if backend == "auto":  # only the deliberately unsupported schemas are refused
        assert refused == CORPUS_REFUSED_AUTO


@pytest.mark.skipif(not CORPUS.is_dir(), reason="schemas/ not present")
def test_strict_compatible_corpus_schemas_compile_strict(compilers: dict[str, GrammarCompiler]
                                                         ) -> None:
    n = 0
    for path in sorted(CORPUS.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("strict_compatible"):
            compilers["auto"].compile_json_schema(doc["schema"], strict=True)
            n += 1
    assert n > 0


@pytest.mark.skipif(not CORPUS.is_dir(), reason="schemas/ not present")
@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_jump_forward_equals_token_by_token(backend: str, compilers: dict[str, GrammarCompiler],
                                            tokenizer: Any) -> None:
    import xgrammar as xgr

    compiler = compilers[backend]
    token_bytes = xgr.TokenizerInfo.from_huggingface(tokenizer).decoded_vocab
    bitmask, stop = compiler.allocate_bitmask(1), compiler.stop_token_ids[0]
    total_forced = walked = 0
    for case in load_corpus(CORPUS):
        try:
            grammar = compiler.compile_json_schema(case.schema)
        except GrammarError:
            continue
        for _, instance, valid in case.tests:
            if not valid:
                continue
            for text in instance_texts(instance)[:2]:
                ok, reason, forced = walk_jump_forward(grammar.matcher(), text, tokenizer,
                                                       bitmask, stop, token_bytes)
                assert ok, (case.file, text, reason)
                total_forced += forced
                walked += 1
    assert walked > 100 and total_forced > 0


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"


def _pydantic_models() -> list[Any]:
    from pydantic import BaseModel, Field

    class Address(BaseModel):
        street: str
        zip_code: str | None = None

    class Item(BaseModel):
        name: str = Field(min_length=1, max_length=40)
        qty: int = Field(ge=1, le=1000)
        tags: list[str] = []

    class Order(BaseModel):
        id: int
        color: Color
        kind: Literal["retail", "wholesale"]
        address: Address
        items: list[Item]
        note: str | None = None
        price: int | float = 0

    class Node(BaseModel):
        value: int
        children: list[Node] = []

    class Cat(BaseModel):
        pet_type: Literal["cat"]
        lives: int

    class Dog(BaseModel):
        pet_type: Literal["dog"]
        bark: bool

    class Owner(BaseModel):
        pet: Cat | Dog = Field(discriminator="pet_type")

    return [
        Order(id=1, color=Color.RED, kind="retail", address=Address(street="1 Main St"),
              items=[Item(name="pen", qty=3, tags=["office"])], price=2.5),
        Order(id=2, color=Color.GREEN, kind="wholesale",
              address=Address(street="x", zip_code="12345"), items=[], note="rush"),
        Node(value=1, children=[Node(value=2, children=[Node(value=3)]), Node(value=4)]),
        Owner(pet=Cat(pet_type="cat", lives=9)),
        Owner(pet=Dog(pet_type="dog", bark=True)),
    ]


def test_pydantic_models_accept_their_own_dump(compilers: dict[str, GrammarCompiler],
                                               tokenizer: Any) -> None:
    pytest.importorskip("pydantic")
    compiler = compilers["auto"]
    bitmask = compiler.allocate_bitmask(1)
    for model in _pydantic_models():
        grammar = compiler.compile_json_schema(type(model).model_json_schema())
        spaced = json.dumps(json.loads(model.model_dump_json()))
        for text in (model.model_dump_json(), spaced):  # the two forms of json_style="auto"
            ids = tokenizer.encode(text, add_special_tokens=False)
            ok, why = walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)
            assert ok, (type(model).__name__, text, why)


def test_auto_upgrades_exact_schemas_to_xgrammar(compilers: dict[str, GrammarCompiler],
                                                 tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "days": {"type": "integer", "minimum": 1}},
              "required": ["city", "days"], "additionalProperties": False}
    grammar = compilers["auto"].compile_json_schema(schema)
    assert grammar.backend == "llguidance" and grammar.upgrade_future is None
    grammar.matcher()
    grammar.matcher()  # reuse starts the upgrade
    # NOTE: no wall-clock limit: on a busy machine the low-priority upgrade waits its turn
    assert grammar.upgrade_future is not None and grammar.upgrade_future.result()
    assert grammar.backend == "xgrammar"
    bitmask = compilers["auto"].allocate_bitmask(1)
    ids = tokenizer.encode('{"city": "Oslo", "days": 0}', add_special_tokens=False)
    assert not walk(grammar.matcher(), ids, 2, bitmask)[0]
    ids = tokenizer.encode('{"city": "Oslo", "days": 3}', add_special_tokens=False)
    assert walk(grammar.matcher(), ids, 2, bitmask)[0]


def test_auto_keeps_llguidance_where_xgrammar_masks_are_slow(
        compilers: dict[str, GrammarCompiler]) -> None:
    from grammarserve.fsm.backends.xgrammar_subset import slow_masks_at

    open_object = {"type": "object", "properties": {"name": {"type": "string"}},
                   "additionalProperties": True}
    assert slow_masks_at(open_object) == "$"
    assert slow_masks_at({"type": "object", "properties": {"a": {"type": "object", "properties":
                          {"b": {"type": "string"}}}}, "additionalProperties": False}) \
        == "$.properties.a"
    assert slow_masks_at({"type": "object", "additionalProperties": {"type": "string"}}) is None
    assert slow_masks_at({**open_object, "additionalProperties": False}) is None
    grammar = compilers["auto"].compile_json_schema(open_object)  # in xgrammar's exact subset
    grammar.matcher()
    grammar.matcher()  # reuse would start the upgrade
    future = grammar.request_upgrade()
    assert future is None or not future.result()
    assert grammar.backend == "llguidance"
