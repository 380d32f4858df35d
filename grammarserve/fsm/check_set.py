"""The value checks of one grammar (``schema/checks/split.py`` finds them) with their
validators, built once and shared by the grammar's :class:`~grammarserve.fsm.checked_matcher.
CheckedMatcher` s: ``jsonschema_rs`` when installed, else ``jsonschema`` (Draft 2020-12,
formats as annotations)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.json_track import Path
from grammarserve.fsm.value_check import ValueCheck

Validator = Callable[[Any], "str | None"]  # the error message, or None if valid
#: Paths whose answer to ``CheckSet.holds`` is remembered (shared by a grammar's matchers).
_HOLDS_MEMO = 4096


def make_validator(schema_text: str) -> Validator:
    """A Draft 2020-12 validator of ``schema_text`` (formats are annotations, as in the spec);
    raises ``ValueError`` if the schema cannot be compiled."""
    schema = json.loads(schema_text)
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - jsonschema_rs is optional
        return _slow_validator(schema)
    try:
        fast = jsonschema_rs.Draft202012Validator(schema, validate_formats=False)
    except Exception as e:  # noqa: BLE001 - e.g. a regex the Rust engine refuses
        raise ValueError(str(e).split("\n")[0]) from None

    def check_fast(value: Any) -> str | None:
        if fast.is_valid(value):
            return None
        error = next(iter(fast.iter_errors(value)), None)
        return str(error.message) if error is not None else "invalid"

    return check_fast


def _slow_validator(schema: Any) -> Validator:
    import jsonschema

    slow = jsonschema.Draft202012Validator(schema)

    def check_slow(value: Any) -> str | None:
        error = jsonschema.exceptions.best_match(slow.iter_errors(value))
        return None if error is None else str(error.message)

    return check_slow


class CheckSet:
    """The checks of one grammar, with their validators (built once, shared by its
    matchers), the tokens' bytes and the retry bound."""

    def __init__(self, checks: tuple[ValueCheck, ...], token_bytes: list[bytes],
                 max_retries: int) -> None:
        self.checks = checks
        self.token_bytes = token_bytes
        self.max_retries = max_retries
        # NOTE: a schema may have hundreds of checks (one per place a $ref'd subschema is
        # used); a value of depth d can only match a location of d steps (a "unique" check:
        # d - 1, the array holding it), so they are looked up by that length.
        self._by_depth: dict[int, list[ValueCheck]] = {}
        for c in checks:
            depth = len(c.location) + (1 if c.kind == "unique" else 0)
            self._by_depth.setdefault(depth, []).append(c)
        self._holds: dict[Path, bool] = {}
        self._validators: dict[str, Validator] = {}
        for c in checks:
            for text in (c.schema, c.item_schema):
                if text and text not in self._validators:
                    try:
                        self._validators[text] = make_validator(text)
                    except ValueError as e:
                        raise UnsupportedSchemaError(
                            f"unsupported keyword '{c.keyword}' at {c.schema_path}: its run-time "
                            f"check cannot be built ({e})", path=c.schema_path,
                            keyword=c.keyword) from None

    def validator(self, text: str) -> Validator:
        return self._validators[text]

    def candidates(self, path: Path) -> list[ValueCheck]:
        """The checks that may concern the value at ``path`` (those of its depth)."""
        return self._by_depth.get(len(path), [])

    def holds(self, path: Path) -> bool:
        """Whether the open value at ``path`` may still be rolled back by a check."""
        known = self._holds.get(path)
        if known is not None:
            return known
        found = False
        for c in self.candidates(path):
            if c.kind == "unique":
                if path and isinstance(path[-1], int) and c.matches(path[:-1]):
                    found = True
                    break
            elif c.matches(path):
                found = True
                break
        if len(self._holds) >= _HOLDS_MEMO:
            self._holds.clear()
        self._holds[path] = found
        return found
