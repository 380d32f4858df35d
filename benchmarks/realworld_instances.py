"""Instances for schemas/realworld/ (benchmarks/make_realworld_corpus.py): valid ones drawn with
``hypothesis-jsonschema`` and put in schema key order, invalid ones by mutating them, each checked
with ``jsonschema`` under the schema's declared draft."""

from __future__ import annotations

import copy
import json
import random
import signal
from collections.abc import Iterator
from typing import Any

import jsonschema

MAX_VALID = 5
MAX_INVALID = 5
MAX_INSTANCE_CHARS = 1000


def validator_class(schema: Any) -> Any:
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


# --------------------------------------------------------------------------- instances


class _Timeout(BaseException):
    pass


def draw_valid(schema: dict[str, Any], timeout_s: float, n: int = 40) -> tuple[list[Any], str]:
    """Up to ``n`` distinct instances from ``hypothesis-jsonschema`` (fixed seed), and a note
    saying why generation stopped early, if it did."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis_jsonschema import from_schema

    drawn: dict[str, Any] = {}

    def collect(value: Any) -> None:
        drawn.setdefault(json.dumps(value, sort_keys=True), value)

    def on_alarm(*_: Any) -> None:
        raise _Timeout

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    note = ""
    try:
        # NOTE: from_schema resolves and simplifies the schema at once, which can be slow too.
        strategy = from_schema(schema, allow_x00=False, codec="ascii")
        settings(max_examples=n, derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck),
                 phases=[Phase.generate])(given(strategy)(collect))()
    except _Timeout:
        note = f"hypothesis-jsonschema: stopped after {timeout_s} s"
    except Exception as e:  # noqa: BLE001 - the note records why nothing was drawn
        note = f"hypothesis-jsonschema: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return list(drawn.values()), note


def draw_in_child(schema: dict[str, Any], timeout_s: float) -> tuple[list[Any], str]:
    """``draw_valid`` in a forked process, killed if it outlives its own alarm (a long regex
    search in C never returns to Python to see the alarm)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def child() -> None:
        writer.send(draw_valid(schema, timeout_s))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    writer.close()  # the child holds the only writer: its death is EOF here
    result: tuple[list[Any], str] = ([], f"hypothesis-jsonschema: killed after {timeout_s + 10} s")
    if reader.poll(timeout_s + 10):
        try:
            result = reader.recv()
        except EOFError:
            result = ([], "hypothesis-jsonschema: the generating process died")
    proc.kill()
    proc.join()
    return result


class KeyOrder:
    """Puts object keys in the order grammarserve generates them: the names of ``properties``
    (own, then those of ``$ref`` targets, ``allOf`` members and the ``anyOf``/``oneOf``
    branches the value matches), then the other keys as they came."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root, self.cls = root, validator_class(root)

    def _resolve(self, sub: Any, depth: int = 0) -> Any:
        ref = sub.get("$ref") if isinstance(sub, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#") or depth > 16:
            return sub
        node: Any = self.root
        try:
            for raw in [p for p in ref[1:].split("/") if p]:
                part = raw.replace("~1", "/").replace("~0", "~")
                node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return sub
        return node

    def _matches(self, sub: Any, value: Any) -> bool:
        try:
            schema = {**sub, "definitions": self.root.get("definitions", {}),
                      "$defs": self.root.get("$defs", {})} if isinstance(sub, dict) else sub
            return bool(self.cls(schema).is_valid(value))
        except Exception:  # noqa: BLE001 - an unresolvable branch simply does not count
            return False

    def _layers(self, sub: Any, value: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
        if not isinstance(sub, dict) or depth > 24:
            return
        yield sub
        target = self._resolve(sub)
        if target is not sub:
            yield from self._layers(target, value, depth + 1)
        for member in sub.get("allOf", []):
            yield from self._layers(member, value, depth + 1)
        for kw in ("anyOf", "oneOf"):
            for member in sub.get(kw, []):
                if self._matches(self._resolve(member), value):
                    yield from self._layers(member, value, depth + 1)

    def apply(self, sub: Any, value: Any, depth: int = 0) -> Any:
        if depth > 48:
            return value
        layers = list(self._layers(sub, value))
        if isinstance(value, dict):
            order: list[str] = []
            child: dict[str, Any] = {}
            for layer in layers:
                for key, prop in (layer.get("properties") or {}).items():
                    if key not in child:
                        order.append(key)
                        child[key] = prop
            keys = [k for k in order if k in value] + [k for k in value if k not in child]
            extra: Any = next((la["additionalProperties"] for la in layers
                          if isinstance(la.get("additionalProperties"), dict)), {})
            return {k: self.apply(child.get(k, extra), value[k], depth + 1) for k in keys}
        if isinstance(value, list):
            items: Any = next((la["items"] for la in layers if "items" in la), {})
            prefix: Any = next((la["prefixItems"] for la in layers if "prefixItems" in la), [])
            if isinstance(items, list):
                prefix, items = items, next((la.get("additionalItems", {}) for la in layers), {})
            return [self.apply(prefix[i] if i < len(prefix) else items, v, depth + 1)
                    for i, v in enumerate(value)]
        return value


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def pick_valid(schema: dict[str, Any], drawn: list[Any]) -> list[Any]:
    cls = validator_class(schema)
    strict = cls(schema, format_checker=cls.FORMAT_CHECKER)
    order = KeyOrder(schema)
    ok: dict[str, Any] = {}
    for value in drawn:
        try:
            value = order.apply(schema, value)
        except RecursionError:
            continue
        text = _compact(value)
        if len(text) <= MAX_INSTANCE_CHARS and text not in ok and strict.is_valid(value):
            ok[text] = value
    # NOTE: hypothesis draws many minimal values ({}) and many with made-up keys wherever the
    # schema allows them; prefer values made of what the schema names, the larger the better.
    named = {k for sub in _subschemas(schema) for k in (sub.get("properties") or {})}
    ranked = sorted(ok.values(), key=lambda v: (-_net_keys(v, named), -len(_compact(v))))
    return sorted(ranked[:MAX_VALID], key=lambda v: (len(_compact(v)), _compact(v)))


def _subschemas(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _subschemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _subschemas(value)


def _net_keys(value: Any, named: set[str]) -> int:
    """The keys in ``value`` that the schema names, less those it does not."""
    net = 0
    for _, v in _paths(value):
        if isinstance(v, dict):
            net += sum(1 if k in named else -1 for k in v)
    return net


_WRONG: list[Any] = [None, True, 0, -1, 1.5, "", "x", [], {}]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _mutants(value: Any, rng: random.Random) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("type", w) for w in _WRONG if type(w) is not type(value)]
    if isinstance(value, dict):
        out.append(("extra_key", {**value, "unexpected_key": rng.choice(_WRONG[:7])}))
        for k in value:
            out.append(("drop_key", {kk: vv for kk, vv in value.items() if kk != k}))
    elif isinstance(value, list):
        out += [("append", value + [None]), ("append", value + ["x"]), ("drop_item", value[1:])]
        if value:
            out.append(("duplicate", value + [value[0]]))
    elif isinstance(value, bool):
        out.append(("flip", not value))
    elif isinstance(value, (int, float)):
        out += [("number", value + 1), ("number", -value - 1), ("number", value * 1000 + 7),
                ("number", value + 0.5)]
    elif isinstance(value, str):
        out += [("string", value + "!"), ("string", ""), ("string", "x" * 300),
                ("string", " " + value)]
    return out


def _set(root: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = copy.deepcopy(root)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return out


def make_invalid(schema: dict[str, Any], valid: list[Any], seed: int) -> list[Any]:
    """Near misses: one mutation of a valid instance (deepest first), invalid without format
    checks; values of the wrong type when there is no valid instance."""
    cls = validator_class(schema)
    loose = cls(schema)
    rng = random.Random(seed)
    tried: list[tuple[int, str, Any, tuple[Any, ...], Any]] = []
    for base in valid:
        for path, value in _paths(base):
            for kind, new in _mutants(value, rng):
                tried.append((len(path), kind, base, path, new))
    if not valid:
        tried = [(0, "type", None, (), w) for w in _WRONG]
    rng.shuffle(tried)
    tried.sort(key=lambda t: -t[0])
    out: dict[str, Any] = {}
    kinds: dict[str, int] = {}
    for _, kind, base, path, new in tried:
        if len(out) >= MAX_INVALID:
            break
        if kinds.get(kind, 0) >= 2:
            continue
        inst = _set(base, path, new)
        text = _compact(inst)
        if text in out or len(text) > MAX_INSTANCE_CHARS:
            continue
        if not loose.is_valid(inst):
            out[text] = inst
            kinds[kind] = kinds.get(kind, 0) + 1
    return list(out.values())
