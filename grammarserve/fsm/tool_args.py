"""Lark rules of one call's arguments, by encoding (:class:`~grammarserve.fsm.tool_formats.Args`).

- ``JSON``: the tool's ``parameters`` as one ``%json`` schema (strict or not, as the front end
  prepared it).
- ``XML`` (Qwen3-Coder): ``<parameter=P>\\nVALUE\\n</parameter>\\n`` per property, in the
  schema's order, required ones always, optional ones maybe. A ``string`` value is raw text (up
  to the first ``\\n</parameter>``; an ``enum``/``const`` of strings is its literals), a
  ``boolean`` ``true``/``false`` or, as the template writes it, ``True``/``False``; any other
  value is JSON under its own sub-schema.
- ``PYTHONIC``: ``P=VALUE`` pairs joined by ``", "``, in the same order; ``True``/``False``/
  ``None`` for booleans and null, JSON (which is then the same Python literal) for strings,
  numbers and arrays/objects of them.

Refused, with a :class:`GrammarError` naming the tool, the property and the keyword (rather
than a weaker grammar): for XML and pythonic, object keywords the per-property sequence cannot
hold (``patternProperties``, ``minProperties``, ``anyOf`` at the top, ...), required properties
that are not listed; for XML, a property that may be a string *or* something else (a raw string
could not be told from JSON) and string keywords on raw strings (``pattern``, ``minLength``,
``format``, ...); for pythonic, names that are no Python identifiers and values whose JSON is no
Python literal (``true``, ``null`` inside arrays or objects, or untyped values).
"""

from __future__ import annotations

import json
from typing import Any

from grammarserve.errors import GrammarError
from grammarserve.fsm.tool_formats import Args, python_literal

#: Keywords of the arguments object that a fixed sequence of properties cannot express.
_OBJECT_REFUSED = ("patternProperties", "minProperties", "maxProperties", "dependentRequired",
                   "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties",
                   "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "enum",
                   "const")
#: Keywords a raw (XML) string may carry: annotations only.
_ANNOTATIONS = {"type", "description", "title", "default", "examples", "$comment", "deprecated",
                "readOnly", "writeOnly", "$id", "$schema", "$anchor", "x-guidance"}
#: Lazy raw-string value of an XML parameter, with its end tag (shared by every parameter).
RAW_RULE = r"xml_raw[lazy]: /(?s:.*)\n<\/parameter>\n/"


def lit(text: str) -> str:
    """A Lark string literal of ``text``."""
    return json.dumps(text, ensure_ascii=False)


def _refuse(tool: str, where: str, what: str, keyword: str, encoding: Args) -> GrammarError:
    label = "qwen3_coder" if encoding is Args.XML else encoding.value
    return GrammarError(f"tool {tool!r}: {what}; the {label} tool-call format cannot express it "
                        f"faithfully ({encoding.value} arguments, keyword '{keyword}')",
                        path=where)


def resolve_ref(schema: Any, root: dict[str, Any]) -> Any:
    """``schema``, with a local ``$ref`` to ``#/$defs/X`` (or ``#/definitions/X``) followed."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 32:
        parts = schema["$ref"].split("/")
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
            return schema
        schema = (root.get(parts[1]) or {}).get(parts[2], schema)
        seen += 1
    return schema


def value_types(schema: Any) -> set[str] | None:
    """The JSON types ``schema`` allows, when it says (``type``, or ``enum``/``const``)."""
    if not isinstance(schema, dict):
        return None if schema is True else set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return set(kind)
    values = schema["enum"] if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is None:
        return None
    return {"string" if isinstance(v, str) else "boolean" if isinstance(v, bool) else
            "null" if v is None else "number" for v in values}


def properties_of(tool: str, params: dict[str, Any], where: str, encoding: Args
                  ) -> list[tuple[str, Any, bool]]:
    """``(name, schema, required)`` of each property of ``params``, in order; refuses what a
    sequence of properties cannot express."""
    for key in _OBJECT_REFUSED:
        if key in params:
            raise _refuse(tool, f"{where}.{key}", f"the arguments schema uses '{key}'", key,
                          encoding)
    props = params.get("properties") or {}
    required = params.get("required") or []
    missing = [r for r in required if r not in props]
    if missing:
        raise _refuse(tool, f"{where}.required", f"required properties {missing} are not in "
                      "'properties'", "required", encoding)
    return [(name, sub, name in required) for name, sub in props.items()]


def _xml_value(tool: str, name: str, sub: Any, root: dict[str, Any], where: str
               ) -> str | None:
    """The value grammar of an XML parameter: ``None`` for a raw string, the literals of a
    string ``enum``, or ``""`` for JSON (under its sub-schema)."""
    target = resolve_ref(sub, root)
    types = value_types(target)
    if types is None or ("string" in types and len(types) > 1):
        raise _refuse(tool, f"{where}.properties.{name}", f"parameter {name!r} may be a string "
                      "or another type (strings are written raw)", "type", Args.XML)
    if types == {"boolean"} and set(target) <= _ANNOTATIONS:  # NOTE: the template's own True
        return " | ".join(lit(v + "\n</parameter>\n") for v in ("true", "false", "True", "False"))
    if types != {"string"}:
        return ""
    values = target.get("enum") if isinstance(target.get("enum"), list) else (
        [target["const"]] if "const" in target else None)
    if values is not None:
        return " | ".join(lit(v + "\n</parameter>\n") for v in values)
    extra = sorted(k for k in target if k not in _ANNOTATIONS)
    if extra:
        raise _refuse(tool, f"{where}.properties.{name}.{extra[0]}", f"parameter {name!r} is a "
                      f"raw string with '{extra[0]}'", extra[0], Args.XML)
    return None


def _py_safe(schema: Any, root: dict[str, Any], depth: int = 0) -> bool:
    """Every value ``schema`` allows is written the same as JSON and as a Python literal
    (strings, numbers, and arrays/objects of them)."""
    target = resolve_ref(schema, root)
    types = value_types(target)
    if types is None or not isinstance(target, dict) or depth > 16:
        return False
    if types & {"boolean", "null"} or any(k in target for k in ("anyOf", "oneOf", "allOf",
                                                                 "not", "if")):
        return False
    if "array" in types:
        items = [target.get("items", False)] + list(target.get("prefixItems", []))
        if not all(i is False or _py_safe(i, root, depth + 1) for i in items):
            return False
    if "object" in types:
        subs = list((target.get("properties") or {}).values())
        extra = target.get("additionalProperties", True)
        if target.get("patternProperties") or extra is True or not all(
                _py_safe(s, root, depth + 1) for s in subs + ([extra] if extra else [])):
            return False
    return True


def _py_value(tool: str, name: str, sub: Any, root: dict[str, Any], where: str) -> str:
    """The value grammar of a pythonic argument: literals, or ``""`` for JSON."""
    if not name.isidentifier():
        raise _refuse(tool, f"{where}.properties.{name}", f"parameter {name!r} is not a "
                      "Python identifier", "properties", Args.PYTHONIC)
    target = resolve_ref(sub, root)
    values = target.get("enum") if isinstance(target, dict) and isinstance(
        target.get("enum"), list) else ([target["const"]] if isinstance(target, dict)
                                         and "const" in target else None)
    if values is not None and all(not isinstance(v, (list, dict)) for v in values):
        return " | ".join(lit(python_literal(v)) for v in values)
    types = value_types(target)
    if types == {"boolean"} and set(target) <= _ANNOTATIONS:
        return '"True" | "False"'
    if types == {"null"} and set(target) <= _ANNOTATIONS:
        return '"None"'
    if not _py_safe(sub, root):
        raise _refuse(tool, f"{where}.properties.{name}", f"parameter {name!r} allows values "
                      "whose JSON is not a Python literal (booleans or null inside, or no "
                      "type)", "type", Args.PYTHONIC)
    return ""


def check_args(encoding: Args, tool: str, params: dict[str, Any], where: str) -> None:
    """Refuse (``GrammarError``) what ``encoding`` cannot write of a tool's ``parameters``."""
    if encoding is Args.JSON:
        return
    for name, sub, _ in properties_of(tool, params, where, encoding):
        if encoding is Args.XML:
            _xml_value(tool, name, sub, params, where)
        else:
            _py_value(tool, name, sub, params, where)


def _json_sub(sub: Any, params: dict[str, Any], json_options: dict[str, Any]) -> str:
    """``%json`` of a property's schema, with the arguments' ``$defs`` beside it."""
    schema: dict[str, Any] = dict(sub) if isinstance(sub, dict) else {}
    for key in ("$defs", "definitions"):
        if key in params:
            schema[key] = params[key]
    schema["x-guidance"] = json_options
    return "%json " + json.dumps(schema, ensure_ascii=False)


def args_rules(encoding: Args, tool: str, params: dict[str, Any], rule: str,
               json_options: dict[str, Any]) -> tuple[list[str], bool]:
    """``(rules, empty)``: Lark rules defining ``rule`` (the arguments of ``tool``), and
    whether the arguments may be empty text (then ``rule`` is undefined when no property
    exists, or optional)."""
    if encoding is Args.JSON:
        return [f"{rule}: " + _json_sub(params, {}, json_options)], False
    rules: list[str] = []
    items: list[tuple[str, bool]] = []
    for k, (name, sub, required) in enumerate(properties_of(tool, params, "$", encoding)):
        item = f"{rule}_{k}"
        if encoding is Args.XML:
            value = _xml_value(tool, name, sub, params, "$")
            head = lit(f"<parameter={name}>\n")
            if value is None:
                rules.append(f"{item}: {head} xml_raw")
            elif value:
                rules.append(f"{item}: {head} ({value})")
            else:
                rules.append(f"{item}_v: " + _json_sub(sub, params, json_options))
                rules.append(f'{item}: {head} {item}_v "\\n</parameter>\\n"')
        else:
            value = _py_value(tool, name, sub, params, "$")
            if not value:
                rules.append(f"{item}_v: " + _json_sub(sub, params, json_options))
                value = f"{item}_v"
            rules.append(f"{item}: {lit(name + '=')} ({value})")
        items.append((item, required))
    if not items:
        return [], True
    if encoding is Args.XML:
        body = " ".join(i if req else f"{i}?" for i, req in items)
    else:
        body = _comma_joined(items)
    empty = not any(req for _, req in items)
    if empty:
        body = f"({body})"
    return [*rules, f"{rule}: {body}"], empty


def _comma_joined(items: list[tuple[str, bool]]) -> str:
    """Items in order joined by ``", "``, the optional ones maybe left out (no stray comma).
    Built from the end: ``rest`` follows an item already written, ``first`` writes the first."""
    rest, first = "", ""
    for item, required in reversed(items):
        more = f" {rest}" if rest else ""
        if required:
            first = f"{item}{more}"
            rest = f'", " {item}{more}'
        else:
            alt = f"{item}{more}"
            first = f"({alt} | {first})" if first else f"({alt})?"
            rest = f'(", " {item})?{more}'
    return first
