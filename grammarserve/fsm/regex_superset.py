"""What of a pattern the grammar backends do not read as Python's ``re`` does, and the
*superset* pattern a grammar can hold instead.

The front end takes what ``re`` compiles (``patterns.py``); the backends' regex engines (Rust
``regex`` in llguidance, xgrammar's own) lack some of it. One scan of the pattern text finds
each such *construct*:

- checkable (the value checks' engine, ``jsonschema_rs``, reads it as ``re`` does): look-ahead
  and look-behind, ``\\b``/``\\B``, back-references ``\\1``, possessive quantifiers
  (``a*+``), the multiline flag ``(?m)``. :func:`superset` writes the pattern without them:
  zero-width assertions (and, under ``(?m)``, every ``^``/``$``) removed, a back-reference
  replaced by a copy of its group, a possessive quantifier made greedy. Each only widens the
  language (under search semantics too), so a grammar of the superset plus a value check of
  the exact pattern accepts exactly what the pattern does; ``schema/checks/split.py`` makes that pair;
- refused (no engine of ours reads it as ``re`` does): atomic groups ``(?>``, conditionals
  ``(?(``, named back-references ``(?P=`` (``jsonschema_rs`` refuses them), the verbose and
  ASCII flags ``(?x)``/``(?a)``, and inside a class a ``[`` or a doubled ``&&``/``||``/
  ``~~``/``--`` (``re`` reads them literally, Rust ``regex`` as a nested class or a set
  operation: ``[[:alpha:]]`` is six characters and a ``]`` to ``re``, any letter to Rust).

A pattern with no construct is passed to the backends as it is.

Anchors are the backends' other difference: both ignore ``^`` and ``$`` (llguidance logs
"'$' ... is ignored"), which is right where the whole text is the match and the anchor can only
stand at its start or end. :func:`misplaced_anchors` finds the others (``(a+)+$b`` matches
nothing in ``re``; without the anchor, ``aab``), which no grammar holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from re import _constants as _sc  # type: ignore[attr-defined]
from re import _parser as _sp  # type: ignore[attr-defined]
from typing import Any

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.patterns import regex_chars

#: At most this many characters of superset per character of the pattern (back-references
#: copy their groups, which may hold back-references themselves).
_MAX_GROWTH = 4
_MAX_EXTRA = 256
_QUANTIFIER = re.compile(r"\{(?:\d+(?:,\d*)?|,\d*)\}")
_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")
_LOOKAROUND = {"(?=": "look-ahead", "(?!": "negative look-ahead", "(?<=": "look-behind",
               "(?<!": "negative look-behind"}


@dataclass(frozen=True)
class Construct:
    """One part of a pattern the backends do not read as ``re`` does."""

    name: str  # what it is ("look-ahead", "back-reference", ...)
    text: str  # as written
    pos: int  # its offset in the pattern
    checkable: bool  # a superset without it exists and the value checks read it

    def describe(self) -> str:
        return f"the {self.name} {self.text!r} at position {self.pos}"


class _Scan:
    """One left-to-right pass: the constructs found and the superset text."""

    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.found: list[Construct] = []
        self.groups: dict[int, str] = {}  # capturing group -> its superset body
        self.count = 0
        self.flag_m = next((m for m in _FLAGS.finditer(pattern)
                            if "m" in m.group(1) + (m.group(2) or "")
                            and not _in_class_or_escaped(pattern, m.start())), None)
        self.multiline = self.flag_m is not None
        self.out = ""

    def note(self, name: str, text: str, pos: int, checkable: bool) -> None:
        self.found.append(Construct(name, text, pos, checkable))

    def run(self) -> None:
        body, end = self.sequence(0)
        while end < len(self.p):  # an unbalanced ')' (re refuses it; keep the text)
            more, end = self.sequence(end + 1)
            body += ")" + more
        self.out = body

    def sequence(self, i: int) -> tuple[str, int]:
        """The superset of the text from ``i`` up to the ``)`` closing it (or the end)."""
        out: list[str] = []
        p = self.p
        while i < len(p):
            c = p[i]
            if c == ")":
                return "".join(out), i
            if c == "\\":
                piece, i = self.escape(i)
            elif c == "[":
                piece, i = self.char_class(i)
            elif c == "(":
                piece, i = self.group(i)
            elif c in "*+?" or (c == "{" and _QUANTIFIER.match(p, i)):
                piece, i = self.quantifier(i)
            elif c in "^$" and self.multiline:
                piece, i = self.zero_width(i + 1), i + 1
            else:
                piece, i = c, i + 1
            out.append(piece)
        return "".join(out), i

    def zero_width(self, after: int) -> str:
        """What a removed assertion leaves: nothing, or an empty group where a quantifier
        follows (which would otherwise repeat the atom before it)."""
        nxt = self.p[after:after + 1]
        return "(?:)" if nxt and nxt in "*+?{" else ""

    def quantifier(self, i: int) -> tuple[str, int]:
        p = self.p
        end = i + 1 if p[i] != "{" else _QUANTIFIER.match(p, i).end()  # type: ignore[union-attr]
        text = p[i:end]
        if text.startswith("{,"):
            text = "{0," + text[2:]  # the same bound; Rust regex needs the 0
        if p[end:end + 1] == "?":
            return text + "?", end + 1  # lazy: the same language
        if p[end:end + 1] == "+":
            self.note("possessive quantifier", p[i:end + 1], i, True)
            return text, end + 1
        return text, end

    def escape(self, i: int) -> tuple[str, int]:
        p = self.p
        nxt = p[i + 1:i + 2]
        if nxt == "k":
            self.note("named back-reference", "\\k", i, False)
            return "", i + 2
        if nxt in ("b", "B"):
            self.note("word boundary", p[i:i + 2], i, True)
            return self.zero_width(i + 2), i + 2
        if nxt.isdigit() and nxt != "0":
            digits = nxt
            if p[i + 2:i + 3].isdigit():
                if nxt in "01234567" and p[i + 2] in "01234567" and \
                        p[i + 3:i + 4] in tuple("01234567"):
                    return p[i:i + 4], i + 4  # an octal escape (as re reads it)
                digits += p[i + 2]
            self.note("back-reference", "\\" + digits, i, True)
            body = self.groups.get(int(digits))
            return ("(?:)" if body is None else f"(?:{body})"), i + 1 + len(digits)
        return p[i:i + 2], i + 2

    def char_class(self, i: int) -> tuple[str, int]:
        p = self.p
        j = i + 1
        if p[j:j + 1] == "^":
            j += 1
        if p[j:j + 1] == "]":
            j += 1  # a leading ']' is literal
        while j < len(p) and p[j] != "]":
            if p[j] == "\\":
                j += 2
                continue
            if p[j] == "[":
                self.note("'[' inside a character class", p[j:j + 2], j, False)
            elif p[j] in "&~-" and p[j + 1:j + 2] == p[j]:
                self.note("set operation in a character class", p[j:j + 2], j, False)
                j += 1
            j += 1
        return p[i:j + 1], j + 1

    def group(self, i: int) -> tuple[str, int]:
        p = self.p
        for head, name in _LOOKAROUND.items():
            if p.startswith(head, i):
                self.note(name, head, i, True)
                _, end = self.sequence(i + len(head))
                return self.zero_width(end + 1), end + 1
        if p.startswith("(?#", i):
            end = p.find(")", i)
            return "", (len(p) if end < 0 else end + 1)  # a comment
        if p.startswith("(?P=", i):
            self.note("named back-reference", "(?P=", i, False)
            end = p.find(")", i)
            return "", (len(p) if end < 0 else end + 1)
        if p.startswith("(?>", i) or p.startswith("(?(", i):
            conditional = p.startswith("(?(", i)
            self.note("conditional" if conditional else "atomic group", p[i:i + 3], i, False)
            start = i + 3
            if conditional:  # past the group it tests: "(?(1)"
                start = p.find(")", i + 3) + 1 or len(p)
            body, end = self.sequence(start)
            return f"(?:{body})", end + 1
        capture = False
        head = "(?:"
        start = i + 1
        if p.startswith("(?P<", i):
            capture, start = True, p.find(">", i) + 1
        elif p.startswith("(?", i):
            flags = _FLAGS.match(p, i)
            if flags is not None:
                on, off, kind = flags.group(1), flags.group(2) or "", flags.group(3)
                for letter, name in (("x", "verbose flag"), ("a", "ASCII flag")):
                    if letter in on + off:
                        self.note(name, flags.group(0), i, False)
                on, off = on.replace("m", ""), off.replace("m", "")
                head = "(?" + on + (f"-{off}" if off else "")
                if kind == ")":
                    return ("" if head == "(?" else head + ")"), flags.end()
                head += ":"
                start = flags.end()
        else:
            capture = True
        if capture:
            self.count += 1
            number = self.count
        body, end = self.sequence(start)
        if capture:
            self.groups[number] = body
        return f"{head}{body})", end + 1


def _in_class_or_escaped(pattern: str, pos: int) -> bool:
    """Whether the character at ``pos`` is escaped or inside a character class."""
    for i, _, inside in regex_chars(pattern):
        if i >= pos:
            return i > pos or inside
    return True


def _scan(pattern: str) -> _Scan:
    scan = _Scan(pattern)
    scan.run()
    if scan.flag_m is not None:
        scan.note("multiline flag", scan.flag_m.group(0), scan.flag_m.start(), True)
    return scan


def constructs(pattern: str) -> list[Construct]:
    """The constructs of ``pattern`` the backends do not read as ``re`` does, in order."""
    if not any(c in pattern for c in "\\([*+?{"):
        return []
    return sorted(_scan(pattern).found, key=lambda c: c.pos)


_STARTS = {_sc.AT_BEGINNING: "^", _sc.AT_BEGINNING_STRING: "\\A"}
_ENDS = {_sc.AT_END: "$", _sc.AT_END_STRING: "\\Z"}
_REPEATS = (_sc.MAX_REPEAT, _sc.MIN_REPEAT, getattr(_sc, "POSSESSIVE_REPEAT", _sc.MAX_REPEAT))


def misplaced_anchors(pattern: str) -> list[Construct]:
    """The ``^``/``\\A`` of ``pattern`` that can match after its first character, and the
    ``$``/``\\Z`` that can match before its last, where the whole text is the match (a regex
    constraint): the backends ignore anchors, which is exact only at the ends. ``pattern``
    must compile with ``re``; under ``(?m)`` anchors are the multiline flag's (``constructs``)."""
    if not any(a in pattern for a in ("^", "$", "\\A", "\\Z")):
        return []
    try:
        tree = _sp.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return []
    every: list[tuple[str, bool]] = []
    _walk_anchors(list(tree), True, True, every)
    if not any(bad for _, bad in every):
        return []
    written = _anchor_positions(pattern)
    aligned = len(written) == len(every)  # NOTE: re's parser may merge equal branch prefixes
    return [Construct("anchor inside the pattern", text,
                      written[k][0] if aligned else next(p for p, t in written if t == text),
                      False)
            for k, (text, bad) in enumerate(every) if bad]


def _zero_width(item: tuple[Any, Any]) -> bool:
    return item[0] in (_sc.AT, _sc.ASSERT, _sc.ASSERT_NOT)


def _walk_anchors(items: list[tuple[Any, Any]], lead: bool, trail: bool,
                  found: list[tuple[str, bool]]) -> None:
    """Append to ``found`` each anchor of ``items`` in order, with whether it may match
    elsewhere than the start (``lead``: ``items`` start the text) or end (``trail``) it
    asserts."""
    after = [True] * (len(items) + 1)
    for k in range(len(items) - 1, -1, -1):
        after[k] = after[k + 1] and _zero_width(items[k])
    before = True
    for k, (op, av) in enumerate(items):
        first, last = lead and before, trail and after[k + 1]
        if op == _sc.AT:
            if av in _STARTS or av in _ENDS:
                found.append((_STARTS.get(av) or _ENDS[av],
                              not first if av in _STARTS else not last))
        elif op == _sc.SUBPATTERN:
            _walk_anchors(list(av[-1]), first, last, found)
        elif op == _sc.BRANCH:
            for alt in av[1]:
                _walk_anchors(list(alt), first, last, found)
        elif op in _REPEATS:
            once = av[1] <= 1  # NOTE: a second copy of the body follows the first
            _walk_anchors(list(av[2]), first and once, last and once, found)
        elif op == getattr(_sc, "ATOMIC_GROUP", None):
            _walk_anchors(list(av), first, last, found)
        elif op == _sc.GROUPREF_EXISTS:
            for branch in av[1:]:
                if branch is not None:
                    _walk_anchors(list(branch), first, last, found)
        before = before and _zero_width((op, av))


def _anchor_positions(pattern: str) -> list[tuple[int, str]]:
    """Where ``^``, ``$``, ``\\A`` and ``\\Z`` are written outside classes, in order."""
    out = [(i, c) for i, c, inside in regex_chars(pattern) if c in "^$" and not inside]
    out += [(m.start(), m.group(1)) for m in re.finditer(r"(?<!\\)(?:\\\\)*(\\[AZ])", pattern)]
    return sorted(out)


def first_refused(pattern: str) -> Construct | None:
    """The first construct of ``pattern`` that no superset can stand for, if any."""
    return next((c for c in constructs(pattern) if not c.checkable), None)


def superset(pattern: str) -> str | None:
    """A pattern the backends read as ``re`` does, whose strings include every string
    ``pattern`` matches (``pattern`` itself when it has no construct); None if some construct
    has no such superset, or the superset would be too long."""
    if not constructs(pattern):
        return pattern
    scan = _scan(pattern)
    if any(not c.checkable for c in scan.found):
        return None
    out = scan.out
    if len(out) > _MAX_GROWTH * len(pattern) + _MAX_EXTRA:
        return None
    try:
        re.compile(out)
    except (re.error, RecursionError, OverflowError):
        return None
    return out if not constructs(out) else None


#: Why a construct that no superset stands for is refused.
_WHY = {
    "atomic group": "the value checks' regex engine does not read atomic groups (write the "
                    "group without '?>')",
    "conditional": "the value checks' regex engine does not read conditionals (write the "
                   "cases as an alternation)",
    "named back-reference": "the value checks' regex engine does not read named "
                            "back-references (use a numbered one, '\\1')",
    "verbose flag": "the grammar backends read whitespace and '#' under it differently from "
                    "Python's re (write the pattern without it)",
    "ASCII flag": "the grammar backends do not read it (write the classes out: '[0-9]' for "
                  "'\\d')",
    "'[' inside a character class": "Python's re reads it as a character, the grammar "
                                    "backends as a nested class (escape it: '\\[')",
    "set operation in a character class": "Python's re reads it as two characters, the "
                                          "grammar backends as a set operation (escape them)",
    "anchor inside the pattern": "the grammar backends ignore anchors, which is right only at "
                                 "the pattern's start or end",
}
_NOT_HERE = ("no grammar holds it, and it cannot be left to a value check here (strict mode, "
             "tool-call parameters and value_checks=False have none, nor has a pattern under "
             "'not', 'if' or 'oneOf' or one whose superset is too long)")


def refuse_constructs(pattern: Any, where: str, keyword: str, *, checkable_ok: bool) -> None:
    """Raise ``UnsupportedSchemaError`` (``keyword`` at ``where``) if ``pattern`` has a
    construct no superset stands for, or (``checkable_ok`` false: what the value checks did
    not take) any construct."""
    if not isinstance(pattern, str):
        return
    bad = next((c for c in constructs(pattern) if not (c.checkable and checkable_ok)), None)
    if bad is None:
        return
    why = _WHY.get(bad.name, _NOT_HERE)
    raise UnsupportedSchemaError(f"unsupported pattern at {where}: {bad.describe()} of "
                                 f"{pattern!r} cannot be enforced: {why}", path=where,
                                 keyword=keyword)
