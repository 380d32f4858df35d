"""A streaming JSON tracker: where each value of a growing JSON document starts, at which path,
and when it closes (for the run-time value checks, ``checked_matcher.py``).

The input is the generated text, byte by byte, as the grammar lets it through, so it is always
a prefix of a JSON document; the tracker does not validate it. Paths are tuples of object keys
(``str``) and array indices (``int``) from the root. A string or container closes at its last
byte; a number or literal (``true``, ``false``, ``null``) at the first byte after it, or at
:meth:`JsonTracker.end` (the stop token) for a bare root value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

Path = tuple[str | int, ...]
Span = tuple[int, int]

_OBJ, _ARR = 0, 1
#: Where the next byte falls (:meth:`JsonTracker.lexical_state`): outside strings, inside a
#: string or key, right after a backslash inside one.
LEX_OUT, LEX_IN, LEX_ESC = 0, 1, 2
_WS = frozenset(b" \t\r\n")
_QUOTE, _BACKSLASH = 0x22, 0x5C


@dataclass(frozen=True)
class Closed:
    """A value that closed: its path, its bytes ``[start, end)`` in the document, the spans of
    its items (arrays) and of the items before it (when it is an array item)."""

    path: Path
    start: int
    end: int
    items: tuple[Span, ...] = ()
    siblings: tuple[Span, ...] = ()


@dataclass
class _Frame:
    kind: int
    path: Path
    start: int
    expect_key: bool = True  # objects: the next string is a key
    key: str = ""
    index: int = 0  # arrays: the index of the next item
    items: list[Span] = field(default_factory=list)


class JsonTracker:
    """Follows one JSON document through :meth:`feed`; :meth:`truncate` goes back."""

    def __init__(self) -> None:
        self.text = bytearray()
        self._reset()

    def _reset(self) -> None:
        self._stack: list[_Frame] = []
        self._scalar: tuple[Path, int] | None = None  # an open string, number or literal
        self._bare = False  # the open scalar is a number or literal
        self._in_key = False
        self._key_start = 0
        self._escape = False

    def feed(self, data: bytes) -> list[Closed]:
        """Append ``data``; return the values that closed in it, innermost first."""
        out: list[Closed] = []
        base = len(self.text)
        self.text += data
        for i, c in enumerate(data):
            self._byte(base + i, c, out)
        return out

    def end(self) -> list[Closed]:
        """The document ended (stop token): close a number or literal still open."""
        out: list[Closed] = []
        if self._scalar is not None and self._bare:
            self._close_scalar(len(self.text), out)
        return out

    def truncate(self, n: int) -> None:
        """Forget everything after the first ``n`` bytes."""
        text = bytes(self.text[:n])
        self.text = bytearray()
        self._reset()
        self.feed(text)

    def open_values(self) -> list[tuple[Path, int]]:
        """The values open now (outermost first): their paths and start offsets."""
        out = [(f.path, f.start) for f in self._stack]
        if self._scalar is not None:
            out.append(self._scalar)
        return out

    def lexical_state(self) -> tuple[int, int]:
        """How many containers are open, and whether the next byte is outside strings
        (``LEX_OUT``), inside one (``LEX_IN``) or escaped inside one (``LEX_ESC``)."""
        inside = self._in_key or (self._scalar is not None and not self._bare)
        return len(self._stack), (LEX_ESC if inside and self._escape
                                  else LEX_IN if inside else LEX_OUT)

    def items_of(self, path: Path) -> list[Span] | None:
        """The closed items of the open array at ``path``; None if no array is open there."""
        for f in self._stack:
            if f.kind == _ARR and f.path == path:
                return list(f.items)
        return None

    # -- the lexer -------------------------------------------------------------------------
    def _byte(self, pos: int, c: int, out: list[Closed]) -> None:
        if self._scalar is not None and not self._bare or self._in_key:
            if self._escape:
                self._escape = False
            elif c == _BACKSLASH:
                self._escape = True
            elif c == _QUOTE:
                if self._in_key:
                    self._in_key = False
                    raw = bytes(self.text[self._key_start:pos])
                    try:
                        key = json.loads(b'"' + raw + b'"')
                    except ValueError:  # not from a JSON grammar: keep going, never fail
                        key = raw.decode("utf-8", "replace")
                    self._stack[-1].key = key
                else:
                    self._close_scalar(pos + 1, out)
            return
        if self._scalar is not None:  # a number or literal
            if c in _WS or c in b",]}":
                self._close_scalar(pos, out)
            else:
                return
        if c in _WS or c == 0x3A:  # ':' - the key is known already
            return
        top = self._stack[-1] if self._stack else None
        if c == 0x2C:  # ','
            if top is not None and top.kind == _OBJ:
                top.expect_key = True
        elif c in b"]}":
            if top is None:
                return
            self._stack.pop()
            self._closed(top.path, top.start, pos + 1, out, tuple(top.items))
        elif c == _QUOTE and top is not None and top.kind == _OBJ and top.expect_key:
            top.expect_key = False
            self._in_key = True
            self._key_start = pos + 1
        elif c in b"{[":
            self._stack.append(_Frame(_OBJ if c == 0x7B else _ARR, self._path(), pos))
        else:
            self._scalar = (self._path(), pos)
            self._bare = c != _QUOTE

    def _path(self) -> Path:
        if not self._stack:
            return ()
        top = self._stack[-1]
        return top.path + ((top.key,) if top.kind == _OBJ else (top.index,))

    def _close_scalar(self, end: int, out: list[Closed]) -> None:
        assert self._scalar is not None
        path, start = self._scalar
        self._scalar = None
        self._bare = False
        self._closed(path, start, end, out, ())

    def _closed(self, path: Path, start: int, end: int, out: list[Closed],
                items: tuple[Span, ...]) -> None:
        parent = self._stack[-1] if self._stack else None
        siblings: tuple[Span, ...] = ()
        if parent is not None and parent.kind == _ARR:
            siblings = tuple(parent.items)
            parent.items.append((start, end))
            parent.index += 1
        out.append(Closed(path, start, end, items, siblings))
