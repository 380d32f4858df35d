"""Helpers that check a compiled grammar against JSON instances token by token (used by the
tests and ``benchmarks/bench_grammar.py``)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grammarserve.constraints import ConstraintKind
from grammarserve.errors import GrammarError
from grammarserve.fsm.exactness import Cause, refusal_causes, without_formats
from grammarserve.fsm.matcher import Matcher


@dataclass(frozen=True)
class SuiteCase:
    """One schema of the JSON-Schema-Test-Suite with its instances."""

    file: str
    description: str
    schema: Any
    tests: tuple[tuple[str, Any, bool], ...]  # (description, instance, valid)


def load_suite(folder: str | Path) -> Iterator[SuiteCase]:
    """Every test group of every ``*.json`` file directly in ``folder`` (sorted)."""
    for path in sorted(Path(folder).glob("*.json")):
        for group in json.loads(path.read_text()):
            tests = tuple((t["description"], t["data"], bool(t["valid"])) for t in group["tests"])
            yield SuiteCase(path.name, group["description"], group["schema"], tests)


#: The separators of each form :func:`instance_texts` writes, in its order.
FORMS = {"compact": (",", ":"), "spaced": (", ", ": ")}


def instance_texts(instance: Any) -> list[str]:
    """The forms the default JSON style (``auto``) takes (:data:`FORMS`: compact and
    ``json.dumps`` default); a form the one before it already wrote is left out."""
    forms = [json.dumps(instance, ensure_ascii=False, separators=seps) for seps in FORMS.values()]
    return list(dict.fromkeys(forms))


def bit(bitmask: torch.Tensor, row: int, token: int) -> bool:
    """Whether ``token`` is allowed in ``bitmask[row]``."""
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def walk(matcher: Matcher, tokens: list[int], stop_token: int, bitmask: torch.Tensor,
         row: int = 0, mask_times: list[float] | None = None) -> tuple[bool, str]:
    """Feed ``tokens`` then ``stop_token``, checking each against the mask first (appending
    each ``fill_bitmask`` duration in seconds to ``mask_times`` if given).

    Returns
    -------
    (bool, str)
        ``(True, "")`` if every token was allowed and accepted and the matcher terminated;
        else ``(False, reason)`` (also when a token closed a value failing its run-time check,
        see ``checked_matcher.py``).
    """
    for i, tok in enumerate(tokens + [stop_token]):
        if mask_times is None:
            matcher.fill_bitmask(bitmask, row)
        else:
            start = time.perf_counter()
            matcher.fill_bitmask(bitmask, row)
            mask_times.append(time.perf_counter() - start)
        if not bit(bitmask, row, tok):
            return False, f"token {i} ({tok}) masked out"
        if not matcher.accept_token(tok):
            return False, f"token {i} ({tok}) allowed by the mask but refused: {matcher.error()}"
        if matcher.take_retraction():
            return False, f"token {i} ({tok}) closed a value that fails its check"
    if not matcher.is_terminated():
        return False, "not terminated after the stop token"
    return True, ""


def load_corpus(folder: str | Path) -> Iterator[SuiteCase]:
    """The ``schemas/*.json`` corpus (``{"name", "schema", "valid", "invalid"}`` per file)."""
    for path in sorted(Path(folder).glob("*.json")):
        doc = json.loads(path.read_text())
        tests = tuple([(f"valid[{i}]", v, True) for i, v in enumerate(doc.get("valid", []))] +
                      [(f"invalid[{i}]", v, False) for i, v in enumerate(doc.get("invalid", []))])
        yield SuiteCase(path.name, doc.get("description", doc.get("name", path.stem)),
                        doc["schema"], tests)


def refusal_keyword(e: GrammarError, named: list[tuple[str, str | None]]) -> str:
    """The keyword a refusal names: the last step of its JSON path, else the first of ``named``
    (regex of a backend's message, keyword or None for the regex's group) that matches, else the
    kind of error."""
    if e.path:
        last = re.split(r"\.|\[", e.path)[-1].strip('"]')
        return "(no instance)" if last in ("", "$") else last
    for pattern, keyword in named:
        found = re.search(pattern, str(e))
        if found:
            return keyword or found.group(1)
    return type(e).__name__


def explain_refusal(compiler: Any, schema: Any, instance: Any, form: str, tokenizer: Any,
                    bitmask: torch.Tensor, *, open_compiler: Any = None) -> frozenset[Cause]:
    """The causes (``exactness.refusal_causes``) of ``compiler``'s grammar of ``schema``
    refusing the valid ``instance`` written in ``form`` (a key of :data:`FORMS`);
    ``open_compiler``: one with ``open_schemas=True`` where ``compiler`` closes schemas."""
    stop = compiler.stop_token_ids[0]

    def accepts_with(c: Any, s: Any) -> Callable[[str], bool]:
        try:
            grammar = c.compile_json_schema(s)
        except GrammarError:
            return lambda text: False
        return lambda text: walk(grammar.matcher(), tokenizer.encode(
            text, add_special_tokens=False), stop, bitmask)[0]

    def spells(text: str) -> bool:
        return bool(tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text)

    seps = FORMS[form]
    variants = [(Cause.CLOSED, accepts_with(open_compiler, schema))] if open_compiler else []
    variants.append((Cause.FORMAT, accepts_with(compiler, without_formats(schema))))
    prepared = json.loads(compiler.spec(ConstraintKind.JSON_SCHEMA, schema).source)
    return refusal_causes(instance, lambda v: json.dumps(v, ensure_ascii=False, separators=seps),
                          prepared, accepts=accepts_with(compiler, schema), spells=spells,
                          variants=variants)
