"""The real-world schema corpus (schemas/realworld/, made by
benchmarks/make_realworld_corpus.py from schemas that check-jsonschema and SchemaStore ship).

Model-free checks hold the corpus itself to its rules: every valid instance validates under the
schema's declared draft (formats checked), every invalid one fails (formats not checked), sizes
are bounded, SOURCES.md names each file's origin and licence.

With the embedded tokenizer, every schema goes through ``GrammarCompiler``: either it compiles,
and then every invalid instance is refused (a hard rule) and the valid ones are accepted token by
token (a valid walk refused is given its causes, ``fsm/exactness.py``); or it is refused with
a ``GrammarError`` naming the keyword (its JSON path, or the backend's message). What is refused, by keyword, and which valid walks fail are exactly
tests/data/realworld_expected.json, so a change shows up as a diff;
GRAMMARSERVE_WRITE_REALWORLD_EXPECTED=1 rewrites it from the current run, to review and commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from grammarserve.errors import GrammarError
from grammarserve.fsm.conformance import (
    FORMS,
    SuiteCase,
    explain_refusal,
    instance_texts,
    load_corpus,
    walk,
)
from grammarserve.fsm.conformance import refusal_keyword as conformance_refusal_keyword
from grammarserve.fsm.exactness import Refusal, tally

REPO = Path(__file__).resolve().parents[1]
REALWORLD = REPO / "schemas" / "realworld"
EXPECTED = REPO / "tests" / "data" / "realworld_expected.json"
MAX_INSTANCES = 5
MAX_INSTANCE_CHARS = 1000
PERMISSIVE = {"Apache-2.0", "MIT", "CC-BY-4.0"}


def _docs() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(REALWORLD.glob("*.json"))}


def _validator(schema: Any, *, formats: bool) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER if formats else None)


# --------------------------------------------------------------------------- the corpus itself


def test_corpus_size_and_sources() -> None:
    docs = _docs()
    assert len(docs) >= 250
    sources = (REALWORLD / "SOURCES.md").read_text(encoding="utf-8")
    for name, doc in docs.items():
        assert doc["name"] == name
        assert doc["license"] in PERMISSIVE, (name, doc["license"])
        assert f"| `{name}` | {doc['source']} | {doc['url']} | {doc['license']} |" in sources
    assert sum(len(d["valid"]) for d in docs.values()) >= 2 * len(docs)
    assert sum(len(d["invalid"]) for d in docs.values()) >= 3 * len(docs)
    total = sum(p.stat().st_size for p in REALWORLD.rglob("*") if p.is_file())
    assert total < 5_000_000, f"the corpus grew to {total} bytes"


def test_instances_are_checked_by_jsonschema() -> None:
    bad = []
    for name, doc in _docs().items():
        assert doc["draft"] == type(_validator(doc["schema"], formats=False)).__name__
        assert len(doc["valid"]) <= MAX_INSTANCES and len(doc["invalid"]) <= MAX_INSTANCES
        strict, loose = (_validator(doc["schema"], formats=f) for f in (True, False))
        for inst in doc["valid"] + doc["invalid"]:
            text = json.dumps(inst, ensure_ascii=False, separators=(",", ":"))
            assert len(text) <= MAX_INSTANCE_CHARS, (name, text[:80])
        bad += [f"{name}: valid fails: {v}" for v in doc["valid"] if not strict.is_valid(v)]
        bad += [f"{name}: invalid passes: {v}" for v in doc["invalid"] if loose.is_valid(v)]
    assert bad == [], "\n".join(bad[:20])


# --------------------------------------------------------------------------- through the compiler

# How a backend's own message names the keyword it refused (llguidance gives no JSON path).
_NAMED = [
    (r'Unimplemented keys: \["([^"]+)"', None), (r"(\w+) constraints are not supported", None),
    (r"Value for '(\w+)'", None), (r"patternProperty regexes", "patternProperties"),
    (r"Unsatisfiable schema", "(no instance)"), (r"Schema 'false' cannot accept", "(no instance)"),
    (r"(\w+) array must not be empty", None), (r"(\w+) must be an array", None),
    (r"Cannot find field", "$ref"), (r"is not present in a registry", "$ref"),
]


def refusal_keyword(e: GrammarError) -> str:
    """The keyword a refusal names (see ``conformance.refusal_keyword``), with this corpus's
    table of backend messages."""
    return conformance_refusal_keyword(e, _NAMED)


def run_corpus(compiler: Any, tokenizer: Any, cases: list[SuiteCase]) -> dict[str, Any]:
    """Compile and walk every case; the counts, refusals by keyword, valid walks refused and
    invalid instances accepted."""
    bitmask = compiler.allocate_bitmask(1)
    stop = compiler.stop_token_ids[0]
    counts = {"schemas_ok": 0, "schemas_refused": 0, "valid_ok": 0, "valid_refused": 0,
              "invalid_refused": 0}
    refused: dict[str, list[str]] = {}
    valid_refused: list[str] = []
    causes: list[Refusal] = []
    accepted: list[str] = []
    for case in cases:
        name = case.file.removesuffix(".json")
        try:
            grammar = compiler.compile_json_schema(case.schema)
        except GrammarError as e:
            assert str(e).strip(), f"{name}: refused without a message"
            counts["schemas_refused"] += 1
            refused.setdefault(refusal_keyword(e), []).append(name)
            continue
        counts["schemas_ok"] += 1
        for desc, instance, valid in case.tests:
            texts = instance_texts(instance) if valid else instance_texts(instance)[:1]
            for form, text in zip(FORMS, texts):
                ids = tokenizer.encode(text, add_special_tokens=False)
                ok, _ = walk(grammar.matcher(), ids, stop, bitmask)
                if valid and ok:
                    counts["valid_ok"] += 1
                elif valid:
                    counts["valid_refused"] += 1
                    found = Refusal(name, desc, form, explain_refusal(
                        compiler, case.schema, instance, form, tokenizer, bitmask))
                    causes.append(found)
                    valid_refused.append(f"{name} | {desc} | {form} | {found.label}")
                elif ok:
                    accepted.append(f"{name} | {desc} | {text[:200]}")
                else:
                    counts["invalid_refused"] += 1
    return {"counts": counts, "refused": {k: sorted(v) for k, v in sorted(refused.items())},
            "valid_refused": valid_refused, "valid_refused_by_cause": tally(causes),
            "invalid_accepted": accepted}


def _diff(expected: dict[str, list[str]], got: dict[str, list[str]]) -> list[str]:
    def pairs(d: dict[str, list[str]]) -> set[tuple[str, str]]:
        return {(k, name) for k, names in d.items() for name in names}

    return ([f"now refused ({k}): {n}" for k, n in sorted(pairs(got) - pairs(expected))]
            + [f"no longer refused ({k}): {n}" for k, n in sorted(pairs(expected) - pairs(got))])


@pytest.mark.model
def test_realworld_corpus_through_the_compiler(tokenizer: Any) -> None:
    """0 invalid instances accepted; refusals and valid walks refused exactly as expected."""
    from grammarserve.fsm import GrammarCompiler

    # NOTE: as in test_fsm_conformance.py: everything a schema allows (open_schemas), and no
    # compile timeout (a loaded machine must not turn a slow compile into a refusal). No
    # background upgrade: every walk uses the grammar the first requests get (llguidance, else
    # xgrammar), so results do not depend on timing, and no upgrade outlives the test
    # (bench_grammar.py's steady figures walk the upgraded grammars).
    compiler = GrammarCompiler(tokenizer, open_schemas=True, compile_timeout_s=600,
                               background_upgrade=False)
    cases = list(load_corpus(REALWORLD))
    got = run_corpus(compiler, tokenizer, cases)
    counts, refused = got["counts"], got["refused"]
    print(f"\nrealworld: {counts}; refused per keyword: "
          f"{ {k: len(v) for k, v in refused.items()} }")
    assert got["invalid_accepted"] == [], "INVALID ACCEPTED:\n" + "\n".join(
        got["invalid_accepted"][:20])
    assert counts["schemas_ok"] + counts["schemas_refused"] == len(cases)
    if os.environ.get("GRAMMARSERVE_WRITE_REALWORLD_EXPECTED"):
        EXPECTED.write_text(json.dumps({k: got[k] for k in (
            "counts", "refused", "valid_refused", "valid_refused_by_cause")},
                                       indent=1, sort_keys=True) + "\n")
    expected = json.loads(EXPECTED.read_text())
    assert _diff(expected["refused"], refused) == []
    walks = set(got["valid_refused"]) ^ set(expected["valid_refused"])
    assert walks == set(), "valid walks refused that were not, or accepted that were not:\n" + \
        "\n".join(sorted(walks)[:20])
    assert counts == expected["counts"]
    assert got["valid_refused_by_cause"] == expected["valid_refused_by_cause"]
