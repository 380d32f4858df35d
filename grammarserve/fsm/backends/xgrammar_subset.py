"""The JSON Schema subset xgrammar enforces exactly.

xgrammar accepts every schema but silently ignores keywords it does not implement, and ignores
type-specific keywords in untyped subschemas, ``allOf``, ``$ref`` or ``anyOf`` siblings,
``multipleOf``, ``patternProperties``, ``propertyNames``, ``min/maxProperties`` and ``pattern``
combined with a length bound (measured on the JSON-Schema-Test-Suite: 272 invalid instances
accepted). This module accepts only schemas where every keyword is enforced, and names the first
keyword that is not.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.patterns import regex_chars
from grammarserve.fsm.schema.normalize import CALENDAR_PATTERNS, KNOWN_FORMATS
from grammarserve.fsm.schema.tree import iter_subschemas, json_path

_ESCAPED = re.compile(r'["\\\x00-\x1f\x7f]')
# ``^<one character><quantifier>$``: a bracket class, \d, \w or a plain character, repeated.
_SINGLE_CHAR_RUN = re.compile(r"^\^((?:\[(?:\\.|[^\]\\\[])+\])|\\[dw]|[A-Za-z0-9 _-])"
                              r"(?:([*+?])|\{(\d+)(?:(,)(\d*))?\})\$$")

#: Formats xgrammar (0.2.9) takes values of that are not valid (llguidance refuses them); date
#: and date-time reach no backend as formats (``normalize.CALENDAR_PATTERNS``).
#: NOTE: its stricter hostname (no upper case) is kept: rare in output, fast with xgrammar.
_FORMATS_OFF = {"ipv4": "takes leading zeros (01.2.3.4)"}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$schema", "$id", "$defs",
                          "definitions", "$anchor", "contentEncoding", "contentMediaType",
                          "discriminator"})
_BY_TYPE: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "boolean": frozenset(),
    "null": frozenset(),
}


#: Keywords that constrain only instances of one JSON type.
_ONLY_FOR: dict[str, frozenset[str]] = {
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties",
                         "minProperties", "maxProperties", "propertyNames"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                         "multipleOf"}),
}


def xgrammar_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema xgrammar compiles: a copy of ``schema`` with meaning-preserving rewrites of
    what xgrammar would ignore. Raises :class:`UnsupportedSchemaError` unless xgrammar enforces
    every keyword of the result.

    - A ``pattern`` that repeats one character class (``^[a-z0-9_]+$``) absorbs
      ``minLength``/``maxLength`` (``^[a-z0-9_]{3,20}$``).
    - An untyped subschema with type-specific keywords (``{"properties": ...}``, which any
      non-object also satisfies) becomes an ``anyOf`` of one typed branch per type it
      constrains and one branch for the other types.
    - Recursion through the root (``"$ref": "#"``) goes through ``$defs`` instead.
    - A key forbidden by ``properties: {k: false}`` beside ``additionalProperties: false`` is
      dropped from ``properties``.
    - A group made optional by ``?`` is written ``{0,1}`` (``optional_groups``).
    """
    out = copy.deepcopy(schema)
    for sub, _ in list(iter_subschemas(out)):
        _exact_optional_groups(sub)
        _drop_false_properties(sub)
        if "pattern" in sub and ("minLength" in sub or "maxLength" in sub):
            _merge_lengths(sub)
        if "type" not in sub:
            _split_by_type(sub)
    if any(sub.get("$ref") == "#" for sub, _ in iter_subschemas(out)):
        out = _root_into_defs(out)
    check_xgrammar_exact(out)
    return out


def optional_groups(pattern: str) -> str:
    """``pattern`` with each group quantifier ``?`` written ``{0,1}`` (the same language).
    xgrammar 0.2.9 drops the first character of a ``?``-optional group whose body ends in a
    repeat or holds a bounded one (``^a(\\.\\d+)?b$`` takes ``a1b``, so the front end's own
    date-time pattern took ``12:00:0012Z``; ``^1(x[0-9]{1,4})?$`` takes ``12``), and reads
    ``{0,1}`` right."""
    out, last = [], 0
    for i, c, inside in regex_chars(pattern):
        if not inside and c == ")" and pattern[i + 1:i + 2] == "?":
            out += [pattern[last:i + 1], "{0,1}"]
            last = i + 2
    return "".join(out) + pattern[last:]


#: The front end's exact date and date-time patterns (their alternatives are inside a group),
#: as xgrammar gets them.
_CALENDAR = frozenset(optional_groups(p) for p in CALENDAR_PATTERNS.values())


def _exact_optional_groups(sub: dict[str, Any]) -> None:
    if isinstance(sub.get("pattern"), str):
        sub["pattern"] = optional_groups(sub["pattern"])
    if isinstance(sub.get("patternProperties"), dict):
        sub["patternProperties"] = {optional_groups(k): v
                                    for k, v in sub["patternProperties"].items()}


def _drop_false_properties(sub: dict[str, Any]) -> None:
    """``properties: {k: false}`` (a forbidden key, as ``not: {required: [k]}`` is rewritten)
    beside ``additionalProperties: false`` means the same without ``k``; xgrammar refuses a
    ``false`` subschema."""
    props = sub.get("properties")
    if sub.get("additionalProperties") is not False or not isinstance(props, dict) \
            or set(sub.get("required") or []) & {k for k, v in props.items() if v is False}:
        return
    sub["properties"] = {k: v for k, v in props.items() if v is not False}


def _split_by_type(sub: dict[str, Any]) -> None:
    keys = set(sub) - _ANNOTATIONS
    typed = frozenset().union(*_ONLY_FOR.values())
    if not keys or not keys <= typed:
        return
    branches: list[dict[str, Any]] = []
    free = ["null", "boolean"]
    for name, only in _ONLY_FOR.items():
        kw = {k: sub.pop(k) for k in sorted(keys & only, key=list(sub).index)}
        if kw:
            branches.append({"type": name, **kw})
        else:
            free.append(name)
    branches.append({"type": free})
    sub["anyOf"] = branches


def _root_into_defs(schema: dict[str, Any]) -> dict[str, Any]:
    """Move the root into ``$defs`` so that recursion through ``#`` (which xgrammar
    mis-handles) becomes recursion through ``#/$defs/<root>``; pointers into the root follow."""
    defs = dict(schema.get("$defs") or {})
    name = "root"
    while name in defs:
        name += "_"
    prefix = f"#/$defs/{name}"
    for sub, _ in iter_subschemas(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) \
                and not ref.startswith(("#/$defs/", "#/definitions/")):
            sub["$ref"] = prefix + ref[1:]
    kept = ("$defs", "definitions", "$schema", "$id")
    defs[name] = {k: v for k, v in schema.items() if k not in kept}
    out = {k: schema[k] for k in ("definitions",) if k in schema}
    return {**out, "$defs": defs, "$ref": prefix}


def _merge_lengths(sub: dict[str, Any]) -> None:
    match = _SINGLE_CHAR_RUN.match(str(sub["pattern"]))
    if match is None:
        return
    atom, op, low, comma, high = match.groups()
    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(op or "", (None, None))
    if op is None:
        lo, hi = int(low), (int(high) if high else None) if comma else int(low)
    lo = max(lo or 0, int(sub.get("minLength", 0)))
    if "maxLength" in sub:
        hi = int(sub["maxLength"]) if hi is None else min(hi, int(sub["maxLength"]))
    if hi is not None and lo > hi:
        return  # unsatisfiable: leave it to the refusal
    sub["pattern"] = f"^{atom}{{{lo},{'' if hi is None else hi}}}$"
    sub.pop("minLength", None)
    sub.pop("maxLength", None)


def check_xgrammar_exact(schema: dict[str, Any]) -> None:
    """Raise :class:`UnsupportedSchemaError` unless xgrammar enforces every keyword."""
    for sub, parts in iter_subschemas(schema):
        keys = set(sub) - _ANNOTATIONS
        alone = keys - {"type", "enum", "const"}
        t = sub.get("type")
        values = [sub["const"]] if "const" in sub else sub.get("enum") or []
        if any(isinstance(v, (dict, list)) for v in values):
            _refuse(parts, "const" if "const" in sub else "enum",
                    "xgrammar matches object/array values only in compact form")
        escaped = [k for k in sub.get("properties") or {} if _ESCAPED.search(k)]
        if escaped:
            _refuse(parts, "properties", f"xgrammar mis-matches property names that JSON "
                                         f"escapes ({escaped[0]!r})")
        missing = set(sub.get("required") or []) - set(sub.get("properties") or {})
        if missing:
            _refuse(parts, "required", f"xgrammar ignores required keys not in 'properties' "
                                       f"({sorted(missing)})")
        if sub.get("$ref") == "#":
            _refuse(parts, "$ref", "xgrammar mis-handles recursion through the root ('#'); "
                                   "move the recursive part into '$defs'")
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and pattern not in _CALENDAR and not (
                pattern.startswith("^") and pattern.endswith("$")
                and not pattern.endswith("\\$") and "|" not in pattern):
            _refuse(parts, "pattern", "xgrammar matches patterns as whole strings; only "
                                      "'^...$' patterns without '|' mean the same")
        if "anyOf" in keys or "$ref" in keys:
            extra = keys - {"anyOf", "$ref"}
            if extra or ("anyOf" in keys and "$ref" in keys):
                _refuse(parts, min(extra or {"$ref"}),
                        "xgrammar ignores keywords next to 'anyOf'/'$ref'")
            continue
        if not alone:
            continue
        types = [t] if isinstance(t, str) else t if isinstance(t, list) else []
        if not types:
            _refuse(parts, min(alone), "xgrammar ignores this keyword unless the "
                                             "subschema has a 'type'")
        allowed = frozenset().union(*(_BY_TYPE.get(str(x), frozenset()) for x in types))
        bad = sorted(alone - allowed)
        if bad:
            _refuse(parts, bad[0], f"xgrammar does not enforce it for type {t!r}")
        fmt = sub.get("format")
        if fmt is not None and fmt not in KNOWN_FORMATS:
            _refuse(parts, "format", "xgrammar does not know this format")
        if fmt in _FORMATS_OFF:
            _refuse(parts, "format", f"xgrammar's {fmt} {_FORMATS_OFF[fmt]}")
        if "pattern" in keys and ({"minLength", "maxLength", "format"} & keys):
            _refuse(parts, "pattern", "xgrammar ignores minLength/maxLength next to 'pattern'")
        bounds = sorted({"minLength", "maxLength"} & keys)
        if bounds:
            _refuse(parts, bounds[0], "xgrammar's length-bounded strings take raw control "
                                      "characters (invalid JSON) and no escapes")
        if isinstance(pattern, str) and may_need_escape(pattern):
            _refuse(parts, "pattern", "xgrammar writes pattern strings without escapes, so a "
                                      "value with '\"', '\\' or a control character could "
                                      "not be written")
        if isinstance(pattern, str) and quantified_bounded_group(pattern):
            _refuse(parts, "pattern", "xgrammar 0.2.9 drops the first character of a "
                                      "quantified group holding a bounded repeat "
                                      "('^1(x[0-9]{1,4})?$' takes '12')")
        if sub.get("additionalProperties") not in (None, False, True) and "properties" in keys:
            _refuse(parts, "additionalProperties", "xgrammar handles only boolean "
                                                   "additionalProperties next to properties")


def may_need_escape(pattern: str) -> bool:
    """Whether a string ``pattern`` matches may hold a character JSON writes escaped (``"``,
    ``\\`` or U+0000-U+001F). Conservative: a negated class, ``.``, a class escape that takes
    whitespace (``\\s``, ``\\S``, ``\\W``, ``\\D``, ``\\P``), a control or code escape, or the two
    characters themselves say yes."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1:i + 2] in ("", *'"\\sSWDPtnrfvx0cu'):
                return True
            i += 2
            continue
        if c == '"' or (c == "." and not in_class) or (c == "[" and pattern[i + 1:i + 2] == "^"):
            return True
        if c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        i += 1
    return False


def quantified_bounded_group(pattern: str) -> bool:
    """Whether ``pattern`` has a group followed by a quantifier (``?``, ``*``, ``+``, ``{``;
    ``{0,1}`` is read right) whose body holds a bounded repeat ``{m}`` / ``{m,n}`` (the issue-33 soak found xgrammar's
    JSON-schema patterns taking ``S102`` for ``^[A-Z][0-9]{2}(\\.[0-9A-Z]{1,4})?$``)."""
    opened: list[bool] = []  # per open group: whether its body holds a bounded repeat so far
    for i, c, inside in regex_chars(pattern):
        if inside:
            continue
        if c == "(":
            opened.append(False)
        elif c == "{" and opened:
            opened[-1] = True
        elif c == ")" and opened:
            bounded = opened.pop()
            after = pattern[i + 1:i + 6]
            if bounded and after[:1] in ("?", "*", "+", "{") and after != "{0,1}":
                return True
            if bounded and opened:
                opened[-1] = True
    return False


def slow_masks_at(schema: dict[str, Any]) -> str | None:
    """The JSON path of a part whose masks xgrammar computes slowly, or None.

    An object that names properties but does not forbid other keys: at each of its keys a
    named key and a free one can both start, and the parser carries both (a free key's value
    may be anything) into every character of the key and its value.
    ``benchmarks/bench_grammar.py``, steady masks over schemas/, schemas/realworld/ and the
    test suite: p99 355-362 us with such schemas upgraded, 153 us with llguidance kept for
    them; p50 7.5-8.0 -> 7.4 us.
    """
    for sub, parts in iter_subschemas(schema):
        if sub.get("properties") and sub.get("additionalProperties", True) is not False:
            return json_path(parts)
    return None


def _refuse(parts: tuple[str | int, ...], key: str, why: str) -> None:
    where = json_path(parts + (key,))
    raise UnsupportedSchemaError(f"xgrammar cannot enforce '{key}' at {where}: {why}",
                                 path=where, keyword=key)
