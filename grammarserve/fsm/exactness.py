"""Why a compiled JSON schema refuses a valid instance: the exactness accounting.

A grammar we compile should accept every instance its schema accepts, except where a documented
rule says otherwise. :func:`refusal_causes` names, for one refused walk, the rules that explain
it, by rewriting the instance until the grammar (or the grammar of the same schema compiled with
``open_schemas=True``) accepts it; a walk no rewrite explains is :attr:`Cause.UNEXPLAINED`, a bug
to fix or a keyword to refuse at compile time.

Each :class:`Cause` is one of three kinds (:class:`CauseKind`): the generation policy (what the
server chooses to generate; documented in ``fsm/README.md``), a backend's limit (what both
backends or the one serving the schema cannot match), or the vocabulary (text the model's tokens
cannot spell, so no grammar could be asked about it).
"""

from __future__ import annotations

import copy
import enum
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from grammarserve.fsm.runs import MAX_DIGITS
from grammarserve.fsm.schema.close import MAX_SAFE_INTEGER
from grammarserve.fsm.schema.exact_numbers import exact_range
from grammarserve.fsm.schema.order import APPLICATORS
from grammarserve.fsm.schema.tree import iter_any_draft, resolve_pointer

#: The numbers the backends hold exactly: the default (closed) policy narrows too wide bounds to
#: ``max_bound`` (unbounded integers: ``close.MAX_SAFE_INTEGER``; digit runs: ``runs.MAX_DIGITS``).
EXACT = exact_range("auto")


class CauseKind(enum.Enum):
    POLICY = "generation policy"
    BACKEND = "backend limit"
    VOCABULARY = "vocabulary"
    OURS = "unexplained"


class Cause(enum.Enum):
    """One reason a valid instance is refused, with its kind and how to see it."""

    VOCABULARY = ("vocabulary", CauseKind.VOCABULARY,
                  "the tokenizer cannot spell the text (its tokens decode to other text)")
    KEY_ORDER = ("key order", CauseKind.POLICY,
                 ("named properties in the schema's order (its own before its applicators'), "
                 "then keys only required names, then the others"))
    NUMBER_SPELLING = ("number spelling", CauseKind.POLICY,
                       ("a number whose value is an integer is written without a fraction "
                       "(1, not 1.0) where the schema asks for an integer or a const/enum"))
    CLOSED = ("closed schema", CauseKind.POLICY,
              ("properties the schema does not name are generated only where it says "
              "additionalProperties (open_schemas=True lifts it)"))
    NUMBER_BOUNDS = ("number bounds", CauseKind.POLICY,
                     (f"unbounded integers within +-{MAX_SAFE_INTEGER}, bounds wider than "
                      f"+-{EXACT.max_bound:g} narrowed to it, digit runs of at most "
                      f"{MAX_DIGITS} (open_schemas=True lifts it)"))
    FORMAT = ("format", CauseKind.POLICY,
              ("a format the server knows is enforced in every draft (in draft 4, 6 and 7 "
              "only some formats are defined; validators pass others as annotations)"))
    RAW_DEL = ("raw DEL", CauseKind.BACKEND,
               "llguidance refuses a raw U+007F in a string (its escape \\u007f is accepted)")
    EXPONENT = ("bounded exponent", CauseKind.BACKEND,
                ("a number with minimum/maximum is matched in plain decimal form only (both "
                "backends)"))
    UNEXPLAINED = ("unexplained", CauseKind.OURS, "no rule explains it: a bug")

    def __init__(self, label: str, kind: CauseKind, rule: str) -> None:
        self.label, self.kind, self.rule = label, kind, rule


@dataclass(frozen=True)
class Refusal:
    """One refused walk of a valid instance and the causes that explain it."""

    case: str
    desc: str
    form: str
    causes: frozenset[Cause]

    @property
    def label(self) -> str:
        return " + ".join(sorted(c.label for c in self.causes))


# --------------------------------------------------------------------------- rewrites


def without_raw_del(text: str) -> str:
    """``text`` with each raw DEL escaped (DEL can only stand inside a JSON string)."""
    return text.replace("\x7f", "\\u007f")


def _object_views(node: Any, root: Any, seen: frozenset[int] = frozenset()) -> Iterator[Any]:
    """``node`` and the subschemas its applicators (``schema/order.py``'s ``APPLICATORS``; local
    ``$ref``s followed) bring to the same instance, in the order a grammar merges their
    ``properties``."""
    if not isinstance(node, dict) or id(node) in seen:
        return
    seen = seen | {id(node)}
    yield node
    for key in node:
        if key not in APPLICATORS:
            continue
        value = node[key]
        if key in ("$ref", "$dynamicRef"):
            if not (isinstance(value, str) and value.startswith("#")):
                continue
            try:
                value = resolve_pointer(root, value)
            except (KeyError, IndexError, ValueError, TypeError):
                continue
        subs = (value if isinstance(value, list) else
                list(value.values()) if key == "dependentSchemas" and isinstance(value, dict)
                else [value])
        for sub in subs:
            yield from _object_views(sub, root, seen)


def schema_ordered(instance: Any, schema: Any) -> Any:
    """``instance`` with each object's keys in the order a grammar of ``schema`` (the prepared
    schema a grammar is compiled from) generates them: the properties its schema and the
    subschemas merged into it name, in merge order, then the keys they require without
    naming them, in ``required`` order, then the others as they were (a key's
    value is ordered by every subschema any branch gives it: which branch matches is not
    decided)."""

    def walk(v: Any, nodes: list[Any]) -> Any:
        views = [view for node in nodes for view in _object_views(node, schema)]
        if isinstance(v, dict):
            subs: dict[str, list[Any]] = {}
            for view in views:
                props = view.get("properties")
                for name, sub in (props.items() if isinstance(props, dict) else ()):
                    if sub is not False:  # NOTE: a property that must be absent has no place
                        subs.setdefault(name, []).append(sub)
            required = [k for view in views for k in (view.get("required") or ())
                        if isinstance(k, str) and k not in subs]
            named = list(dict.fromkeys([*subs, *required]))
            keys = [k for k in named if k in v] + [k for k in v if k not in set(named)]
            return {k: walk(v[k], subs.get(k) or _other(k, views)) for k in keys}
        if isinstance(v, list):
            return [walk(x, _item(i, views)) for i, x in enumerate(v)]
        return v

    return walk(instance, [schema])


def _other(key: str, views: list[Any]) -> list[Any]:
    """The subschemas a key no ``properties`` names gets: matching patterns, else
    ``additionalProperties``."""
    found = []
    for view in views:
        for pattern, sub in (view.get("patternProperties") or {}).items():
            try:
                if re.search(pattern, key):
                    found.append(sub)
            except re.error:
                continue
    return found or [view["additionalProperties"] for view in views
                     if isinstance(view.get("additionalProperties"), dict)]


def _item(i: int, views: list[Any]) -> list[Any]:
    """The subschemas of item ``i`` of an array."""
    found = []
    for view in views:
        prefix = view.get("prefixItems")
        if isinstance(prefix, list) and i < len(prefix):
            found.append(prefix[i])
        elif isinstance(view.get("items"), dict):
            found.append(view["items"])
    return found


_STRING_OR_EXPONENT = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?[eE][+-]?\d+')


def plain_numbers(text: str) -> str:
    """JSON ``text`` with each number in exponent form written in plain decimal form."""
    def plain(m: re.Match[str]) -> str:
        s = m.group(0)
        return s if s.startswith('"') else format(Decimal(s), "f")
    return _STRING_OR_EXPONENT.sub(plain, text)


def integral_ints(instance: Any) -> Any:
    """``instance`` with each float whose value is an integer written as that integer."""
    if isinstance(instance, dict):
        return {k: integral_ints(v) for k, v in instance.items()}
    if isinstance(instance, list):
        return [integral_ints(v) for v in instance]
    if isinstance(instance, float) and instance.is_integer():
        return int(instance)
    return instance


def _numbers(v: Any) -> Iterator[int | float]:
    if isinstance(v, dict):
        for x in v.values():
            yield from _numbers(x)
    elif isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        yield v


def outside_number_bounds(instance: Any, text: str) -> bool:
    """Whether ``instance`` has an integer beyond the default bound, or ``text`` a digit run
    outside strings longer than the default policy writes."""
    if any(isinstance(n, int) and abs(n) > MAX_SAFE_INTEGER or
           isinstance(n, float) and n.is_integer() and abs(n) > MAX_SAFE_INTEGER
           for n in _numbers(instance)):
        return True
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    return re.search(rf"\d{{{MAX_DIGITS + 1}}}", unquoted) is not None


# --------------------------------------------------------------------------- the accounting


def without_formats(schema: Any) -> Any:
    """A copy of ``schema`` (as given) without its ``format`` keywords."""
    copied = copy.deepcopy(schema)
    for node, _ in iter_any_draft(copied):
        node.pop("format", None)
    return copied


def refusal_causes(instance: Any, dumps: Callable[[Any], str], prepared: Any, *,
                   accepts: Callable[[str], bool], spells: Callable[[str], bool],
                   variants: Sequence[tuple[Cause, Callable[[str], bool]]] = ()
                   ) -> frozenset[Cause]:
    """The causes of one refused walk of ``dumps(instance)`` (a valid instance of the schema
    ``prepared`` was prepared from).

    The rewrites of the instance (raw DEL escaped, keys in the order of ``prepared``, numbers
    in plain form, integral floats as integers) are added one at a time, in that order, until ``accepts`` (the grammar's
    walk) takes the text; failing that, with all of them, each of ``variants`` is tried: a
    grammar of the same schema compiled without one rule (``Cause.CLOSED``: with
    ``open_schemas=True``, named ``NUMBER_BOUNDS`` where the instance is beyond the default
    bounds; ``Cause.FORMAT``: of :func:`without_formats`). Then each rewrite the acceptance does
    not need is dropped again, so the causes are the fewest that explain the refusal.
    ``spells``: whether the tokenizer's tokens of a text decode to it (if not, no grammar is to
    blame)."""
    def render(causes: set[Cause]) -> str:
        value = integral_ints(instance) if Cause.NUMBER_SPELLING in causes else instance
        text = dumps(schema_ordered(value, prepared) if Cause.KEY_ORDER in causes else value)
        text = plain_numbers(text) if Cause.EXPONENT in causes else text
        return without_raw_del(text) if Cause.RAW_DEL in causes else text

    if not spells(dumps(instance)):
        return frozenset({Cause.VOCABULARY})
    found: set[Cause] = set()
    text = render(found)
    check, rule = accepts, None
    for cause in (Cause.RAW_DEL, Cause.KEY_ORDER, Cause.EXPONENT, Cause.NUMBER_SPELLING):
        nxt = render(found | {cause})
        if nxt == text:
            continue  # the rewrite changes nothing here
        found.add(cause)
        text = nxt
        if check(text):
            break
    else:
        for rule, check in variants:
            if check(text):
                break
        else:
            # NOTE: an open grammar of a schema whose bounds the closed one narrowed is refused
            # (too wide to hold exactly), so no variant tests the narrowing: infer it
            narrowed = any(c is Cause.CLOSED for c, _ in variants) and any(
                abs(n) > EXACT.max_bound for n in _numbers(instance))
            return frozenset({Cause.NUMBER_BOUNDS if narrowed else Cause.UNEXPLAINED})
    for cause in sorted(found, key=lambda c: c.label):
        if check(render(found - {cause})):
            found.discard(cause)
    if rule is Cause.CLOSED and outside_number_bounds(instance, render(found)):
        rule = Cause.NUMBER_BOUNDS
    return frozenset(found | ({rule} if rule is not None else set()))


def tally(refusals: list[Refusal]) -> dict[str, int]:
    """Refused walks per cause label (a walk with several causes counts under their join)."""
    counts: dict[str, int] = {}
    for r in refusals:
        counts[r.label] = counts.get(r.label, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
