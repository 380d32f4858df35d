"""Schemas written in an older JSON Schema draft, translated exactly into Draft 2020-12.

A schema that declares draft-04, -06, -07 or 2019-09 with ``$schema`` (read as
``jsonschema.validators.validator_for`` reads it, so the same dialect ``jsonschema`` would
validate with) is meta-validated against that draft's meta-schema, its ``$ref``s are made local
pointers in that draft's terms (``schema/read/localrefs.py``: ``id``/``$id`` base changes and anchors), and
the keywords whose meaning changed are rewritten into their 2020-12 form:

- ``items: [...]`` -> ``prefixItems``, and ``additionalItems`` beside it -> ``items`` (without an
  ``items`` array, ``additionalItems`` means nothing and is dropped);
- ``dependencies`` -> ``dependentRequired`` (array values) and ``dependentSchemas`` (schemas);
- draft-04 boolean ``exclusiveMaximum``/``exclusiveMinimum`` -> the numeric forms;
- drafts 4-7 ignore every keyword beside ``$ref``: the ones 2020-12 would apply are dropped;
- 2019-09 ``$recursiveRef: "#"`` -> ``$ref: "#"`` when no resource but the root sets
  ``$recursiveAnchor`` (it then always resolves where ``$ref`` does);
- ``$schema`` is removed (the result is Draft 2020-12).

Keywords a later draft introduced (``const`` or ``if`` in a draft-04 schema) are kept and
enforced: the older draft would ignore them, but they are what the author meant, and enforcing
them only narrows what is generated. Draft-03 is refused.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema

from grammarserve.errors import SchemaValidationError, UnsupportedSchemaError
from grammarserve.fsm.schema.read.localrefs import localize_refs
from grammarserve.fsm.schema.read.metavalidate import format_overrides
from grammarserve.fsm.schema.tree import (
    SUBSCHEMA_KEYWORDS,
    Parts,
    Shape,
    copy_json,
    iter_any_draft,
    json_path,
    pointer,
    pointer_parts,
    resolve_pointer,
)

#: ``validator_for`` class name -> draft number (2020: nothing to translate).
_DRAFTS = {"Draft4Validator": 4, "Draft6Validator": 6, "Draft7Validator": 7,
           "Draft201909Validator": 2019, "Draft202012Validator": 2020}

#: Keywords beside ``$ref`` that drafts 4-7 ignore and 2020-12 would apply (annotations,
#: ``definitions``/``$defs`` and unknown keys are kept: they assert nothing).
_REF_IGNORED = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependencies", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "items", "additionalItems", "prefixItems",
    "contains", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas",
    "unevaluatedItems", "unevaluatedProperties", "format", "contentSchema", "$id", "id",
    "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"})

#: 2020-12's meta-schema URI and the "latest" alias (read as 2020-12), as SchemaStore writes them.
_LATEST = re.compile(r"^https?://json-schema\.org/(draft/2020-12/)?schema#?$")


def declared_draft(schema: Any) -> int:
    """The draft ``schema`` declares (4, 6, 7, 2019 or 2020; 2020 when it declares none or
    one ``jsonschema`` does not know); refuses draft-03."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return 2020
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    draft = _DRAFTS.get(cls.__name__)
    if draft is None:
        raise UnsupportedSchemaError(
            f"the schema declares {schema['$schema']!r} ({cls.__name__}); draft-03 schemas are "
            "not supported: use draft-04 or later", path="$.$schema", keyword="$schema")
    return draft


def to_draft_2020(schema: Any) -> Any:
    """``schema`` in Draft 2020-12 terms: unchanged (the same object) if it declares nothing,
    refused if it declares a URI that is no known draft (a custom meta-schema), a copy of its top level without ``$schema`` if it declares 2020-12 or the
    "latest" alias ``http://json-schema.org/schema``, else meta-validated against its draft and
    translated (a new object).

    Raises
    ------
    SchemaValidationError
        The schema is not valid under the draft it declares.
    UnsupportedSchemaError
        Draft-03, a custom meta-schema, or a ``$ref`` into a keyword the translation removes.
    """
    draft = declared_draft(schema)
    if draft == 2020:
        if isinstance(schema, dict) and _LATEST.match(str(schema.get("$schema", ""))):
            # NOTE: dropped as for the other drafts, or llguidance tries to fetch the "latest"
            # alias
            return {k: v for k, v in schema.items() if k != "$schema"}
        if isinstance(schema, dict) and "$schema" in schema and \
                jsonschema.validators.validator_for(schema, default=None) is None:
            # NOTE: refused here, not by a backend: llguidance refuses to fetch it, but
            # xgrammar (the fallback) ignores it and would assert what it may switch off
            raise UnsupportedSchemaError(
                f"the schema declares the meta-schema {schema['$schema']!r}, which is no JSON "
                "Schema draft this server knows; a custom meta-schema's vocabularies decide "
                "which keywords assert, and it is never fetched: declare a draft (or none)",
                path="$.$schema", keyword="$schema")
        return schema
    _meta_validate(schema, draft)

    out = copy_json(schema, depth=10_000)
    if draft == 2019:
        _recursive_refs(out)
    localize_refs(out, draft)
    return translate(out, draft)


def translate(schema: dict[str, Any], draft: int) -> dict[str, Any]:
    """Rewrite the draft-``draft`` keywords of ``schema`` into Draft 2020-12 (in place, see the
    module docstring); its ``$ref``s must already be local pointers (``schema/read/localrefs.py``)."""

    nodes = list(iter_any_draft(schema))
    new_refs: list[tuple[dict[str, Any], str]] = []
    for node, parts in nodes:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and not _ignored(schema, parts, draft):
            try:
                resolve_pointer(schema, ref)
            except (KeyError, IndexError, ValueError):
                continue  # dangling: the front end says so
            new_refs.append((node, _remap(schema, ref, draft, parts)))
    for node, _ in nodes:
        _translate_node(node, draft)
    for node, ref in new_refs:
        node["$ref"] = ref
    schema.pop("$schema", None)
    return schema


def _ignored(root: dict[str, Any], parts: Parts, draft: int) -> bool:
    """True if the subschema at ``parts`` lies in a keyword beside a ``$ref`` that the draft
    ignores (it is dropped with it)."""
    for node, part, is_schema in _steps(root, parts):
        if is_schema and draft <= 7 and "$ref" in node and part in _REF_IGNORED:
            return True
    return False


def _steps(root: Any, parts: Parts) -> Iterator[tuple[Any, str | int, bool]]:
    """Along ``parts`` from ``root``: each container, the step taken from it, and whether the
    container is a schema (else a map of named subschemas or a list)."""
    node, is_schema = root, True
    for part in parts:
        yield node, part, is_schema
        if isinstance(node, list):
            node, is_schema = node[int(part)], True
            continue
        value = node[part]
        is_schema = not is_schema or not (Shape.MAP in SUBSCHEMA_KEYWORDS.get(str(part), ())
                                       or Shape.LIST in SUBSCHEMA_KEYWORDS.get(str(part), ())
                                       and isinstance(value, list))
        node = value


def _translate_node(node: dict[str, Any], draft: int) -> None:
    if draft <= 7 and "$ref" in node:
        for key in _REF_IGNORED & set(node):
            del node[key]
    if isinstance(node.get("items"), list):
        node["prefixItems"] = node.pop("items")
        if "additionalItems" in node:
            node["items"] = node.pop("additionalItems")
    node.pop("additionalItems", None)
    deps = node.get("dependencies")
    if draft <= 7 and isinstance(deps, dict):
        del node["dependencies"]
        required = {k: v for k, v in deps.items() if isinstance(v, list)}
        schemas = {k: v for k, v in deps.items() if not isinstance(v, list)}
        if required:
            node["dependentRequired"] = {**required, **node.get("dependentRequired", {})}
        if schemas:
            node["dependentSchemas"] = {**schemas, **node.get("dependentSchemas", {})}
    if draft == 4:
        for bound in ("Maximum", "Minimum"):
            flag = node.get("exclusive" + bound)
            if isinstance(flag, bool):
                del node["exclusive" + bound]
                if flag and bound.lower() in node:
                    node["exclusive" + bound] = node.pop(bound.lower())
    for key in ("$id", "id", "$anchor") if draft <= 7 else ():
        if isinstance(node.get(key), str):
            del node[key]  # base changes and anchors are resolved (localrefs.py)
    node.pop("$schema", None)


def _remap(root: dict[str, Any], ref: str, draft: int, where: Parts) -> str:
    """The pointer ``ref`` (into ``root`` as written in draft ``draft``) after translation."""

    out: list[str | int] = []
    for node, part, is_schema in _steps(root, pointer_parts(ref)):
        step: str | int = part
        if is_schema and isinstance(node, dict):
            gone = (draft <= 7 and "$ref" in node and part in _REF_IGNORED) or (
                part == "additionalItems" and not isinstance(node.get("items"), list))
            if gone:
                at = json_path(where + ("$ref",))
                raise UnsupportedSchemaError(
                    f"$ref {ref!r} at {at} points into '{part}', which the schema's draft "
                    "ignores there; point at a subschema in 'definitions' instead", path=at,
                    keyword="$ref")
            if part == "items" and isinstance(node.get("items"), list):
                step = "prefixItems"
            elif part == "additionalItems":
                step = "items"
            elif part == "dependencies" and draft <= 7:
                step = "dependentSchemas"
        elif isinstance(node, list):
            step = int(part)
        out.append(step)
    return pointer(tuple(out))


def _recursive_refs(schema: dict[str, Any]) -> None:
    """2019-09: ``$recursiveRef: "#"`` -> ``$ref: "#"`` where no resource but the root sets
    ``$recursiveAnchor: true`` (in place; otherwise left for the front end to refuse)."""
    nodes = list(iter_any_draft(schema))
    if any(n.get("$recursiveAnchor") is True for n, parts in nodes if parts):
        return
    for node, _ in nodes:
        if node.get("$recursiveRef") == "#":
            del node["$recursiveRef"]
            if "$ref" in node:
                node.setdefault("allOf", []).append({"$ref": "#"})
            else:
                node["$ref"] = "#"
        node.pop("$recursiveAnchor", None)


def _meta_validate(schema: dict[str, Any], draft: int) -> None:
    fast = _fast_validator(draft)
    if fast is not None and _accepts(fast, schema):
        return

    cls = jsonschema.validators.validator_for(schema)
    try:
        error = jsonschema.exceptions.best_match(_slow_validator(cls).iter_errors(schema))
    except RecursionError:
        raise SchemaValidationError("the schema is nested too deeply", path="$") from None
    if error is not None:
        where = json_path(tuple(error.absolute_path))
        raise SchemaValidationError(
            f"invalid JSON Schema ({cls.__name__.removesuffix('Validator')}) at {where}: "
            f"{error.message}", path=where)


def _accepts(fast: Callable[[Any], bool], schema: Any) -> bool:
    try:
        return fast(schema)
    except Exception:  # noqa: BLE001 - e.g. nested too deeply for it: jsonschema decides
        return False


@functools.lru_cache(maxsize=8)
def _slow_validator(cls: Any) -> Any:
    return cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER)


@functools.lru_cache(maxsize=8)
def _fast_validator(draft: int) -> Callable[[Any], bool] | None:
    """``jsonschema_rs``'s verdict against the draft's meta-schema, with the meta-schema's
    formats checked exactly as ``jsonschema`` checks them (``metavalidate.format_overrides``)."""
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - jsonschema_rs is optional at run time
        return None

    name = {4: "Draft4", 6: "Draft6", 7: "Draft7", 2019: "Draft201909"}[draft] + "Validator"
    cls = getattr(jsonschema, name)
    meta = cls.META_SCHEMA
    validator = getattr(jsonschema_rs, name)(meta, validate_formats=True,
                                             formats=format_overrides(meta, cls))
    return validator.is_valid  # type: ignore[no-any-return]
