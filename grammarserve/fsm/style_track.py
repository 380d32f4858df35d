"""Compact or spaced JSON from one grammar: a per-token tracker of the separator style.

A schema's first request under ``json_style="auto"`` runs one llguidance grammar whose JSON
allows one optional space between lexemes (``json_options("either")``) instead of one grammar
per style (``style.py``), so a cold schema costs one backend build, not two. This tracker
narrows that grammar to exactly the union of the compact and the spaced language: outside
strings, a space may only follow a separator (``,`` or ``:``), no other whitespace appears,
and the first separator decides
the style for the rest of the output: compact (no space after any separator) or spaced (exactly
one after each).

Every token's effect is precomputed from its bytes for each tracker state (a DFA run over the
whole vocabulary at once, ~0.1 s): which tokens a state allows (packed bitmask rows) and the
state each leaves. A step costs one numpy AND (~1 us).
"""

from __future__ import annotations

import numpy as np

from grammarserve.fsm.runs import HistoryTracker, pack_mask

# Lexical states, and the styles the output may still be in.
_OUT, _AFTER_SEP, _IN, _ESCAPE = range(4)
_UNDECIDED, _COMPACT, _SPACED = range(3)
#: States are ``style * 4 + lexical``; one more is the sink a refused byte leads to.
STATES = 12
_REJECT = STATES
_PAD = 256  # a byte value past every token's end (leaves the state as it is)
_WHITESPACE = frozenset(b" \t\r\n")


def _step(state: int, byte: int) -> int:
    """The tracker state after ``byte`` (``_REJECT`` if the byte breaks the style)."""
    if state == _REJECT or byte == _PAD:
        return state
    style, lex = divmod(state, 4)
    if lex == _ESCAPE:
        return style * 4 + _IN
    if lex == _IN:
        if byte == 0x5C:  # backslash
            return style * 4 + _ESCAPE
        return style * 4 + (_OUT if byte == 0x22 else _IN)
    if lex == _AFTER_SEP:
        if byte == 0x20:
            return _REJECT if style == _COMPACT else _SPACED * 4 + _OUT
        if byte in _WHITESPACE:
            return _REJECT
        if style == _SPACED:
            return _REJECT
        style = _COMPACT
    if byte in _WHITESPACE:  # a space not after a separator; other whitespace: never
        return _REJECT
    if byte in (0x2C, 0x3A):  # comma, colon
        return style * 4 + _AFTER_SEP
    return style * 4 + (_IN if byte == 0x22 else _OUT)


class StyleTable:
    """Per-vocabulary tables of the style tracker: ``allowed[s]`` is the packed bitmask of the
    tokens state ``s`` allows, ``after[s, t]`` the state token ``t`` leads to."""

    def __init__(self, token_bytes: list[bytes], vocab_size: int) -> None:
        table = np.array([[_step(s, b) for b in range(257)] for s in range(STATES + 1)],
                         dtype=np.int8)
        texts = [token_bytes[t] if t < len(token_bytes) else b"" for t in range(vocab_size)]
        lengths = np.array([len(t) for t in texts])
        order = np.argsort(-lengths, kind="stable")
        width = int(lengths.max(initial=0))
        data = np.full((vocab_size, max(width, 1)), _PAD, dtype=np.int16)
        for t, text in enumerate(texts):
            data[t, :len(text)] = np.frombuffer(text, dtype=np.uint8)
        data = data[order]
        states = np.repeat(np.arange(STATES, dtype=np.int8)[:, None], vocab_size, axis=1)
        longest = lengths[order]
        for col in range(width):
            n = int((longest > col).sum())  # the tokens longer than ``col`` bytes come first
            states[:, :n] = table[states[:, :n], data[:n, col]]
        after = np.empty_like(states)
        after[:, order] = states
        self.after = after
        self.allowed = np.stack([pack_mask(after[s] != _REJECT, (vocab_size + 31) // 32)
                                 for s in range(STATES)])


class StyleTracker(HistoryTracker[int]):
    """One output's style state over a :class:`StyleTable`, with history for rollback (the
    interface of ``runs.RunTracker``)."""

    def __init__(self, table: StyleTable) -> None:
        super().__init__(_UNDECIDED * 4 + _OUT)
        self.table = table

    @property
    def style(self) -> str:
        """``"undecided"``, ``"compact"`` or ``"spaced"``."""
        return ("undecided", "compact", "spaced")[self.state // 4]

    def apply(self, row: np.ndarray) -> None:
        """Restrict ``row`` (numpy int32 view) to the tokens that keep one style."""
        np.bitwise_and(row, self.table.allowed[self.state], out=row)

    def advance(self, token_id: int) -> None:
        """Update the state with an accepted token."""
        nxt = int(self.table.after[self.state, token_id])
        # NOTE: the grammar accepted a token this tracker refuses only if the caller skipped
        # the mask (forced tokens are cut by ``permits``); keep the state rather than sink.
        self._push(self.state if nxt == _REJECT else nxt)

    def permits(self, tokens: list[int]) -> int:
        """How many of ``tokens``, accepted in order from now, keep one style."""
        state = self.state
        for i, t in enumerate(tokens):
            state = int(self.table.after[state, t])
            if state == _REJECT:
                return i
        return len(tokens)
