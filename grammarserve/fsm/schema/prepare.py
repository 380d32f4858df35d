"""The JSON-Schema front end's stages, in order: parse, translate an older draft, meta-validate,
make references local, refuse keywords (after the exact rewrites, where they apply), check the
schema is finite and non-empty, strict mode's rules, normalize, put each object's own
``properties`` before its applicators' (``order.py``: the key order generated), fit numbers
to what the backend represents exactly, close. Sharing identical leaves (``schema/share.py``)
comes last, on the source the grammar is compiled from (``frontend.py``)."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grammarserve.errors import SchemaValidationError
from grammarserve.fsm.schema.algebra.finite import check_finite
from grammarserve.fsm.schema.close import close_schema
from grammarserve.fsm.schema.depth import check_schema_depth
from grammarserve.fsm.schema.exact_numbers import exact_numbers, exact_range
from grammarserve.fsm.schema.keywords import check_keywords
from grammarserve.fsm.schema.normalize import normalize
from grammarserve.fsm.schema.order import own_properties_first
from grammarserve.fsm.schema.read.drafts import to_draft_2020
from grammarserve.fsm.schema.read.localrefs import hoist_ref_targets, localize_refs
from grammarserve.fsm.schema.read.metavalidate import meta_validate
from grammarserve.fsm.schema.rewrites import rewrite_schema
from grammarserve.fsm.schema.strict import check_strict
from grammarserve.fsm.schema.tree import CHECKED, REWRITABLE, TooDeep, copy_json
from grammarserve.fsm.value_check import ValueCheck


@dataclass(frozen=True)
class Preparation:
    """How a schema is prepared: ``strict`` (OpenAI strict mode: its rules, and no rewrites);
    ``value_checks`` (what no grammar holds may become run-time checks); ``lean`` (conditions
    too: the fallback for a schema the backends refused); ``open_schemas`` (do not close);
    ``backend`` (a ``GrammarConfig.backend``: the numbers it represents exactly);
    ``max_depth`` (JSON levels)."""

    strict: bool
    value_checks: bool
    lean: bool
    open_schemas: bool
    backend: str
    max_depth: int


def prepare(schema: Any, how: Preparation) -> tuple[dict[str, Any], list[ValueCheck]]:
    """Every stage, in order (the module docstring): the schema a grammar is compiled from,
    and the value checks it leaves (empty unless ``how.value_checks``); raises
    ``GrammarError`` naming the problem."""
    check_schema_depth(schema, how.max_depth)
    checks: list[ValueCheck] | None = [] if how.value_checks and not how.strict else None
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    if not how.strict:
        rewrite = rewrite_schema if checks is None else functools.partial(
            rewrite_schema, checks=checks, lean=how.lean)
    # NOTE: strict mode refuses every keyword the rewrites remove: check it as written.
    prepared = prepare_schema(schema, rewrite=rewrite, checked=checks is not None)
    check_finite(prepared)
    if how.strict:
        check_strict(prepared)
    prepared = own_properties_first(normalize(prepared))
    prepared = exact_numbers(prepared, exact_range(how.backend), narrow=not how.open_schemas)
    if not how.open_schemas:
        prepared = close_schema(prepared)
    return prepared, checks or []


def parse_schema(schema: dict[str, Any] | str | bool) -> dict[str, Any] | bool:
    """Parse a schema given as text; refuse values that cannot be a schema."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise SchemaValidationError(
                f"the schema is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                path="$") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaValidationError(
            f"a JSON Schema must be an object or a boolean, got {type(schema).__name__}",
            path="$")
    return schema




def prepare_schema(schema: dict[str, Any] | str | bool,
                   rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None, *,
                   checked: bool = False) -> dict[str, Any]:
    """Parse, meta-validate and check ``schema``; return a deep copy ready for a backend
    (``true`` becomes ``{}``; ``false`` is refused since nothing can be generated).

    ``rewrite`` (``rewrite.rewrite_schema``) replaces keywords no backend enforces by exact
    equivalents, on the copy, before what is left is refused; the keywords it cannot touch are
    refused first, so a schema is refused for the same reason with or without it. ``checked``:
    the rewrite may also turn ``contains`` into run-time checks, so it is not refused first."""
    try:
        parsed = to_draft_2020(parse_schema(schema))
    except RecursionError:
        raise SchemaValidationError("the schema is nested too deeply", path="$") from None
    try:
        copied, shallow = copy_json(parsed), True
    except (TooDeep, RecursionError):
        copied, shallow = None, False
    meta_validate(parsed, shallow=shallow)
    if parsed is True:
        return {}
    if parsed is False:
        raise SchemaValidationError("the schema `false` accepts no instance, so nothing can be "
                                    "generated", path="$")
    if not isinstance(parsed, dict):  # unreachable: parse_schema returns a dict or a bool
        raise SchemaValidationError("a JSON Schema must be an object or a boolean", path="$")
    out: dict[str, Any] = copied if copied is not None else copy.deepcopy(parsed)
    out.pop("x-guidance", None)  # backend options are ours to set, not the user's
    try:
        # NOTE: the rewrites (and the second check) run only where they have work
        localize_refs(out)
        if rewrite is not None:
            # NOTE: before the keywords are checked: a $ref may reach a subschema in a keyword
            # no draft defines, which the front end would not walk
            hoist_ref_targets(out)
        skip = REWRITABLE | CHECKED if checked else REWRITABLE
        if rewrite is None or check_keywords(out, skip=skip):
            if rewrite is not None:
                out = rewrite(out)
            check_keywords(out)
    except RecursionError:
        raise SchemaValidationError("the schema is nested too deeply", path="$") from None
    return out
