"""Meta-validation of a JSON schema against the Draft 2020-12 meta-schema: ``jsonschema_rs``
accepts the valid schemas fast, ``jsonschema`` decides the rest and words the error (keyword and
JSON path). The meta-schema's vocabularies are merged into one flat schema once per process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jsonschema

from grammarserve.errors import SchemaValidationError
from grammarserve.fsm.patterns import format_checker
from grammarserve.fsm.schema.tree import TooDeep, copy_json, json_path

_META = "https://json-schema.org/draft/2020-12/"
_VOCABULARIES = ("schema", "meta/core", "meta/applicator", "meta/unevaluated", "meta/validation",
                 "meta/meta-data", "meta/format-annotation", "meta/content")


def _static_refs(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("$dynamicRef") == "#meta":
            return {"$ref": "#"}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("meta/") and "#/$defs/" in ref:
            # NOTE: the vocabularies' $defs are merged into one, so a reference into another
            # vocabulary (``dependencies`` -> ``meta/validation#/$defs/stringArray``) is local
            node = {**node, "$ref": "#" + ref.split("#", 1)[1]}
        return {k: _static_refs(v) for k, v in node.items() if k != "$dynamicAnchor"}
    if isinstance(node, list):
        return [_static_refs(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def _flat_meta_schema() -> dict[str, Any]:
    """The Draft 2020-12 meta-schema with its vocabularies merged into one schema and
    ``$dynamicRef: "#meta"`` replaced by ``$ref: "#"`` (built once per process)."""
    from jsonschema_specifications import REGISTRY

    flat: dict[str, Any] = {"type": ["object", "boolean"], "properties": {}, "$defs": {}}
    for vocab in _VOCABULARIES:
        contents = REGISTRY.contents(_META + vocab)
        flat["properties"].update(_static_refs(contents.get("properties", {})))
        flat["$defs"].update(_static_refs(contents.get("$defs", {})))
    return flat


@functools.lru_cache(maxsize=1)
def _meta_validator() -> jsonschema.Draft202012Validator:
    """A ``jsonschema`` validator for :func:`_flat_meta_schema`, with the ``regex`` format check
    (``patterns.py``: Python's ``re``, plus Unicode property escapes).

    NOTE: equivalent to ``Draft202012Validator.check_schema`` (same vocabularies, same regex
    format check but for ``\\p{...}``; verified on the whole JSON-Schema-Test-Suite and
    schemas/) but ~20x faster, since the dynamic-reference resolution dominates the stock
    meta-validation cost.
    """

    return jsonschema.Draft202012Validator(_flat_meta_schema(), format_checker=format_checker())


@functools.lru_cache(maxsize=1)
def _fast_meta_validator() -> Callable[[Any], bool] | None:
    """``jsonschema_rs``'s ``is_valid`` for :func:`_flat_meta_schema`, or ``None`` when
    ``jsonschema_rs`` is not installed.

    NOTE: the meta-schema's formats are checked exactly as :func:`_meta_validator` checks
    them (``regex`` by Python's ``re``, not ``jsonschema_rs``'s ECMA dialect; the formats
    ``jsonschema`` has no checker for are not checked), so both give the same verdicts.
    """
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - jsonschema_rs is optional at run time
        return None
    validator = jsonschema_rs.Draft202012Validator(
        _flat_meta_schema(), validate_formats=True,
        formats=format_overrides(_flat_meta_schema(), jsonschema.Draft202012Validator))
    return validator.is_valid  # type: ignore[no-any-return]


def format_overrides(meta: Any, cls: Any) -> dict[str, Callable[..., bool]]:
    """``jsonschema_rs`` format checkers for every format ``meta`` uses, each deciding exactly
    as ``cls.FORMAT_CHECKER`` (``jsonschema``) does: unknown formats pass."""

    checker = format_checker() if cls is jsonschema.Draft202012Validator else cls.FORMAT_CHECKER
    return {name: functools.partial(_conforms, checker, name) for name in _formats_used(meta)}


def _formats_used(node: Any) -> set[str]:
    if isinstance(node, dict):
        own = {node["format"]} if isinstance(node.get("format"), str) else set()
        return own.union(*(_formats_used(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_formats_used(v) for v in node))
    return set()


def _conforms(checker: jsonschema.FormatChecker, name: str, value: Any) -> bool:
    return name not in checker.checkers or bool(checker.conforms(value, name))


def _accepts(fast: Callable[[Any], bool], schema: Any) -> bool:
    try:
        return fast(schema)
    except Exception:  # noqa: BLE001 - e.g. a value it cannot convert: jsonschema decides
        return False


def meta_validate(schema: dict[str, Any] | bool, *, shallow: bool | None = None) -> None:
    """Check ``schema`` against the Draft 2020-12 meta-schema.

    ``jsonschema_rs`` (~100x faster) accepts the valid schemas; what it does not accept (or
    cannot take: nested deeper than ``FAST_MAX_DEPTH``, a value it cannot convert) is decided
    by ``jsonschema``, which also builds the message (keyword and JSON path). ``shallow``: the
    caller already knows whether the schema is within ``FAST_MAX_DEPTH`` (``None``: find out).
    """

    fast = _fast_meta_validator()
    if fast is not None and shallow is None:
        try:
            copy_json(schema)
            shallow = True
        except (TooDeep, RecursionError):
            shallow = False
    if fast is not None and shallow and _accepts(fast, schema):
        return
    try:
        error = jsonschema.exceptions.best_match(_meta_validator().iter_errors(schema))
    except RecursionError:
        raise SchemaValidationError("the schema is nested too deeply", path="$") from None
    if error is not None:
        parts = tuple(error.absolute_path)
        raise SchemaValidationError(f"invalid JSON Schema at {json_path(parts)}: "
                                    f"{error.message}", path=json_path(parts))
