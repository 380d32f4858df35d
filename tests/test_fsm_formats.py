"""``format`` through compiled grammars (issue 36 item 1), with the SmolLM2 tokenizer.

- The JSON-Schema-Test-Suite's ``optional/`` suites that apply to generation, walked token by
  token through each backend's grammar: ``optional/format/*`` (leap days, leap seconds, ipv4
  leading zeros, ...), ``bignum`` and ``float-overflow`` (numbers), ``ecmascript-regex`` and
  ``non-bmp-regex`` (``pattern``), and the local-only referencing and keyword files
  (``anchor``, ``dynamicRef``, ``id``, ``no-schema``, ``refOfUnknownKeyword``,
  ``unknownKeyword``, ``dependencies-compatibility``). ``format-assertion`` and ``cross-draft``
  are left out: they need the suite's remotes/, which is not vendored. The truth is
  ``format_helpers.truth``: ``jsonschema`` with format checking where it decides, the suite's
  flag where it cannot or disagrees (both printed).
- Format mutants: valid instances of the schemas/ corpus, the real-world corpus and the
  format suite with one formatted string replaced by one not of the format (2023-02-29,
  256.1.1.1, 01.2.3.4, a date-time without offset, ...), each confirmed invalid by
  ``jsonschema``; every one must be refused.

The invariant: an invalid instance is never accepted. Cases accepted today are listed below,
each a strict xfail naming the bug, so they turn red when fixed; formats the grammar layer
does not assert (``format_helpers.ASSERTED_FORMATS``) are one strict xfail per format file.
Valid instances refused are counted and pinned in tests/data/optional_expected.json, as
tests/data/suite_expected.json pins the main suite (GRAMMARSERVE_WRITE_OPTIONAL_EXPECTED=1
rewrites it from the current run, to review and commit).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from format_helpers import (
    ASSERTED_FORMATS,
    CHECKER,
    KNOWN_ACCEPTED,
    KNOWN_MUTANTS,
    UNCHECKED_FORMATS,
    Validator,
    optional_cases,
    schema_formats,
    text_styles,
    truth,
)
from format_mutants import mutant_tests

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import SuiteCase, load_corpus, walk

pytestmark = pytest.mark.model  # the embedded model's tokenizer

REPO = Path(__file__).resolve().parents[1]
EXPECTED = REPO / "tests" / "data" / "optional_expected.json"
BACKENDS = ("llguidance", "xgrammar")

def _known(file: str, group: str, desc: str, backend: str) -> bool:
    entry = KNOWN_ACCEPTED.get((file, group, desc))
    return entry is not None and backend in entry[0]


@pytest.fixture(scope="module")
def compilers(tokenizer: Any) -> dict[str, GrammarCompiler]:
    # NOTE: as in test_fsm_conformance.py: everything a schema allows (open_schemas), no
    # compile timeout, and no background upgrade (the upgraded grammars are
    # test_fsm_upgraded.py's); xgrammar alone has no ``auto`` style, so it walks both forms
    # with flexible whitespace.
    llguidance = GrammarCompiler(tokenizer, backend="llguidance", open_schemas=True,
                                 compile_timeout_s=600, background_upgrade=False)
    xgrammar = GrammarCompiler(tokenizer, backend="xgrammar", json_style="flexible",
                               open_schemas=True, compile_timeout_s=600,
                               background_upgrade=False)
    return {"llguidance": llguidance, "xgrammar": xgrammar}


def _walks(compiler: GrammarCompiler, tokenizer: Any, grammar: Any,
           instance: Any) -> list[tuple[str, bool]]:
    """``(style, accepted)`` for each form of ``instance`` (``text_styles``)."""
    bitmask = compiler.allocate_bitmask(1)
    out = []
    for style, text in text_styles(instance):
        ids = tokenizer.encode(text, add_special_tokens=False)
        out.append((style, walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)[0]))
    return out


def _annotation_only(file: str, schema: Any) -> bool:
    """A format file whose schema's formats are all dropped by the grammar layer."""
    formats = schema_formats(schema)
    return file.startswith("format/") and bool(formats) and not formats & ASSERTED_FORMATS


def run_optional(compiler: GrammarCompiler, tokenizer: Any) -> dict[str, Any]:
    """Compile and walk every optional case; counts per file, and the cases by outcome."""
    counts: dict[str, Counter[str]] = {}
    got: dict[str, list[Any]] = {"invalid_accepted": [], "annotation_accepted": [],
                                 "valid_refused": [], "disputed": []}
    for file, case in optional_cases():
        c = counts.setdefault(file, Counter())
        try:
            grammar = compiler.compile_json_schema(case.schema)
        except GrammarError:
            c["schemas_refused"] += 1
            c["instances_not_walked"] += len(case.tests)
            continue
        c["schemas_ok"] += 1
        for desc, instance, suite_valid in case.tests:
            valid, verdict = truth(case.schema, instance, suite_valid)
            key = (file, case.description, desc)
            for style, accepted in _walks(compiler, tokenizer, grammar, instance):
                if verdict is not None and verdict != suite_valid:
                    got["disputed"].append((*key, style, suite_valid, accepted))
                if valid and accepted:
                    c["valid_accepted"] += 1
                elif valid:
                    c["valid_refused"] += 1
                    got["valid_refused"].append(" | ".join((*key, style)))
                elif not accepted:
                    c["invalid_refused"] += 1
                elif _annotation_only(file, case.schema):
                    c["invalid_accepted_annotation"] += 1
                    got["annotation_accepted"].append((*key, style))
                else:
                    c["invalid_accepted"] += 1
                    got["invalid_accepted"].append((*key, style))
    return {**got, "counts": {f: dict(sorted(c.items())) for f, c in sorted(counts.items())}}


@pytest.fixture(scope="module")
def optional_runs(compilers: dict[str, GrammarCompiler],
                  tokenizer: Any) -> dict[str, dict[str, Any]]:
    return {name: run_optional(compiler, tokenizer) for name, compiler in compilers.items()}


def _totals(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for c in counts.values():
        total.update(c)
    return dict(sorted(total.items()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_optional_suites_never_accept_invalid(backend: str,
                                              optional_runs: dict[str, dict[str, Any]]) -> None:
    """0 invalid accepted (beyond the strict xfails below); the counts and the valid
    instances refused are exactly tests/data/optional_expected.json."""
    got = optional_runs[backend]
    print(f"\n{backend}: {_totals(got['counts'])}")
    for file, c in got["counts"].items():
        print(f"  {file}: {c}")
    print(f"  jsonschema disagrees with the suite on {len(got['disputed'])} walks "
          "(the suite's flag stands):")
    for file, group, desc, style, suite_valid, accepted in got["disputed"]:
        print(f"    {file} | {group} | {desc} | {style}: suite says "
              f"{'valid' if suite_valid else 'invalid'}, {'accepted' if accepted else 'refused'}")
    new = [" | ".join(k) for k in got["invalid_accepted"] if not _known(k[0], k[1], k[2], backend)]
    assert new == [], "INVALID ACCEPTED:\n" + "\n".join(new)
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    if os.environ.get("GRAMMARSERVE_WRITE_OPTIONAL_EXPECTED"):
        expected[backend] = {"counts": got["counts"], "valid_refused": got["valid_refused"]}
        EXPECTED.write_text(json.dumps(expected, indent=1, sort_keys=True,
                                       ensure_ascii=False) + "\n")
    walks = set(got["valid_refused"]) ^ set(expected[backend]["valid_refused"])
    assert walks == set(), "valid walks refused that were not, or accepted that were not:\n" + \
        "\n".join(sorted(walks))
    assert got["counts"] == expected[backend]["counts"]


def _case(file: str, group: str) -> SuiteCase:
    return next(c for f, c in optional_cases() if f == file and c.description == group)


@pytest.mark.parametrize(("backend", "file", "group", "desc"), [
    pytest.param(backend, *key, id=f"{backend}-{key[0]}-{key[2]}",
                 marks=pytest.mark.xfail(strict=True, reason=reason))
    for key, (backends, reason) in KNOWN_ACCEPTED.items() for backend in backends])
def test_known_invalid_accepted(backend: str, file: str, group: str, desc: str,
                                compilers: dict[str, GrammarCompiler], tokenizer: Any) -> None:
    """Each invalid instance a backend accepts today: refused once the bug is fixed."""
    case = _case(file, group)
    instance, valid = next((d, v) for t, d, v in case.tests if t == desc)
    assert not truth(case.schema, instance, valid)[0]
    grammar = compilers[backend].compile_json_schema(case.schema)
    assert not any(ok for _, ok in _walks(compilers[backend], tokenizer, grammar, instance))


_ANNOTATION_FILES = sorted({f for f, c in optional_cases() if _annotation_only(f, c.schema)
                            and any(not valid for _, _, valid in c.tests)})


@pytest.mark.parametrize(("backend", "file"), [
    pytest.param(backend, file, id=f"{backend}-{file}", marks=pytest.mark.xfail(
        strict=True, reason="the format is not asserted: the grammar layer drops it as an "
        "annotation (grammarserve/fsm/README.md), so its format-invalid instances are taken"))
    for file in _ANNOTATION_FILES for backend in BACKENDS])
def test_annotation_formats_accept_invalid(backend: str, file: str,
                                           optional_runs: dict[str, dict[str, Any]]) -> None:
    """Formats the grammar layer does not assert (idn-hostname, iri, json-pointer, regex,
    uri-reference, uri-template, ...): their invalid instances are refused once asserted."""
    accepted = [k for k in optional_runs[backend]["annotation_accepted"] if k[0] == file]
    assert accepted == []


def test_optional_truth_and_scope() -> None:
    """What is walked: every optional file but the two that need remotes; format files for
    formats that are asserted and for formats that are not; every instance with a truth."""
    files = {f for f, _ in optional_cases()}
    assert "format/date.json" in files and "bignum.json" in files
    assert "format-assertion.json" not in files and "cross-draft.json" not in files
    assert len(files) >= 30
    assert {"format/idn-hostname.json", "format/regex.json"} <= set(_ANNOTATION_FILES)
    assert "format/date-time.json" not in _ANNOTATION_FILES
    leap = _case("format/date.json", "validation of date strings")
    assert any(d == "2021-02-29" and not v for _, d, v in leap.tests)


def test_output_checker_agrees_with_the_suite() -> None:
    """The format checks generated outputs are held to (format_helpers.CHECKER) give the
    suite's verdict on its date, date-time, time, ipv4, ipv6 and uuid instances, and on its
    host names but the IDNA A-labels ('xn--', not decoded)."""
    disagree = []
    for file, case in optional_cases():
        fmt = file.removeprefix("format/").removesuffix(".json")
        if fmt not in ("date", "date-time", "time", "ipv4", "ipv6", "uuid", "hostname"):
            continue
        validator = Validator(case.schema, format_checker=CHECKER)
        for desc, instance, valid in case.tests:
            if validator.is_valid(instance) != valid and not (
                    fmt == "hostname" and "xn--" in str(instance).lower()):
                disagree.append(f"{file} | {desc} | {instance!r}")
    assert disagree == []
    print(f"\nformats no check decides for outputs: {sorted(UNCHECKED_FORMATS)}; jsonschema's "
          f"own checkers: {sorted(Validator.FORMAT_CHECKER.checkers)}")


# --------------------------------------------------------------------------- format mutants


def _mutant_cases(corpus: str) -> list[tuple[SuiteCase, list[tuple[str, str, str, Any]]]]:
    """The cases of ``corpus`` with format mutants, and their mutants (``mutant_tests``)."""
    if corpus == "suite":
        cases = [c for f, c in optional_cases()
                 if f.startswith("format/") and schema_formats(c.schema) & ASSERTED_FORMATS]
    else:
        cases = list(load_corpus(REPO / "schemas" / ("realworld" if corpus == "realworld"
                                                     else "")))
    return [(case, tests) for case in cases if (tests := mutant_tests(case))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("corpus", ["schemas", "realworld", "suite"])
def test_format_mutants_refused(corpus: str, backend: str,
                                compilers: dict[str, GrammarCompiler], tokenizer: Any) -> None:
    """Every format mutant of a valid instance is refused (the populations of the corpus
    walks, test_fsm_conformance.py and test_realworld_corpus.py, hold no instance invalid
    only by ``format``: this adds them)."""
    compiler = compilers[backend]
    counts: Counter[str] = Counter()
    accepted: list[str] = []
    by_format: Counter[str] = Counter()
    for case, tests in _mutant_cases(corpus):
        try:
            grammar = compiler.compile_json_schema(case.schema)
        except GrammarError:
            counts["schemas_refused"] += 1
            counts["mutants_not_walked"] += len(tests)
            continue
        counts["schemas_ok"] += 1
        for desc, fmt, planted, instance in tests:
            by_format[fmt] += 1
            for style, ok in _walks(compiler, tokenizer, grammar, instance):
                if not ok:
                    counts["mutant_walks_refused"] += 1
                    continue
                known = KNOWN_MUTANTS.get((fmt, planted))
                if known is not None and backend in known[0]:
                    counts["mutant_walks_accepted_known"] += 1
                    continue
                accepted.append(f"{case.file} | {desc} | {style}")
    print(f"\n{corpus}/{backend}: {dict(counts)}; mutants per format: {dict(by_format)}")
    assert counts["schemas_ok"] > 0
    assert accepted == [], "FORMAT MUTANT ACCEPTED:\n" + "\n".join(accepted)


@pytest.mark.parametrize(("backend", "fmt", "planted"), [
    pytest.param(backend, fmt, planted, id=f"{backend}-{fmt}-{planted}",
                 marks=pytest.mark.xfail(strict=True, reason=reason))
    for (fmt, planted), (backends, reason) in KNOWN_MUTANTS.items() for backend in backends])
def test_known_format_mutants_accepted(backend: str, fmt: str, planted: str,
                                       compilers: dict[str, GrammarCompiler],
                                       tokenizer: Any) -> None:
    compiler = compilers[backend]
    grammar = compiler.compile_json_schema({"type": "string", "format": fmt})
    assert not any(ok for _, ok in _walks(compiler, tokenizer, grammar, planted))
