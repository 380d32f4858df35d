"""Regular complements of simple string languages, as anchored ``pattern``s.

The backends cannot negate a regex, but the complement of a *finite* set of strings, or of a
fixed sequence of character classes (``^[Pp][Oo] [Bb]ox`` or ``^ab$``), is again a small
regex: a string is outside the language exactly when it leaves the language's prefix tree at
some character (then anything may follow), or ends at a tree node that is not a word end, or
goes on past a word that must end there. Used by ``negate.py`` for ``not`` of ``const``/``enum``
strings and of ``pattern``.

Patterns are ECMA-262/Rust-regex compatible: ``^(?:...)$``, character classes, no
look-around; ``[^...]`` and ``[\\s\\S]`` match every code point, newline included.
"""

from __future__ import annotations

import re

#: Characters that must be escaped in a regex (outside and inside classes).
_META = frozenset("\\^$.|?*+()[]{}-&~#")
_ANY = r"[\s\S]"
#: At most this many characters in a generated pattern (a bigger one is refused).
MAX_PATTERN_CHARS = 8192


def escape(ch: str) -> str:
    """One literal character, escaped for a regex or a character class."""
    if ch in _META:
        return "\\" + ch
    if ch == "\n":
        return r"\n"
    if ch == "\r":
        return r"\r"
    if ch == "\t":
        return r"\t"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02x}"
    return ch


class _Node:
    __slots__ = ("children", "end")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.end = False


def _complement(node: _Node) -> str:
    """Strings (read from ``node``) that do not spell a word of the tree."""
    alts = [] if node.end else [""]
    if node.children:
        others = "".join(escape(c) for c in sorted(node.children))
        alts.append(f"[^{others}]{_ANY}*")
        for ch in sorted(node.children):
            alts.append(escape(ch) + _group(_complement(node.children[ch])))
    else:
        alts.append(f"{_ANY}+")  # past a word's end (node.end is True here)
    return "|".join(alts)


def _group(body: str) -> str:
    return f"(?:{body})"


def words_complement(words: list[str]) -> str | None:
    """An anchored pattern matching exactly the strings not in ``words`` (``None`` if it would
    be longer than ``MAX_PATTERN_CHARS``)."""
    root = _Node()
    for word in words:
        node = root
        for ch in word:
            node = node.children.setdefault(ch, _Node())
        node.end = True
    out = f"^{_group(_complement(root))}$"
    return out if len(out) <= MAX_PATTERN_CHARS else None


# A pattern this module can negate: ``^`` then literal characters or bracket classes (no
# quantifiers, no groups, no alternation), then ``$`` or nothing (a prefix).
_CLASS = r"\[\^?(?:\\.|[^\]\\\[])+\]"
_LITERAL = r"\\[^dDwWsSbBpPuxck0-9]|[^\\\[\](){}|?*+.^$]"
_ATOM = re.compile(rf"{_CLASS}|{_LITERAL}")


def _atoms(body: str) -> list[str] | None:
    out, pos = [], 0
    while pos < len(body):
        m = _ATOM.match(body, pos)
        if m is None:
            return None
        out.append(m.group(0))
        pos = m.end()
    return out


def _negate_atom(atom: str) -> str:
    if atom.startswith("[^"):
        return "[" + atom[2:]
    if atom.startswith("["):
        return "[^" + atom[1:]
    return f"[^{atom}]"


def pattern_complement(pattern: str) -> str | None:
    """An anchored pattern matching exactly the strings ``pattern`` does not match (JSON
    Schema ``pattern`` semantics: an unanchored search), or ``None`` if ``pattern`` is not a
    fixed sequence of characters and classes anchored at the start."""
    if not pattern.startswith("^"):
        return None
    body, whole = pattern[1:], False
    if body.endswith("$") and not body.endswith("\\$"):
        body, whole = body[:-1], True
    atoms = _atoms(body)
    if atoms is None:
        return None
    # NOTE: a string fails the pattern iff it stops early, or breaks the sequence at some
    # atom, or (for ``^...$``) goes on after the last atom.
    alts = []
    for i, atom in enumerate(atoms):
        head = "".join(atoms[:i])
        alts.append(head)  # ends before atom i
        alts.append(f"{head}{_negate_atom(atom)}{_ANY}*")
    if whole:
        alts.append("".join(atoms) + f"{_ANY}+")
    if not alts:
        return None  # "^" or "^$" prefix of everything / only the empty string: see caller
    out = "^" + _group("|".join(alts)) + "$"
    return out if len(out) <= MAX_PATTERN_CHARS else None
