"""The ``lark`` check of a Lark grammar, in this process or in a child one.

:func:`lark_problem` reads a grammar as ``lark.Lark(text, start="start", parser="earley")``
would, with the same errors, but without building the Earley parser: its grammar loader and
compiler, then the checks of its Earley front end (``GrammarAnalyzer``: twice-defined and
undefined rules; ``EarleyRegexpMatcher``: bad and zero-width terminal regexes, lark 1.3). The
Earley construction itself computes FIRST/FOLLOW sets (7 s for a chain of 1,500 rules, against
0.3 s for the checks here) and reports no error of its own.

The loader is pure Python and holds the GIL (~40 us per byte of grammar: 2.4 s for 59 KB of
alternatives), so ``text_grammars.check_lark`` runs a large grammar's check in a child process
started from this file as a script (it imports nothing but the standard library and ``lark``):
the request threads and the event loop keep running while it waits, and the child is killed at
its deadline and bounded in memory (``RLIMIT_AS``). Protocol: the grammar as UTF-8 on stdin, the
address-space bound as the first argument, one JSON line on stdout: :func:`lark_problem`'s
result (``null``: no problem).
"""

from __future__ import annotations

import json
import re
import resource
import sys
from typing import Any

import lark
from lark.grammar import NonTerminal
from lark.load_grammar import load_grammar
from lark.utils import get_regexp_width


def lark_problem(text: str) -> dict[str, Any] | None:
    """None if ``lark`` accepts ``text`` (start rule ``start``), else ``{"message", "line",
    "column"}`` (line and column may be None) describing its error."""
    try:
        _checks(text)
    except lark.exceptions.UnexpectedInput as e:
        line, col = getattr(e, "line", None), getattr(e, "column", None)
        context = e.get_context(text).rstrip() if hasattr(e, "get_context") else ""
        return {"message": f"Lark syntax error at line {line}, column {col}:\n{context}",
                "line": line, "column": col}
    except lark.exceptions.GrammarError as e:
        msg = str(e)
        m = re.search(r"line (\d+)(?:,? col(?:umn)? (\d+))?", msg)
        return {"message": f"invalid Lark grammar: {msg}", "line": int(m.group(1)) if m else None,
                "column": int(m.group(2)) if m and m.group(2) else None}
    except MemoryError:
        return {"message": "the Lark grammar is too large to check: its check ran out of the "
                           "memory allowed to it (check_memory_bytes)", "line": None,
                "column": None}
    except RecursionError:
        return {"message": "the Lark grammar is nested too deeply to be read", "line": None,
                "column": None}
    except Exception as e:  # noqa: BLE001 - e.g. a terminal's regex (`/[/`) raises its module's
        return {"message": f"invalid Lark grammar: {e}", "line": None, "column": None}
    return None


def _checks(text: str) -> None:
    grammar, _ = load_grammar(text, "<string>", [], False)
    terminals, rules, _ = grammar.compile(["start"], set())
    origins = {r.origin for r in rules}
    if len(rules) != len(set(rules)):
        raise lark.exceptions.GrammarError("Rules defined twice")
    if NonTerminal("start") not in origins:
        raise lark.exceptions.GrammarError("Using an undefined rule: NonTerminal('start')")
    for r in rules:
        for sym in r.expansion:
            if not sym.is_term and sym not in origins:
                raise lark.exceptions.GrammarError(f"Using an undefined rule: {sym}")
    for t in terminals:
        regexp = t.pattern.to_regexp()
        try:
            width = get_regexp_width(regexp)[0]
        except ValueError:
            raise lark.exceptions.GrammarError(f"Bad regexp in token {t.name}: {regexp}"
                                               ) from None
        if width == 0:
            raise lark.exceptions.GrammarError(
                f"Dynamic Earley doesn't allow zero-width regexps: {t.name}")
        re.compile(regexp)


def _main() -> None:
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    text = sys.stdin.buffer.read().decode("utf-8")
    sys.stdout.write(json.dumps(lark_problem(text)) + "\n")


if __name__ == "__main__":
    _main()
