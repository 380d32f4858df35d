"""Front end for text grammars: regex, Lark, EBNF and choice lists are validated here, before
any backend sees them, so syntax errors come back with a line and column.

Every check is bounded before it parses anything (``GrammarLimits``: a grammar's bytes and
definitions, a regex's bytes). The Lark check (``lark_check.py``) costs time linear in the
grammar; over ``_IN_PROCESS_BYTES`` it runs in a child process, killed at ``check_timeout_s``
and bounded to ``check_memory_bytes``, so no request thread holds the GIL for it. A regex
loses no anchor silently: a ``^``/``$`` the backends would ignore (anywhere but the ends,
``regex_superset.misplaced_anchors``) is refused.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from grammarserve.errors import GrammarError, GrammarSyntaxError, UnsupportedSchemaError
from grammarserve.fsm import lark_check
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.regex_superset import constructs, misplaced_anchors

#: Lark extensions that only llguidance understands; such grammars skip the ``lark`` check and
#: are validated by llguidance itself.
LLGUIDANCE_EXTENSIONS = ("%json", "%llguidance", "%regex")

#: A definition of a Lark rule or terminal (``name:``, ``?name.2:``, ``_sep{x}:``) or of an
#: EBNF rule (``name ::=``), at the start of a line.
_LARK_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_]\w*(?:\{[^}\n]*\})?(?:\.-?\d+)?[ \t]*:(?!:)",
                              re.MULTILINE)
_EBNF_DEFINITION = re.compile(r"^[ \t]*[A-Za-z_][\w.-]*[ \t]*::=", re.MULTILINE)
_DEFAULT_LIMITS = GrammarLimits()
#: Largest Lark grammar checked on the caller's thread (~0.15 s of GIL at worst; a child
#: process costs ~0.2 s to start).
_IN_PROCESS_BYTES = 4096


def check_size(text: str, what: str, path: str, most: int, bound: str) -> None:
    """Refuse ``text`` longer than ``most`` UTF-8 bytes, naming ``bound`` (the
    ``GrammarLimits`` field) and ``path``."""
    size = len(text) if len(text) > most or text.isascii() else len(text.encode())
    if size > most:
        raise GrammarError(f"{path}: the {what} is {size:,} bytes long, more than this server's "
                           f"limit of {most:,} bytes ({bound})", path=path)


def check_grammar_size(text: str, syntax: str, limits: GrammarLimits | None = None,
                       path: str = "$.grammar") -> None:
    """Refuse a Lark or EBNF (``syntax``) grammar over ``max_grammar_bytes`` or defining more
    than ``max_grammar_rules`` rules and terminals, before any parser reads it."""
    lim = limits or _DEFAULT_LIMITS
    name = "Lark" if syntax == "lark" else "EBNF"
    check_size(text, f"{name} grammar", path, lim.max_grammar_bytes, "max_grammar_bytes")
    pattern = _LARK_DEFINITION if syntax == "lark" else _EBNF_DEFINITION
    count = sum(1 for _ in pattern.finditer(text))
    if count > lim.max_grammar_rules:
        raise GrammarError(f"{path}: the {name} grammar defines {count:,} rules and "
                           f"terminals, more than this server's limit of "
                           f"{lim.max_grammar_rules:,} (max_grammar_rules)", path=path)


def check_regex(pattern: Any, limits: GrammarLimits | None = None) -> str:
    """Validate ``pattern`` with Python's ``re`` (syntax error -> position), within
    ``max_regex_bytes``; refuse what the backends would read differently from ``re``."""
    if not isinstance(pattern, str):
        raise GrammarError(f"a regex must be a string, got {type(pattern).__name__}",
                           path="$.regex")
    check_size(pattern, "regex", "$.regex", (limits or _DEFAULT_LIMITS).max_regex_bytes,
               "max_regex_bytes")
    try:
        re.compile(pattern)
    except re.error as e:
        line, col = (e.lineno or 1), (e.colno or ((e.pos or 0) + 1))
        raise GrammarSyntaxError(f"invalid regex: {e.msg} at position {e.pos} (line {line}, "
                                 f"column {col})", path="$.regex", line=line,
                                 column=col) from None
    except (OverflowError, RecursionError, ValueError) as e:  # e.g. a{4294967296}
        raise GrammarSyntaxError(f"invalid regex: {e}", path="$.regex") from None
    found = constructs(pattern) or misplaced_anchors(pattern)
    if found:  # NOTE: the whole output is the match: no value check can stand for them
        raise UnsupportedSchemaError(
            f"unsupported regex at $.regex: {found[0].describe()} cannot be enforced: no "
            "grammar holds it (the backends' regex engines lack it, or read it differently "
            "from Python's re); write the regex without it", path="$.regex", keyword="regex")
    return pattern


def check_lark(text: Any, limits: GrammarLimits | None = None) -> str:
    """Read ``text`` with the ``lark`` library (as its Earley front end would, see the module
    docstring), within the grammar bounds; report errors with line and column."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("a Lark grammar must be a non-empty string", path="$.grammar")
    check_grammar_size(text, "lark", limits)
    if any(ext in text for ext in LLGUIDANCE_EXTENSIONS):
        return text
    lim = limits or _DEFAULT_LIMITS
    problem = (lark_check.lark_problem(text) if len(text) <= _IN_PROCESS_BYTES
               else _isolated_problem(text, lim))
    if problem is not None:
        raise GrammarSyntaxError(problem["message"], path="$.grammar", line=problem["line"],
                                 column=problem["column"])
    return text


def _isolated_problem(text: str, lim: GrammarLimits) -> dict[str, Any] | None:
    """``lark_check.lark_problem(text)``, run in a child process under the check bounds."""
    command = [sys.executable, "-I", lark_check.__file__, str(lim.check_memory_bytes)]
    try:
        done = subprocess.run(command, input=text.encode("utf-8"), capture_output=True,
                              timeout=lim.check_timeout_s, check=False)
    except subprocess.TimeoutExpired:  # NOTE: run() has killed the child
        raise GrammarError(f"$.grammar: checking the Lark grammar took more than "
                           f"{lim.check_timeout_s:g} s (check_timeout_s); write it with fewer "
                           "rules", path="$.grammar") from None
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        problem: dict[str, Any] | None = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise GrammarError("$.grammar: the Lark grammar could not be checked: its check "
                           f"process ended with exit code {done.returncode} (over "
                           f"{lim.check_memory_bytes:,} bytes of memory, check_memory_bytes?)",
                           path="$.grammar") from None
    return problem


def check_ebnf(text: Any, limits: GrammarLimits | None = None) -> str:
    """Basic EBNF (GBNF) checks within the grammar bounds; the backend reports detailed syntax
    errors."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("an EBNF grammar must be a non-empty string", path="$.grammar")
    check_grammar_size(text, "ebnf", limits)
    if not re.search(r"^\s*root\s*::=", text, re.MULTILINE):
        raise GrammarSyntaxError("EBNF grammar has no 'root ::= ...' rule", path="$.grammar",
                                 line=1, column=1)
    return text


def check_choice(options: Any) -> list[str]:
    """A non-empty list of distinct strings."""
    if not isinstance(options, (list, tuple)) or not options:
        raise GrammarError("choice options must be a non-empty list of strings",
                           path="$.choice")
    for i, o in enumerate(options):
        if not isinstance(o, str) or not o:
            raise GrammarError(f"choice option {i} must be a non-empty string, got {o!r}",
                               path=f"$.choice[{i}]")
    if len(set(options)) != len(options):
        raise GrammarError("choice options must be distinct", path="$.choice")
    return list(options)
