"""The field readers of a structural tag's front end (``structural_tag.py``): each checks one
field's type and returns its value, or raises ``GrammarError`` naming its path."""

from __future__ import annotations

from typing import Any, NoReturn

from grammarserve.errors import GrammarError


def excludes(v: dict[str, Any], path: str) -> list[str]:
    if v.get("excludes") is None:
        return []
    return strings(v["excludes"], f"{path}.excludes", nonempty=False)


def flag(v: dict[str, Any], name: str, path: str) -> bool:
    value = v.get(name, False)
    if not isinstance(value, bool):
        fail(f"{path}.{name}", f"must be a boolean, got {kind_of(value)}")
    return value


def count(value: Any, path: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        fail(path, f"must be an integer from 0 to {most}, got {value!r}")
    return value


def items(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        fail(path, f"must be a non-empty list, got {kind_of(value)}")
    return value


def string(value: Any, path: str, nonempty: bool = True) -> str:
    if not isinstance(value, str) or (nonempty and not value):
        fail(path, f"must be a {'non-empty ' if nonempty else ''}string, got {value!r}"[:300])
    return value


def strings(value: Any, path: str, *, nonempty: bool, empty_items: bool = False
            ) -> list[str]:
    """A list of strings (``nonempty``: at least one; ``empty_items``: ``""`` allowed)."""
    if not isinstance(value, list) or (nonempty and not value):
        fail(path, f"must be a {'non-empty ' if nonempty else ''}list of strings, got "
                   f"{kind_of(value)}")
    for i, s in enumerate(value):
        string(s, f"{path}[{i}]", nonempty=not empty_items)
    return list(value)


def only(value: dict[str, Any], fields: tuple[str, ...], path: str) -> None:
    """Unknown fields are refused, not ignored: a misspelt one would weaken the constraint."""
    for key in value:
        if key not in fields:
            fail(f"{path}.{key}", f"unknown field {key!r} here (known: {', '.join(fields)})")


def kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def fail(path: str, message: str) -> NoReturn:
    raise GrammarError(f"{path}: {message}", path=path)
