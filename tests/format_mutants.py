"""Test helper: format mutants, valid instances with one string replaced by a string that is
not of its ``format`` (each checked invalid by ``jsonschema``), for holding the grammar layer's
format assertions to the suite's instances (``format_helpers`` has the oracle)."""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
from format_helpers import Validator

from grammarserve.fsm.conformance import SuiteCase

# --------------------------------------------------------------------------- format mutants

#: Strings that are not of each format (RFC 3339, 5321, 1123, 4122, 3986, 2673/4291, ISO 8601
#: durations as RFC 3339 appendix A writes them).
FORMAT_MUTANTS: dict[str, tuple[str, ...]] = {
    "date": ("2023-02-29", "2100-02-29", "2021-04-31", "2023-13-01", "2023-1-01", "20230101"),
    "date-time": ("2023-02-29T12:00:00Z", "2021-04-31T12:00:00Z", "2023-01-01T12:00:00",
                  "2023-01-01T24:00:00Z", "2023-01-01T12:00Z", "2023-01-01",
                  "2023-01-01T12:00:0012Z"),
    "time": ("12:00:00", "24:00:00Z", "12:60:00Z", "12:00Z"),
    "ipv4": ("256.1.1.1", "01.2.3.4", "1.2.3.04", "1.2.3", "1.2.3.4.5"),
    "ipv6": ("12345::", "1:2:3:4:5:6:7:8:9", "1::2::3", ":::1", "::ffff:192.168.0.01"),
    "email": ("plainaddress", "@example.com", "user@", "user@@example.com",
              "us er@example.com"),
    "hostname": ("-example.com", "example-.com", "exa_mple.com", "a..b", "a" * 64 + ".com"),
    "uuid": ("2eb8aa08-aa98-11ea-b4aa-73b441d1638", "2eb8aa08aa9811eab4aa73b441d16380",
             "zeb8aa08-aa98-11ea-b4aa-73b441d16380", "2eb8aa08-aa98-11ea-b4aa-73b441d16380-"),
    "uri": ("example.com/path", "//example.com/path", "http://exa mple.com/",
            "http://example.com/\\"),
    "duration": ("P", "PT", "1Y", "P1D2H", "PT1D", "P1Y2"),
}

_OFFSET = re.compile(r"([Zz]|[+-]\d{2}:\d{2})$")


def _common_year(year: int) -> int:
    while calendar.isleap(year):
        year += 1
    return year


def _derived(fmt: str, value: str) -> list[str]:
    """Mutants made from a valid ``value``: its date moved to 02-29 of a common year, its
    date-time or time without the offset."""
    out = []
    if fmt in ("date", "date-time") and re.match(r"\d{4}-", value):
        out.append(f"{_common_year(int(value[:4])):04d}-02-29" + value[10:])
    if fmt in ("date-time", "time") and _OFFSET.search(value):
        out.append(_OFFSET.sub("", value))
    return out


class _Recorder(jsonschema.FormatChecker):
    """Records the ``(format, string)`` pairs a validation asks about."""

    def __init__(self) -> None:
        super().__init__(formats=())
        self.seen: set[tuple[str, str]] = set()

    def check(self, instance: Any, format: str) -> None:
        if isinstance(instance, str):
            self.seen.add((format, instance))


def _strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*path, i))


def _replace(value: Any, path: tuple[Any, ...], new: str) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


def format_mutants(schema: Any, instance: Any, per_format: int = 2
                   ) -> list[tuple[str, str, str, Any]]:
    """``(pointer, format, planted, mutant)``: ``instance`` (valid) with one string a ``format`` of
    :data:`FORMAT_MUTANTS` applies to replaced by a string not of that format, for at most
    ``per_format`` places per format. Each mutant is checked to be invalid by ``jsonschema``
    (the schema's draft) with a format checker that refuses exactly the planted string for that
    format, so a branch or another keyword that takes it anyway (``anyOf`` with a plain string,
    say) rules it out."""
    cls = jsonschema.validators.validator_for(schema, default=Validator)
    recorder = _Recorder()
    try:
        cls(schema, format_checker=recorder).is_valid(instance)
    except Exception:  # noqa: BLE001 - e.g. a pattern Python's re cannot compile: no oracle
        return []
    base = cls.FORMAT_CHECKER.checkers
    out: list[tuple[str, str, str, Any]] = []
    places: dict[str, int] = {}
    for path, value in _strings(instance):
        for fmt in sorted(f for f, v in recorder.seen if v == value and f in FORMAT_MUTANTS):
            if places.get(fmt, 0) >= per_format:
                continue
            places[fmt] = places.get(fmt, 0) + 1
            for planted in dict.fromkeys([*FORMAT_MUTANTS[fmt], *_derived(fmt, value)]):
                if planted == value:
                    continue
                mutant = _replace(instance, path, planted)
                checker = jsonschema.FormatChecker(formats=())
                checker.checkers = dict(base)
                real = base.get(fmt, (lambda v: True, ()))[0]
                checker.checks(fmt)(lambda v, p=planted, real=real: v != p and real(v))
                if not cls(schema, format_checker=checker).is_valid(mutant):
                    pointer = "".join(f"/{p}" for p in path)
                    out.append((pointer, fmt, planted, mutant))
    return out


def mutant_tests(case: SuiteCase, per_format: int = 2) -> list[tuple[str, str, str, Any]]:
    """``(description, format, planted, mutant)`` for the :func:`format_mutants` of every valid
    instance of ``case``, each mutant once (described ``"<valid test> | <format> mutant at
    <pointer>: <planted>"``)."""
    out = []
    seen = set()
    for desc, instance, valid in case.tests:
        if not valid:
            continue
        for pointer, fmt, planted, mutant in format_mutants(case.schema, instance, per_format):
            text = json.dumps(mutant, sort_keys=True)
            if text in seen:
                continue
            seen.add(text)
            out.append((f"{desc} | {fmt} mutant at {pointer or '/'}: {planted}", fmt, planted,
                        mutant))
    return out
