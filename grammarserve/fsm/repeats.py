"""Spot a tool call that repeats an earlier call of the same reply, byte for byte.

Small models, once allowed several calls, tend to write the right call and then the same call
again until ``max_tokens``. :class:`CallRepeatGuard` reads the reply's text as it is generated
(either tool-call format of :mod:`grammarserve.fsm.tools`) and tells the engine two things:

- :meth:`~CallRepeatGuard.feed` returns where to end the reply when the call that just closed
  equals an earlier one: right after the call before it, so the repeat is not part of the reply
  (what is left are complete calls: the ``hermes`` text is valid as it is, the ``json_array``
  text lacks only its closing ``]``).
- :attr:`~CallRepeatGuard.held` is how much of the text's end must not be released yet: everything
  after the last complete call while what follows could still become a repeat (the whitespace
  between calls, then the new call as long as its text is a prefix of an earlier call). Streamed
  replies therefore never show a call that is later taken back.

A call is the text from ``<tool_call>`` to ``</tool_call>`` (``hermes``) or one object of the
array (``json_array``); JSON strings are tracked, so brackets or tags inside argument values do
not end a call.
"""

from __future__ import annotations

from grammarserve.fsm.json_lex import JsonLexer
from grammarserve.fsm.tools import END, TRIGGER

#: The formats the guard reads (the others run without it).
FORMATS = ("hermes", "json_array")


class CallRepeatGuard:
    """Watches the text of one tool-call reply in ``fmt`` (``"hermes"`` or ``"json_array"``)."""

    def __init__(self, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"tool call format must be one of {FORMATS}, got {fmt!r}")
        self.fmt = fmt
        self.text = ""
        self.calls: list[str] = []  # complete calls, as text
        self._pos = 0  # text[:_pos] is scanned
        self._boundary = -1  # end of the last complete call (-1: none yet)
        self._start = -1  # start of the call being written (-1: between calls)
        self._json = JsonLexer()
        self._json_done = False  # hermes: the call's JSON object closed; the end tag follows
        self._closed = False  # json_array: the array closed, no call can follow

    def feed(self, text: str) -> int | None:
        """Append ``text``. Returns None, or the length the reply's text must be cut to
        (everything fed so far counts) when a call just closed that repeats an earlier one."""
        self.text += text
        while self._pos < len(self.text):
            pos = self._pos
            end = self._scan_hermes() if self.fmt == "hermes" else self._scan_array()
            if end is None:
                if self._pos == pos:  # a partial tag at the end: wait for more text
                    break
                continue
            call = self.text[self._start:end]
            cut = self._boundary
            self._boundary, self._start = end, -1
            if call in self.calls:
                return cut
            self.calls.append(call)
        return None

    @property
    def held(self) -> int:
        """Characters at the end of the text fed so far that may still belong to a repeat."""
        if self._boundary < 0 or self._closed:
            return 0
        if self._start >= 0:
            partial = self.text[self._start:]
            if not any(c.startswith(partial) for c in self.calls):
                return 0
        return len(self.text) - self._boundary

    # -- scanners: consume text from ``_pos``; return the end of a call that just closed -------
    def _scan_hermes(self) -> int | None:
        text = self.text
        if self._start < 0:
            i = text.find(TRIGGER, self._pos)
            if i < 0:  # keep a possible partial trigger at the end for the next feed
                self._pos = max(self._pos, len(text) - len(TRIGGER) + 1)
                return None
            self._start, self._pos = i, i + len(TRIGGER)
            self._json, self._json_done = JsonLexer(), False
            return None
        if not self._json_done:
            ch = text[self._pos]
            self._pos += 1
            self._json.step(ch)
            self._json_done = self._json.depth == 0 and ch == "}"
            return None
        i = text.find(END, self._pos)
        if i < 0:
            self._pos = max(self._pos, len(text) - len(END) + 1)
            return None
        self._pos = i + len(END)
        return self._pos

    def _scan_array(self) -> int | None:
        ch = self.text[self._pos]
        self._pos += 1
        before = self._json.depth
        self._json.step(ch)
        after = self._json.depth
        if self._json.in_string or before == after:
            return None
        if before == 1 and after == 2 and ch == "{":
            self._start = self._pos - 1
        elif before == 2 and after == 1 and self._start >= 0:
            return self._pos
        elif after == 0:
            self._closed = True
        return None
