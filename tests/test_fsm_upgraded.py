"""Reused grammars, deterministically (issue 36 item 2), with the SmolLM2 tokenizer.

Most traffic runs on a grammar after its background upgrade: with ``backend="auto"`` and
``json_style="auto"`` a JSON schema's first requests get one llguidance grammar of both styles;
its reuse (the second matcher) compiles a grammar per JSON style on the upgrade thread,
xgrammar's where the schema is in xgrammar's exact subset (``policy.py``). The other tests
turn upgrades off, or walk whichever grammar a race left. Here a compiler with the default
options (closed schemas, the upgrade at normal priority so a busy machine cannot starve it)
compiles the schemas/ corpus, the main suite and the asserted-format suites, reuses each grammar
and waits on its upgrade future (``CompiledGrammar.request_upgrade``: it settles once every
style's grammar took over), then:

- walks every invalid instance, and the format mutants of the valid ones
  (``format_helpers.mutant_tests``): each must be refused;
- walks every valid instance in both forms of the ``auto`` style and compares acceptance with
  the same compiler without upgrades (``background_upgrade=False``, llguidance per style):
  equal, case by case;
- generates by random legal token walks through the upgraded masks
  (``walk_helpers.random_walk``, seeded per schema): every completed output is valid UTF-8
  JSON that validates against its schema (``format_helpers.validates``: ``jsonschema`` with the
  asserted formats checked).

Counts are printed per backend and style. Cases a backend gets wrong today are strict xfails
below, naming the bug.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from format_helpers import (
    ASSERTED_FORMATS,
    KNOWN_ACCEPTED,
    KNOWN_MUTANTS,
    SUITE,
    UNCHECKED_FORMATS,
    known_format_error,
    optional_cases,
    schema_formats,
    style_backends,
    text_styles,
    validation_errors,
)
from format_mutants import mutant_tests
from walk_helpers import random_walk, structural_tokens

from grammarserve.errors import GrammarError
from grammarserve.fsm import CompiledGrammar, GrammarCompiler
from grammarserve.fsm.conformance import SuiteCase, load_corpus, load_suite, walk

pytestmark = pytest.mark.model  # the embedded model's tokenizer

REPO = Path(__file__).resolve().parents[1]
#: Random walks per schema whose upgraded grammar has an xgrammar style, and per other schema;
#: their length bound in tokens.
GENERATIONS_XGRAMMAR = 2
GENERATIONS_OTHER = 1
MAX_TOKENS = 96

_CHANGES = ("the upgrade changes the language of a format: a valid value llguidance's own "
            "'{fmt}' {first} is {then} by xgrammar's")
_EMAIL = "optional/format/email.json", "validation of e-mail addresses"
_IPV6 = "optional/format/ipv6.json", "validation of IPv6 addresses"
#: Valid instances whose acceptance differs between the upgraded grammar and the grammar
#: without upgrades: ``(file, group, test, style)`` -> the reason. Each is a strict xfail.
KNOWN_DIFFERENCES: dict[tuple[str, str, str, str], str] = {
    **{(*_EMAIL, desc, "any"): _CHANGES.format(fmt="email", first="refuses", then="taken")
       for desc in ("a quoted string with a space in the local part is valid",
                    "a quoted string with a double dot in the local part is valid",
                    "a quoted string with a @ in the local part is valid")},
    (*_EMAIL, "an IPv4-address-literal after the @ is valid", "any"):
        _CHANGES.format(fmt="email", first="takes", then="refused"),
    **{(*_IPV6, desc, "any"): _CHANGES.format(fmt="ipv6", first="refuses", then="taken")
       for desc in ("mixed format with double colons between the sections",
                    "mixed format with leading double colons (ipv4-mapped ipv6 address)")},
    ("optional/format/time.json", "validation of time strings",
     "a valid time string with case-insensitive Z", "any"):
        _CHANGES.format(fmt="time", first="takes", then="refused") + " (a lower-case 'z')",
    ("optional/format/uri.json", "validation of URIs", "a valid URL", "any"):
        _CHANGES.format(fmt="uri", first="takes", then="refused")
        + " (ldap://[2001:db8::7]/c=GB?objectClass?one: an IPv6 host)",
}

_SURROGATE = ("xgrammar's JSON strings take the UTF-8 encoding of a UTF-16 surrogate "
              "(ED A0..BF xx, U+D800..U+DFFF), which is not UTF-8: the output is not JSON text "
              "(llguidance refuses it); a value-checked matcher then fails with a backend "
              "error ('surrogates not allowed')")
#: The bytes of an encoded surrogate (U+DAA9, as a random walk made it).
SURROGATE_BYTES = b"\xed\xaa\xa9"


@dataclass
class Entry:
    """One schema compiled with upgrades (settled) and without."""

    name: str
    case: SuiteCase
    grammar: CompiledGrammar
    reference: CompiledGrammar
    upgraded: bool | None  # the upgrade future's result (None: no upgrade planned)
    styles: dict[str, str]  # style -> backend, after the upgrade


def _cases() -> list[tuple[str, SuiteCase]]:
    corpus = [("schemas/" + c.file, c) for c in load_corpus(REPO / "schemas")]
    suite = [(c.file, c) for c in load_suite(SUITE)]
    formats = [("optional/" + f, c) for f, c in optional_cases()
               if f.startswith("format/") and schema_formats(c.schema) & ASSERTED_FORMATS]
    return corpus + suite + formats


@pytest.fixture(scope="module")
def entries(tokenizer: Any) -> dict[str, Any]:
    return build_entries(tokenizer)


def build_entries(tokenizer: Any) -> dict[str, Any]:
    """Compile every case with upgrades (reused, settled) and without."""
    compiler = GrammarCompiler(tokenizer, compile_timeout_s=600, upgrade_niceness=0)
    reference = GrammarCompiler(tokenizer, compile_timeout_s=600, background_upgrade=False)
    out: list[Entry] = []
    refused = 0
    pending = []
    for name, case in _cases():
        try:
            grammar = compiler.compile_json_schema(case.schema)
        except GrammarError:
            refused += 1
            continue
        grammar.matcher()
        grammar.matcher()  # NOTE: reuse starts the upgrade, as in serving
        pending.append((name, case, grammar, reference.compile_json_schema(case.schema),
                        grammar.request_upgrade()))
    for name, case, grammar, ref, future in pending:
        # NOTE: no wall-clock limit: the future settles once every style's grammar took over
        settled = None if future is None else bool(future.result())
        out.append(Entry(name, case, grammar, ref, settled, style_backends(grammar)))
    return {"compiler": compiler, "reference": reference, "entries": out, "refused": refused}


def _backend(styles: dict[str, str], style: str) -> str:
    """The backend(s) a walk of ``style`` runs on (``any``: every style the grammar has)."""
    if style in styles:
        return styles[style]
    return "+".join(sorted(set(styles.values())))


def _known_invalid(entry: Entry, desc: str, backend: str) -> str | None:
    """The known bug an accepted invalid instance of ``entry`` is, if any."""
    if entry.name.startswith("optional/"):
        known = KNOWN_ACCEPTED.get((entry.name.removeprefix("optional/"),
                                    entry.case.description, desc))
        if known is not None and set(backend.split("+")) & set(known[0]):
            return known[1]
    for (fmt, planted), (backends, why) in KNOWN_MUTANTS.items():
        if f"| {fmt} mutant at " in desc and desc.endswith(f": {planted}") \
                and set(backend.split("+")) & set(backends):
            return why
    return None


def _walk_all(compiler: GrammarCompiler, tokenizer: Any, grammar: CompiledGrammar,
              instance: Any) -> list[tuple[str, bool]]:
    bitmask = compiler.allocate_bitmask(1)
    out = []
    for style, text in text_styles(instance):
        ids = tokenizer.encode(text, add_special_tokens=False)
        out.append((style, walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)[0]))
    return out


@pytest.fixture(scope="module")
def walks(entries: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    return run_walks(entries, tokenizer)


def run_walks(entries: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """Walk every instance (and format mutant) through the upgraded grammars, and the valid
    ones through the grammars without upgrades too."""
    compiler, reference = entries["compiler"], entries["reference"]
    counts: dict[str, Counter[str]] = {}
    accepted: list[str] = []
    known: Counter[str] = Counter()
    differences: list[tuple[str, str, str, str]] = []
    for e in entries["entries"]:
        tests = [(d, i, v) for d, i, v in e.case.tests]
        tests += [(d, m, False) for d, _, _, m in mutant_tests(e.case)]
        for desc, instance, valid in tests:
            mine = _walk_all(compiler, tokenizer, e.grammar, instance)
            theirs = dict(_walk_all(reference, tokenizer, e.reference, instance)) if valid \
                else {}
            for style, ok in mine:
                backend = _backend(e.styles, style)
                c = counts.setdefault(f"{backend} / {style}", Counter())
                if valid:
                    c["valid_accepted" if ok else "valid_refused"] += 1
                    if ok != theirs[style]:
                        differences.append((e.name, e.case.description, desc, style))
                elif not ok:
                    c["invalid_refused"] += 1
                elif (why := _known_invalid(e, desc, backend)) is not None:
                    c["invalid_accepted_known"] += 1
                    known[why[:60]] += 1
                else:
                    c["invalid_accepted"] += 1
                    accepted.append(f"{e.name} | {e.case.description} | {desc} | {style} "
                                    f"({backend}): {json.dumps(instance)[:120]}")
    return {"counts": counts, "accepted": accepted, "known": known,
            "differences": differences}


def test_upgrades_settle(entries: dict[str, Any]) -> None:
    """Every grammar's upgrade settled; most reused grammars end on xgrammar, per style."""
    es = entries["entries"]
    by: Counter[str] = Counter(" ".join(f"{k}={v}" for k, v in sorted(e.styles.items()))
                               for e in es)
    print(f"\n{len(es)} schemas compiled ({entries['refused']} refused); after the upgrade: "
          f"{dict(by.most_common())}")
    assert not [e.name for e in es if "either" in e.styles and e.upgraded]
    on_xgrammar = [e for e in es if "xgrammar" in e.styles.values()]
    assert len(on_xgrammar) > len(es) // 3
    assert all(set(e.styles) <= {"any", "either", "compact", "spaced"} for e in es)


def test_upgraded_refuse_every_invalid_instance(walks: dict[str, Any]) -> None:
    print("\nper backend / style:")
    for key, c in sorted(walks["counts"].items()):
        print(f"  {key}: {dict(sorted(c.items()))}")
    print(f"  known bugs accepted: {dict(walks['known'])}")
    assert walks["accepted"] == [], "INVALID ACCEPTED:\n" + "\n".join(walks["accepted"])
    assert sum(c["invalid_refused"] for c in walks["counts"].values()) > 1000


def test_upgraded_accept_what_the_first_grammar_accepts(walks: dict[str, Any]) -> None:
    new = [d for d in walks["differences"] if d not in KNOWN_DIFFERENCES]
    assert new == [], "valid acceptance differs after the upgrade:\n" + "\n".join(
        " | ".join(d) for d in new)


@pytest.mark.parametrize("key", [
    pytest.param(k, id=" | ".join(k), marks=pytest.mark.xfail(strict=True, reason=why))
    for k, why in KNOWN_DIFFERENCES.items()])
def test_known_differences(key: tuple[str, str, str, str], walks: dict[str, Any]) -> None:
    assert key not in walks["differences"]


# --------------------------------------------------------------------------- generation

def _known_output(out: bytes, errors: list[Any]) -> str | None:
    """The known bug an invalid generated output shows, if any (every error explained)."""
    if re.search(rb"\xed[\xa0-\xbf]", out):
        return _SURROGATE
    known = [known_format_error(e) for e in errors]
    return known[0] if known and None not in known else None


def run_generation(entries: dict[str, Any]) -> dict[str, Any]:
    """Random legal walks through every upgraded grammar; their outcomes."""
    compiler = entries["compiler"]
    token_bytes = compiler.token_bytes()
    structural = structural_tokens(token_bytes)
    bitmask = compiler.allocate_bitmask(1)
    stop = compiler.stop_token_ids[0]
    counts: Counter[str] = Counter()
    bad: list[str] = []
    known: Counter[str] = Counter()
    for e in entries["entries"]:
        rng = random.Random(f"{e.name} | {e.case.description}")
        backend = "+".join(sorted(set(e.styles.values())))
        n = GENERATIONS_XGRAMMAR if "xgrammar" in backend else GENERATIONS_OTHER
        for _ in range(n):
            counts[f"walks on {backend}"] += 1
            out, why = random_walk(e.grammar.matcher(), bitmask, stop, token_bytes,
                                   structural, rng, max_tokens=MAX_TOKENS,
                                   p_structural=0.7)
            if out is None:
                if why in ("unfinished",) or why.startswith("exhausted"):
                    counts[why.split(":")[0]] += 1
                elif "surrogates not allowed" in why:
                    known[_SURROGATE[:60]] += 1
                else:
                    bad.append(f"{e.name} | {e.case.description} ({backend}): {why[:300]}")
                continue
            errors: list[Any]
            try:
                instance = json.loads(out.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                errors = [f"not UTF-8 JSON: {err}"]
            else:
                try:
                    errors = validation_errors(e.case.schema, instance)
                except Exception:  # noqa: BLE001 - e.g. a pattern Python's re cannot compile
                    counts["completed, not checkable"] += 1
                    continue
            if not errors:
                counts["completed, valid"] += 1
            elif (bug := _known_output(out, errors)) is not None:
                known[bug[:60]] += 1
            else:
                messages = [getattr(x, "message", x) for x in errors[:2]]
                bad.append(f"{e.name} | {e.case.description} ({backend}): {out[:200]!r}: "
                           f"{messages}")
    return {"counts": counts, "bad": bad, "known": known}


def test_generation_on_upgraded_grammars(entries: dict[str, Any]) -> None:
    """Random legal walks through the upgraded masks end in valid outputs."""
    got = run_generation(entries)
    print(f"\ngenerations: {dict(got['counts'])}; known bugs: {dict(got['known'])}; formats "
          f"not checked: {sorted(UNCHECKED_FORMATS)}")
    assert got["bad"] == [], "INVALID OUTPUT:\n" + "\n".join(got["bad"][:30])
    assert got["counts"]["completed, valid"] > len(entries["entries"])


# --------------------------------------------------------------------------- known bugs


@pytest.mark.xfail(strict=True, reason=_SURROGATE)
def test_xgrammar_strings_refuse_encoded_surrogates(entries: dict[str, Any],
                                                    tokenizer: Any) -> None:
    compiler = entries["compiler"]
    grammar = compiler.compile_json_schema({"type": "string"})
    grammar.matcher()
    grammar.matcher()
    future = grammar.request_upgrade()
    assert future is not None and future.result()  # NOTE: waits for the upgrade
    assert "xgrammar" in style_backends(grammar).values()
    by_byte = {t[0]: i for i, t in enumerate(compiler.token_bytes()) if len(t) == 1}
    ids = [by_byte[b] for b in b'"' + SURROGATE_BYTES + b'"']
    bitmask = compiler.allocate_bitmask(1)
    assert not walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)[0]


@pytest.mark.parametrize(("schema", "text"), [
    ({"type": "string", "format": "date-time"}, "2023-01-01T12:00:0012Z"),
    ({"type": "string", "pattern": "^a(\\.\\d+)?b$"}, "a1b"),
    ({"type": "string", "pattern": "^a(x[0-9]+)?b$"}, "a1b"),
])
def test_xgrammar_optional_group_ending_in_a_repeat(schema: dict[str, Any], text: str,
                                                   entries: dict[str, Any],
                                                   tokenizer: Any) -> None:
    """xgrammar 0.2.9 drops the first character of a ``?``-optional group that ends in a
    repeat (``^a(\\.\\d+)?b$`` took ``a1b``, the calendar pattern a fraction without its
    ``.``): the xgrammar subset writes such groups ``{0,1}`` (``xgrammar_subset.optional_groups``)."""
    compiler = entries["compiler"]
    grammar = compiler.compile_json_schema(schema)
    grammar.matcher()
    grammar.matcher()
    future = grammar.request_upgrade()
    assert future is not None and future.result()
    assert set(style_backends(grammar).values()) == {"xgrammar"}
    ids = tokenizer.encode(json.dumps(text), add_special_tokens=False)
    bitmask = compiler.allocate_bitmask(1)
    assert not walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)[0]
