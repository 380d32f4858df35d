"""Regular complements of simple string languages, as anchored ``pattern``s.

The backends cannot negate a regex, but the complement of a *finite* set of strings, or of a
fixed sequence of character classes (``^[Pp][Oo] [Bb]ox`` or ``^ab$``), is again a small
regex: a string is outside the language exactly when it leaves the language's prefix tree at
some character (then anything may follow), or ends at a tree node that is not a word end, or
goes on past a word that must end there. Used by ``schema/algebra/negate.py`` for ``not`` of ``const``/``enum``
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


# A pattern this module can negate: ``^`` then literal characters or bracket classes, each
# alone or repeated an exact number of times (``[0-9a-f]{8}``; no other quantifiers, groups or
# alternation), then ``$`` or nothing (a prefix).
_CLASS = r"\[\^?(?:\\[^pP]|[^\]\\\[])+\]"  # NOTE: no Unicode property escapes
_LITERAL = r"\\[^dDwWsSbBpPuxck0-9]|[^\\\[\](){}|?*+.^$]"
_ATOM = re.compile(rf"({_CLASS}|{_LITERAL})(?:\{{(\d+)\}})?")
#: At most this many characters in a fixed sequence (an exact count is expanded).
MAX_ATOMS = 256


def _atoms(body: str) -> list[str] | None:
    out: list[str] = []
    pos = 0
    while pos < len(body):
        m = _ATOM.match(body, pos)
        if m is None:
            return None
        out.extend([m.group(1)] * (int(m.group(2)) if m.group(2) is not None else 1))
        if len(out) > MAX_ATOMS:
            return None
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
    fixed sequence of characters and classes anchored at the start, or an unanchored literal
    or single class (then: the strings that do not contain it)."""
    if not pattern.startswith("^"):
        return _avoiding(pattern)
    body, whole = pattern[1:], False
    if body.endswith("$") and not body.endswith("\\$"):
        body, whole = body[:-1], True
    atoms = _atoms(body)
    if atoms is None or not atoms and not whole:
        return None  # "^" matches everything: nothing is left
    # NOTE: a string fails the pattern iff it stops early, or breaks the sequence at some
    # atom, or (for ``^...$``) goes on after the last atom. Nested from the end, so the
    # pattern grows linearly: rest(i) = "" | not(atom i) .* | atom i rest(i + 1).
    rest = f"{_ANY}+" if whole else None
    for atom in reversed(atoms):
        alts = ["", f"{_negate_atom(atom)}{_ANY}*"]
        if rest is not None:
            alts.append(atom + _group(rest))
        rest = "|".join(alts)
    out = "^" + _group(rest or "") + "$"
    return out if len(out) <= MAX_PATTERN_CHARS else None


def _literal(atom: str) -> str | None:
    if len(atom) == 1:
        return atom
    if atom[0] == "\\" and len(atom) == 2 and not atom[1].isalnum():
        return atom[1]
    return None


def _avoiding(pattern: str) -> str | None:
    """The strings that do not contain the literal ``pattern``: the matching automaton (KMP)
    with its last state removed, written as a regex by state elimination."""
    if pattern.endswith("$"):
        return None
    atoms = _atoms(pattern)
    if atoms is not None and len(atoms) == 1 and atoms[0].startswith("["):
        return f"^{_negate_atom(atoms[0])}*$"  # no character of the class anywhere
    literals = [_literal(a) for a in atoms] if atoms else []
    word = [c for c in literals if c is not None]
    if not word or len(word) < len(literals) or len(word) > 16:
        return None
    chars = sorted(set(word))
    m = len(word)

    def step(q: int, c: str | None) -> int:  # c None: a character not in the word
        seen: list[str | None] = [*word[:q], c]
        for k in range(min(len(seen), m), 0, -1):
            if seen[len(seen) - k:] == word[:k]:
                return k
        return 0

    edges: dict[tuple[int, int], list[str | None]] = {}
    for q in range(m):
        for c in [*chars, None]:
            nxt = step(q, c)
            if nxt < m:
                edges.setdefault((q, nxt), []).append(c)
    # states 0..m-1 (all accepting), start -1, final m
    rx: dict[tuple[int, int], str] = {k: _label(v, chars) for k, v in edges.items()}
    rx[(-1, 0)] = ""
    for q in range(m):
        rx[(q, m)] = ""
    for k in reversed(range(m)):
        loop = rx.pop((k, k), None)
        star = f"(?:{loop})*" if loop else ""
        ins = [(i, r) for (i, j), r in rx.items() if j == k]
        outs = [(j, r) for (i, j), r in rx.items() if i == k]
        for key in [key for key in rx if k in key]:
            del rx[key]
        for i, a in ins:
            for j, b in outs:
                path = _cat(a, star, b)
                rx[(i, j)] = path if (i, j) not in rx else f"{rx[(i, j)]}|{path}"
        if sum(len(r) for r in rx.values()) > MAX_PATTERN_CHARS:
            return None
    out = "^" + _group(rx.get((-1, m), "")) + "$"
    return out if len(out) <= MAX_PATTERN_CHARS else None


def _label(labels: list[str | None], chars: list[str]) -> str:
    named = sorted(c for c in labels if c is not None)
    if None not in labels:
        return escape(named[0]) if len(named) == 1 else "[" + "".join(map(escape, named)) + "]"
    others = [c for c in chars if c not in named]
    return "[^" + "".join(map(escape, others)) + "]" if others else _ANY


def _cat(*parts: str) -> str:
    return "".join(p if "|" not in p else _group(p) for p in parts)
