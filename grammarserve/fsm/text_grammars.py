"""Front end for text grammars: regex, Lark, EBNF and choice lists are validated here, before
any backend sees them, so syntax errors come back with a line and column."""

from __future__ import annotations

import re
from typing import Any

import lark

from grammarserve.errors import GrammarError, GrammarSyntaxError, UnsupportedSchemaError
from grammarserve.fsm.regex_superset import constructs

#: Lark extensions that only llguidance understands; such grammars skip the ``lark`` check and
#: are validated by llguidance itself.
LLGUIDANCE_EXTENSIONS = ("%json", "%llguidance", "%regex")


def check_regex(pattern: Any) -> str:
    """Validate ``pattern`` with Python's ``re`` (syntax error -> position)."""
    if not isinstance(pattern, str):
        raise GrammarError(f"a regex must be a string, got {type(pattern).__name__}",
                           path="$.regex")
    try:
        re.compile(pattern)
    except re.error as e:
        line, col = (e.lineno or 1), (e.colno or ((e.pos or 0) + 1))
        raise GrammarSyntaxError(f"invalid regex: {e.msg} at position {e.pos} (line {line}, "
                                 f"column {col})", path="$.regex", line=line,
                                 column=col) from None
    except (OverflowError, RecursionError, ValueError) as e:  # e.g. a{4294967296}
        raise GrammarSyntaxError(f"invalid regex: {e}", path="$.regex") from None
    found = constructs(pattern)
    if found:  # NOTE: the whole output is the match: no value check can stand for them
        raise UnsupportedSchemaError(
            f"unsupported regex at $.regex: {found[0].describe()} cannot be enforced: no "
            "grammar holds it (the backends' regex engines lack it, or read it differently "
            "from Python's re); write the regex without it", path="$.regex", keyword="regex")
    return pattern


def check_lark(text: Any) -> str:
    """Parse ``text`` with the ``lark`` library; report errors with line and column."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("a Lark grammar must be a non-empty string", path="$.grammar")
    if any(ext in text for ext in LLGUIDANCE_EXTENSIONS):
        return text
    try:
        lark.Lark(text, start="start", parser="earley")
    except lark.exceptions.UnexpectedInput as e:
        line, col = getattr(e, "line", None), getattr(e, "column", None)
        context = e.get_context(text).rstrip() if hasattr(e, "get_context") else ""
        raise GrammarSyntaxError(f"Lark syntax error at line {line}, column {col}:\n{context}",
                                 path="$.grammar", line=line, column=col) from None
    except lark.exceptions.GrammarError as e:
        msg = str(e)
        m = re.search(r"line (\d+)(?:,? col(?:umn)? (\d+))?", msg)
        line = int(m.group(1)) if m else None
        col = int(m.group(2)) if m and m.group(2) else None
        raise GrammarSyntaxError(f"invalid Lark grammar: {msg}", path="$.grammar", line=line,
                                 column=col) from None
    except lark.exceptions.LarkError as e:
        raise GrammarSyntaxError(f"invalid Lark grammar: {e}", path="$.grammar") from None
    except Exception as e:  # noqa: BLE001 - e.g. a terminal's regex (`/[/`) raises its module's
        raise GrammarSyntaxError(f"invalid Lark grammar: {e}", path="$.grammar") from None
    return text


def check_ebnf(text: Any) -> str:
    """Basic EBNF (GBNF) checks; the backend reports detailed syntax errors."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("an EBNF grammar must be a non-empty string", path="$.grammar")
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
