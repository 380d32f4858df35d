"""Test helper: ``format`` as the tests hold the grammar layer to it.

- :func:`optional_cases`: the JSON-Schema-Test-Suite's ``optional/`` and ``optional/format/``
  groups that apply to generation, and :func:`truth`: whether an instance is valid, by
  ``jsonschema`` with format checking on, else by the suite's own flag.
- (``format_mutants.py``: format-invalid variants of a valid instance, a date on 02-29 of a
  common year, ``256.1.1.1``, a date-time without its offset, ..., each checked by
  ``jsonschema`` to fail the schema at the place it was put.)
- :data:`CHECKER`: ``jsonschema``'s format checker (the asserted formats) plus RFC 3339
  ``date-time``/``time`` and RFC 1123 ``hostname`` checks of our own, for generated outputs.

``jsonschema`` checks, with the extras installed here: date, email (an ``@`` only),
idn-email, idn-hostname (``idna``), ipv4, ipv6, json-pointer and relative-json-pointer
(``jsonpointer``), regex (Python's ``re``), uuid. Not: date-time and time
(``rfc3339-validator``), duration (``isoduration``), hostname (``fqdn``), uri, uri-reference,
iri, iri-reference (``rfc3987``), uri-template (``uri-template``).
- :func:`style_backends`: which backend serves each JSON style of a compiled grammar, now.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

from grammarserve.fsm.config import AUTO_STYLES
from grammarserve.fsm.conformance import SuiteCase, load_suite
from grammarserve.fsm.schema.normalize import KNOWN_FORMATS

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"
OPTIONAL = SUITE / "optional"

Validator = jsonschema.Draft202012Validator

#: The formats the grammar layer asserts (grammarserve/fsm/README.md); every other format is
#: dropped as an annotation.
ASSERTED_FORMATS = KNOWN_FORMATS

#: optional/ files left out, and why: both need documents of the suite's remotes/, which is not
#: vendored (a metaschema with the format-assertion vocabulary; a draft 2019-09 schema).
OPTIONAL_SKIPPED = {"format-assertion.json": "its $schema is a remote metaschema",
                    "cross-draft.json": "$ref to a remote draft 2019-09 schema"}

# Where ``jsonschema``'s verdict is not that of the specification, so the suite's flag is the
# truth: its ``pattern`` and ``format: regex`` use Python's ``re`` (the suite's ECMA 262 cases
# say "unlike e.g. Python", and ``\p{...}`` does not compile), its ``dependencies`` is not a
# Draft 2020-12 keyword (the suite's optional compatibility, which the grammar layer takes),
# ``email`` only looks for an ``@``, ``uuid`` parses with ``int(..., 16)`` (takes ``_`` and
# non-ASCII digits), ``relative-json-pointer`` refuses ``100``, ``idn-hostname`` takes a
# trailing dot. ``truth`` finds these by disagreement (the tests print them), so no list is
# kept here.


def optional_cases() -> Iterator[tuple[str, SuiteCase]]:
    """``(name, case)`` for every group of ``optional/*.json`` and ``optional/format/*.json``
    except :data:`OPTIONAL_SKIPPED`; ``name`` is the file's path under ``optional/``."""
    for case in load_suite(OPTIONAL / "format"):
        yield f"format/{case.file}", case
    for case in load_suite(OPTIONAL):
        if case.file not in OPTIONAL_SKIPPED:
            yield case.file, case


def schema_formats(schema: Any) -> set[str]:
    """Every ``format`` value named anywhere in ``schema``."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                found.add(node["format"])
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(schema)
    return found


def jsonschema_verdict(schema: Any, instance: Any) -> bool | None:
    """``jsonschema``'s verdict with format checking on; None where it cannot decide (a format
    it has no checker for, given the installed extras, or a schema it cannot run)."""
    if not schema_formats(schema) <= set(Validator.FORMAT_CHECKER.checkers):
        return None
    try:
        return bool(Validator(schema, format_checker=Validator.FORMAT_CHECKER).is_valid(instance))
    except Exception:  # noqa: BLE001 - e.g. a pattern Python's re cannot compile
        return None


def truth(schema: Any, instance: Any, suite_valid: bool) -> tuple[bool, bool | None]:
    """``(valid, jsonschema's verdict)``. ``jsonschema`` (formats checked) decides where it
    can, the suite's flag where it cannot (no checker, a schema it cannot run); where the two
    disagree the suite's flag stands (the note above) and the tests list the case. So ``valid``
    is always the suite's flag, confirmed by ``jsonschema`` wherever it decides."""
    return suite_valid, jsonschema_verdict(schema, instance)


# --------------------------------------------------------------------------- checking outputs


_RFC3339_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|([+-])(\d{2}):(\d{2}))",
                           re.ASCII)
_RFC3339_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)


def _time_ok(text: str) -> bool:
    m = _RFC3339_TIME.fullmatch(text)
    if m is None:
        return False
    hour, minute, second = int(m[1]), int(m[2]), int(m[3])
    off_h, off_m = (int(m[7]), int(m[8])) if m[6] else (0, 0)
    if hour > 23 or minute > 59 or second > 60 or off_h > 23 or off_m > 59:
        return False
    if second == 60:  # a leap second is 23:59:60 UTC
        sign = -1 if m[6] == "+" else 1
        utc = (hour * 60 + minute + sign * (off_h * 60 + off_m)) % (24 * 60)
        return utc == 23 * 60 + 59
    return True


def _date_ok(text: str) -> bool:
    m = _RFC3339_DATE.fullmatch(text)
    if m is None:
        return False
    try:
        datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


def _date_time_ok(text: str) -> bool:
    parts = re.split("[Tt]", text)
    return len(parts) == 2 and _date_ok(parts[0]) and _time_ok(parts[1])


_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)


def _hostname_ok(text: str) -> bool:
    # RFC 1123 (no IDNA A-label decoding)
    return 0 < len(text) <= 253 and all(_LABEL.fullmatch(label) for label in text.split("."))


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {k: v for k, v in Validator.FORMAT_CHECKER.checkers.items()
                        if k in ASSERTED_FORMATS}
    ours = (("date-time", _date_time_ok), ("time", _time_ok), ("hostname", _hostname_ok),
            ("uuid", lambda v: _UUID.fullmatch(v) is not None))
    for name, ok in ours:
        if name not in checker.checkers or name == "uuid":
            checker.checks(name)(lambda v, ok=ok: not isinstance(v, str) or ok(v))
    return checker


#: The formats the grammar layer asserts (the others are annotations there): ``jsonschema``'s
#: checkers and, where it has none, our own ``date-time``, ``time`` (RFC 3339, leap seconds at
#: 23:59:60 UTC only) and ``hostname`` (RFC 1123) checks; ``uuid`` is ours too (RFC 4122's
#: string form: ``jsonschema``'s parses with ``int(..., 16)``, which takes ``_`` and non-ASCII
#: digits). ``email`` is ``jsonschema``'s, which looks for an ``@`` only.
CHECKER = _checker()
#: Formats no checker here decides (their outputs are checked on everything else).
UNCHECKED_FORMATS = ASSERTED_FORMATS - set(CHECKER.checkers)


def validation_errors(schema: Any, instance: Any) -> list[jsonschema.ValidationError]:
    """The errors of ``instance`` against ``schema`` (its declared draft), formats checked by
    :data:`CHECKER`."""
    cls = jsonschema.validators.validator_for(schema, default=Validator)
    return list(cls(schema, format_checker=CHECKER).iter_errors(instance))


def known_format_error(error: jsonschema.ValidationError) -> str | None:
    """The known bug (``BUG_*``) a ``format`` error of a generated value shows, if any."""
    value = error.instance
    if error.validator != "format" or not isinstance(value, str):
        return None
    fixed = re.sub(r":60(?=[.Zz+-]|$)", ":59", value)
    if error.validator_value in ("date-time", "time") and fixed != value and \
            (_date_time_ok if error.validator_value == "date-time" else _time_ok)(fixed):
        return BUG_LEAP_SECOND
    return None



# --------------------------------------------------------------------------- known bugs

BUG_LEAP_SECOND = ("date-time, time: a leap second (:60) is taken at any hour and minute and "
                   "with any offset; RFC 3339 has it only at 23:59:60 UTC")
BUG_HOSTNAME_LENGTH = "hostname: no bound on the whole name (RFC 1123: at most 253 characters)"
BUG_A_LABEL = ("hostname: an 'xn--' label is taken without checking that it decodes to a "
               "valid U-label (RFC 5890/5891/5892)")
BUG_IPV6_V4_ZERO = ("ipv6: the embedded IPv4 part takes a leading zero (the front end refuses "
                    "xgrammar's ipv4 for this, not its ipv6)")
BUG_FEFF = "pattern: \\s does not take U+FEFF (ECMA 262 WhiteSpace has it), so \\S takes it"
BUG_HOSTNAME_LABEL = "hostname: a label of 64 characters is taken (RFC 1123: at most 63)"
_BOTH = ("llguidance", "xgrammar")
#: Invalid instances of :func:`optional_cases` a backend accepts today: ``(file, group, test)``
#: -> ``(backends, the bug)``. Each is a strict xfail (tests/test_fsm_formats.py).
_DT = "format/date-time.json"
_TIME = "format/time.json"
_HOST = "format/hostname.json"
KNOWN_ACCEPTED: dict[tuple[str, str, str], tuple[tuple[str, ...], str]] = {
    (_DT, "validation of date-time strings",
     "an invalid date-time with leap second on a wrong hour, UTC"): (_BOTH, BUG_LEAP_SECOND),
    (_DT, "validation of date-time strings",
     "an invalid date-time with leap second on a wrong minute, UTC"): (_BOTH, BUG_LEAP_SECOND),
    **{(_TIME, "validation of time strings", desc): (_BOTH, BUG_LEAP_SECOND) for desc in (
        "an invalid time string with invalid leap second (wrong hour)",
        "an invalid time string with invalid leap second (wrong minute)",
        "invalid leap second, Zulu (wrong hour)", "invalid leap second, Zulu (wrong minute)",
        "invalid leap second, negative time-offset (wrong hour)",
        "invalid leap second, negative time-offset (wrong minute)",
        "invalid leap second, positive time-offset (wrong hour)",
        "invalid leap second, positive time-offset (wrong minute)",
        "invalid leap second, zero time-offset (wrong hour)",
        "invalid leap second, zero time-offset (wrong minute)")},
    (_HOST, "validation of host names", "exceeds maximum overall length (256)"):
        (_BOTH, BUG_HOSTNAME_LENGTH),
    **{(_HOST, "validation of A-label (punycode) host names", desc): (_BOTH, BUG_A_LABEL)
       for desc in (
        "Begins with a Spacing Combining Mark",
        "Begins with a Nonspacing Mark", "Begins with an Enclosing Mark",
        "Exceptions that are DISALLOWED, right-to-left chars",
        "Exceptions that are DISALLOWED, left-to-right chars",
        "MIDDLE DOT with no preceding 'l'", "MIDDLE DOT with nothing preceding",
        "MIDDLE DOT with no following 'l'", "MIDDLE DOT with nothing following",
        "Greek KERAIA not followed by anything", "Hebrew GERESH not preceded by anything",
        "Hebrew GERSHAYIM not preceded by anything",
        "KATAKANA MIDDLE DOT with no Hiragana, Katakana, or Han",
        "KATAKANA MIDDLE DOT with no other characters",
        "Arabic-Indic digits mixed with Extended Arabic-Indic digits",
        "ZERO WIDTH JOINER not preceded by Virama", "ZERO WIDTH JOINER not preceded by anything",
        "contains illegal char U+302E Hangul single dot tone mark")},
    # NOTE: these hold an upper-case letter, which xgrammar's hostname refuses (README)
    **{(_HOST, "validation of A-label (punycode) host names", desc): (("llguidance",), BUG_A_LABEL)
       for desc in ("invalid Punycode", "contains \"--\" in the 3rd and 4th position",
                    "Greek KERAIA not followed by Greek", "Hebrew GERESH not preceded by Hebrew",
                    "Hebrew GERSHAYIM not preceded by Hebrew")},
    (_HOST, "validation of host names", "exceeds maximum label length (63)"):
        (("xgrammar",), BUG_HOSTNAME_LABEL),
    ("format/ipv6.json", "validation of IPv6 addresses",
     "a leading zero in the last IPv4 octet is invalid"): (("xgrammar",), BUG_IPV6_V4_ZERO),
    ("ecmascript-regex.json", "ECMA 262 \\S matches everything but whitespace",
     "zero-width whitespace does not match"): (("llguidance",), BUG_FEFF),
}

#: Strings of ``format_mutants.FORMAT_MUTANTS`` a backend accepts today: ``(format, planted)`` ->
#: ``(backends, the bug)``. Each is a strict xfail (tests/test_fsm_formats.py).
KNOWN_MUTANTS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("hostname", "a" * 64 + ".com"): (("xgrammar",), BUG_HOSTNAME_LABEL),
    ("ipv6", "::ffff:192.168.0.01"): (("xgrammar",), BUG_IPV6_V4_ZERO),
}


# --------------------------------------------------------------------------- upgraded grammars


def style_backends(grammar: Any) -> dict[str, str]:
    """The backend that serves each JSON style of ``grammar`` now: ``{"compact": ..., "spaced":
    ...}`` once its per-style grammars took over, ``{"either": ...}`` for the one grammar of
    both styles a JSON schema starts with, ``{"any": ...}`` where every style is one language
    (or the style is fixed). Follows a value-checked grammar to the grammar it wraps."""
    inner = grammar
    while getattr(inner, "inner", None) is not None:
        inner = inner.inner
    styled = getattr(inner, "styled", None)
    if styled is None and hasattr(inner, "styled"):
        return {"either": inner.backend}
    styles = getattr(styled if styled is not None else inner, "styles", None)
    if styles is None:
        return {"any": inner.backend}
    names = AUTO_STYLES if len(styles) == len(AUTO_STYLES) else [f"style{i}"
                                                                  for i in range(len(styles))]
    return {name: g.backend for name, g in zip(names, styles)}


def text_styles(instance: Any) -> list[tuple[str, str]]:
    """``(style, text)`` for the two forms of the ``auto`` JSON style (``instance_texts``);
    one ``("any", text)`` where they are the same text."""
    compact = json.dumps(instance, ensure_ascii=False, separators=(",", ":"))
    spaced = json.dumps(instance, ensure_ascii=False)
    return [("any", compact)] if compact == spaced else [("compact", compact),
                                                          ("spaced", spaced)]
