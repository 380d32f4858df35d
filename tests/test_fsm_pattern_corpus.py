"""Every regex construct a JSON Schema ``pattern`` may use (ECMA-262, and what Python's ``re``
takes beyond it), as a ``pattern``, a ``patternProperties`` name and a ``propertyNames``
pattern, on both backends (issue 33 item 4). Each case is refused with a clean grammar error
naming the keyword and its JSON path, or every walked instance the grammar and its value checks
accept is valid under the exact pattern (``re``'s search semantics; ``regex`` for ``\\p{..}``).
On the embedded model's tokenizer, model-free."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import regex

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk

pytestmark = pytest.mark.model  # the embedded model's tokenizer

EOS = 2
#: (pattern, strings it matches): every construct of the dialect, one or two per case.
CORPUS: list[tuple[str, list[str]]] = [
    ("abc", ["abc", "xabcx"]), ("^abc$", ["abc"]), ("", ["", "q"]), ("^$", [""]),
    ("^a.c$", ["abc", "a-c"]), (r"^\.\*\+\?\(\)\[\]\{\}\|\\\^\$\/\-$", [r".*+?()[]{}|\^$/-"]),
    ("^[abc]+$", ["cab"]), ("^[^abc]+$", ["xyz"]), ("^[a-z0-9_-]{2,4}$", ["a_1", "z-"]),
    (r"^[\]a]$", ["]"]), (r"^[]a]$", ["]", "a"]), (r"^[\b]$", ["\b"]),
    (r"^\d\D\w\W\s\S$", ["1a_! x"]), (r"^[\d\s]+$", ["1 2"]),
    ("^a*$", ["", "aaa"]), ("^a+$", ["a"]), ("^ab?c$", ["ac", "abc"]), ("^a{3}$", ["aaa"]),
    ("^a{2,}$", ["aaaa"]), ("^a{1,3}$", ["aa"]), ("^a{,2}$", ["", "aa"]),
    ("^a*?b+?c??d{1,2}?$", ["bd", "aabbcdd"]), ("^a*+b$", ["aab"]), ("^a*+a$", []),
    ("^(?:ab)+$", ["abab"]), ("^(ab|cd)$", ["cd"]), ("^(?P<x>a)b$", ["ab"]),
    ("^a|b$", ["a1", "1b"]), ("^(a|)$", ["", "a"]),
    (r"^(a)\1$", ["aa"]), (r"^(a|b)\1$", ["aa", "bb"]), (r"(\d)\1", ["x11y"]),
    (r"^(?:(a)|b)\1$", ["aa"]), (r"^(a(b))\2\1$", ["abbab"]), (r"^(?P<q>a)(?P=q)$", ["aa"]),
    (r"^(?<n>a)\k<n>$", ["aa"]),
    ("^(?!x)[a-z]{2}$", ["ab", "ya"]), ("(?<=a)b", ["ab", "cab"]), (r"(?=\d)", ["1", "a1"]),
    ("^(?=.*[A-Z])(?=.*[0-9]).{4,8}$", ["Ab12", "1xyZ"]), ("(?<!a)b$", ["b", "cb"]),
    ("^foo(?!bar)", ["foo", "foobaz"]), (r"\bfoo\b", ["foo", "a foo."]), (r"\Bx", ["ax"]),
    (r"^[a-z]+(?=\d)\d$", ["ab1"]), (r"^((?=a)\w)+$", ["aa"]), ("(?=a)*b", ["b"]),
    (r"^\u0041\x42\103$", ["ABC"]), (r"^\u00e9+$", ["éé"]), (r"^\U0001F600$", ["\U0001F600"]),
    (r"^\N{DIGIT ONE}$", ["1"]), (r"^\0$", ["\0"]), (r"^\t\n\r\f\v\a$", ["\t\n\r\f\v\a"]),
    (r"^\p{L}+$", ["abé"]), (r"^\P{L}+$", ["12"]), (r"^\p{Lu}\p{Ll}$", ["Ab"]),
    (r"^\u{41}$", ["A"]), (r"^\cA$", ["\x01"]), ("^(?i)abc$", ["ABC"]), ("(?i)^abc$", ["AbC"]),
    ("^(?i:a)b$", ["Ab"]), ("(?s)^a.b$", ["a\nb"]), ("(?m)^b$", ["a\nb", "b"]),
    ("(?x)^a b$", ["ab"]), (r"(?a)^\w$", ["a"]), ("^(?>a+)b$", ["aab"]),
    ("^(a)?(?(1)b|c)$", ["ab", "c"]), ("^a(?#note)b$", ["ab"]), (r"\Aab\Z", ["ab"]),
    ("^[[:alpha:]]$", ["a", ":"]), ("^[a&&b]$", ["&"]), ("^[a--b]$", []), ("^[a~~b]$", ["~"]),
    ("^(((a)))$", ["a"]), ("^(?:a|b(?:c|d))*$", ["abdbc"]), (r"^[\p{L}\d]+$", ["a1"]),
]
#: Strings every case walks besides its own.
POOL = ["", "a", "b", "ab", "aa", "xa", "abc", "ABC", "1", "11", "a1", "foo", "foobar",
        "Ab12", "abab", "x", "é", "²", "\U0001F600", " ", "a b", "a\nb", "_", "[", ":", "&",
        "~", "-", "bb", "aab", "]", "\b", "\x01"]
SCHEMAS = {
    "pattern": lambda p: {"type": "object", "properties": {"v": {"type": "string", "pattern": p}},
                          "required": ["v"], "additionalProperties": False},
    "patternProperties": lambda p: {"type": "object", "patternProperties": {p: {"const": 1}},
                                    "additionalProperties": False},
    "propertyNames": lambda p: {"type": "object", "propertyNames": {"pattern": p},
                                "additionalProperties": {"const": 1}},
}
PATHS = {"pattern": "$.properties.v.pattern", "patternProperties": "$.patternProperties",
         "propertyNames": "$.propertyNames"}


def _matches(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:  # \p{..}: re does not read it; the regex module does
        return regex.search(pattern, text) is not None


def _document(where: str, text: str) -> dict[str, Any]:
    return {"v": text} if where == "pattern" else {text: 1}


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def compiler(request: pytest.FixtureRequest, tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, backend=request.param, background_upgrade=False,
                           json_style="compact", compile_threads=1)


@pytest.mark.parametrize("where", list(SCHEMAS))
def test_every_construct_is_enforced_or_refused(compiler: GrammarCompiler, tokenizer: Any,
                                                where: str) -> None:
    wrong, refused, dirty = [], [], []
    bitmask = compiler.allocate_bitmask(1)
    for pattern, positives in CORPUS:
        try:
            grammar = compiler.compile_json_schema(SCHEMAS[where](pattern))
        except GrammarError as e:
            refused.append(pattern)
            # a clean refusal names the keyword's JSON path
            if not (e.path or "").startswith(PATHS[where]) or PATHS[where] not in str(e):
                dirty.append((pattern, str(e)[:200]))
            continue
        for text in dict.fromkeys(positives + POOL):
            doc = json.dumps(_document(where, text), ensure_ascii=False,
                             separators=(",", ":"))
            ids = list(tokenizer.encode(doc, add_special_tokens=False))
            ok, _ = walk(grammar.matcher(), ids, EOS, bitmask)
            if ok and not _matches(pattern, text):
                wrong.append((pattern, text))
    assert wrong == []
    assert dirty == []
    assert refused != [p for p, _ in CORPUS]  # not everything


LLGUIDANCE_TAKES = ["^(?!x)[a-z]{2}$", "(?<=a)b", r"(?=\d)", r"^(a)\1$", r"\bfoo\b", "^a*+b$",
                    "(?m)^b$", "^(?=.*[A-Z])(?=.*[0-9]).{4,8}$"]


@pytest.mark.parametrize("pattern", LLGUIDANCE_TAKES)
def test_look_around_and_back_references_are_checked(tokenizer: Any, pattern: str) -> None:
    """What issue 33 found accepted and ignored: taken, each positive accepted, the grammar
    holding the superset (so a string closes: ``^(?!x)[a-z]{2}$`` takes no third letter)."""
    compiler = GrammarCompiler(tokenizer, backend="llguidance", background_upgrade=False,
                               json_style="compact", compile_threads=1)
    grammar = compiler.compile_json_schema(SCHEMAS["pattern"](pattern))
    assert grammar.value_checks
    positives = dict(CORPUS)[pattern]
    bitmask = compiler.allocate_bitmask(1)
    for text in positives:
        ids = list(tokenizer.encode(json.dumps({"v": text}, separators=(",", ":")),
                                    add_special_tokens=False))
        assert walk(grammar.matcher(), ids, EOS, bitmask) == (True, ""), text


def test_a_negative_look_ahead_keeps_its_superset_in_the_grammar(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer, backend="llguidance", background_upgrade=False,
                               json_style="compact", compile_threads=1)
    grammar = compiler.compile_json_schema(SCHEMAS["pattern"]("^(?!x)[a-z]{2}$"))
    bitmask = compiler.allocate_bitmask(1)
    too_long = list(tokenizer.encode('{"v":"abc"}', add_special_tokens=False))
    assert walk(grammar.matcher(), too_long, EOS, bitmask)[0] is False
    matcher = grammar.matcher()
    for tok in tokenizer.encode('{"v":"ab', add_special_tokens=False):
        assert matcher.accept_token(tok)
    matcher.fill_bitmask(bitmask, 0)
    allowed = [t for t in range(compiler.vocab_size)
               if (int(bitmask[0, t // 32]) >> (t % 32)) & 1]
    assert {tokenizer.decode([t]) for t in allowed} <= {'"', '"}'}


@pytest.mark.parametrize("schema,strict,path,construct", [
    ({"type": "string", "pattern": "^(?!x)[a-z]{2}$"}, True, "$.pattern", "look-ahead"),
    ({"type": "object", "properties": {"n": {"type": "string", "pattern": r"(a)\1"}},
      "required": ["n"], "additionalProperties": False}, True, "$.properties.n.pattern",
     "back-reference"),
    ({"type": "string", "pattern": "^(?>a+)b$"}, False, "$.pattern", "atomic group"),
    ({"type": "string", "pattern": "^[[:alpha:]]$"}, False, "$.pattern", "'['"),
    ({"type": "object", "patternProperties": {"^(a)?(?(1)b|c)$": {}}}, False,
     '$.patternProperties["^(a)?(?(1)b|c)$"]', "conditional"),
    ({"type": "object", "propertyNames": {"pattern": "(?x)a b"}}, False,
     "$.propertyNames.pattern", "verbose flag"),
])
def test_what_cannot_be_enforced_is_refused_with_its_path(
        tokenizer: Any, schema: dict[str, Any], strict: bool, path: str, construct: str
        ) -> None:
    compiler = GrammarCompiler(tokenizer, backend="llguidance", background_upgrade=False,
                               compile_threads=1)
    with pytest.raises(GrammarError) as e:
        compiler.compile_json_schema(schema, strict=strict)
    assert e.value.path == path and construct in str(e.value), str(e.value)


@pytest.mark.parametrize("pattern,construct", [
    ("^(?!x)[a-z]{2}$", "look-ahead"), ("(?<=a)b", "look-behind"), (r"(a)\1", "back-reference"),
    (r"\bab", "word boundary"), ("^[[:alpha:]]$", "'['")])
def test_a_regex_constraint_with_them_is_refused(tokenizer: Any, pattern: str,
                                                 construct: str) -> None:
    for backend in ("auto", "xgrammar"):
        compiler = GrammarCompiler(tokenizer, backend=backend, background_upgrade=False,
                                   compile_threads=1)
        with pytest.raises(GrammarError) as e:
            compiler.compile_regex(pattern)
        assert e.value.path == "$.regex" and construct in str(e.value)


def test_without_value_checks_look_around_is_refused(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer, backend="llguidance", background_upgrade=False,
                               compile_threads=1, value_checks=False)
    with pytest.raises(GrammarError) as e:
        compiler.compile_json_schema({"type": "object", "patternProperties": {
            "^(?!x)": {"type": "integer"}}, "additionalProperties": False})
    assert e.value.path == '$.patternProperties["^(?!x)"]'
    assert "negative look-ahead" in str(e.value)
