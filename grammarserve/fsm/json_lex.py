"""The JSON lexer of generated text: where strings open and close (backslash escapes honored)
and how deep brackets are outside them, fed one character at a time.

It does not validate: the text is what a grammar let through, or a reply being parsed, so
anything that is not a string or a bracket (keys, numbers, literals, stray characters) only
passes by. Its readers: the repeated-call guard (:mod:`grammarserve.fsm.repeats`) and the
tool-call parser of the protocol layer (:mod:`grammarserve.openai.toolparse_format`,
:mod:`grammarserve.openai.toolparse_args`), which import it from here, the grammar layer being
below them. (The byte-level trackers of masks, ``runs.py`` and ``json_track.py``, keep their
own loops: they run per byte of every vocabulary token or hold more state per byte.)
"""

from __future__ import annotations

OPEN, CLOSE = "{[", "}]"


class JsonLexer:
    """String and bracket state of JSON text: :meth:`step` reads one character."""

    __slots__ = ("depth", "in_string", "escape")

    def __init__(self) -> None:
        self.depth = 0  # brackets open outside strings (negative after unbalanced closes)
        self.in_string = False
        self.escape = False  # inside a string, right after a backslash

    def step(self, ch: str) -> int:
        """Read ``ch``; returns the change of depth it made: +1 an opening bracket, -1 a
        closing one, 0 anything else (every character inside a string)."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
            return 0
        if ch == '"':
            self.in_string = True
        elif ch in OPEN:
            self.depth += 1
            return 1
        elif ch in CLOSE:
            self.depth -= 1
            return -1
        return 0


class JsonValueEnd(JsonLexer):
    """Finds where a JSON object or array that starts at the first character fed ends."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def feed(self, text: str) -> int:
        """Consume ``text``; returns how many of its characters belong to the value (all of
        them until it closes; then :attr:`done` is True)."""
        for i, ch in enumerate(text):
            if self.step(ch) < 0 and self.depth == 0:
                self.done = True
                return i + 1
        return len(text)


def string_end(text: str, start: int) -> int | None:
    """The end (past its closing quote) of the JSON string whose opening quote is
    ``text[start]``; None if ``text`` ends first."""
    if text[start] != '"':
        raise ValueError(f"no JSON string starts at {start}: {text[start]!r}")
    lexer = JsonLexer()
    lexer.step('"')
    for i in range(start + 1, len(text)):
        lexer.step(text[i])
        if not lexer.in_string:
            return i + 1
    return None
