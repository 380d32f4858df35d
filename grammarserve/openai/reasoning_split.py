"""A reply's text into reasoning and content, incrementally (a stream's deltas split exactly as
the whole text is).

The reasoning is the text between the format's markers (without the whitespace around it);
the content is what follows the end marker and what the family writes after it
(``after_end``, then gpt-oss's final-channel header). A reply whose prompt left the span to
the model and that does not open it is all content; one cut inside the span is all reasoning.
Text that may still turn out to be a marker is held back until it is known.
"""

from __future__ import annotations

from collections.abc import Sequence

from grammarserve.fsm.reasoning_formats import ReasoningFormat
from grammarserve.openai.logprobs import TokenTexts

_BEFORE, _IN, _AFTER, _CONTENT = range(4)


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker`` (a marker split
    across deltas)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Splits one reply's text as it arrives (:meth:`feed`, then :meth:`finish`)."""

    def __init__(self, fmt: ReasoningFormat, *, opened: bool) -> None:
        self._fmt = fmt
        self._state = _IN if opened else _BEFORE
        self._buf = ""
        self._pos = 0  # characters of the reply consumed from the buffer
        self._lead = True  # the reasoning's leading whitespace is still dropped
        self._expect = [p for p in (fmt.after_end, fmt.answer_header) if p]
        self.spanned = opened  # whether the reply has a reasoning span
        #: Where the content begins in the reply's text (None: not yet, or never).
        self.answer_at: int | None = None

    def feed(self, text: str) -> tuple[str, str]:
        """``(reasoning, content)`` that ``text`` (the next part of the reply) completes."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        """What is still held, at the end of the reply."""
        return self._drain(final=True)

    def step(self, text: str, *, last: bool) -> tuple[str, str]:
        """:meth:`feed` ``text``, then :meth:`finish` too when it is the reply's ``last``
        part: the ``(reasoning, content)`` to send for it."""
        thought, content = self.feed(text)
        if last:
            more = self.finish()
            thought, content = thought + more[0], content + more[1]
        return thought, content

    def _eat(self, n: int) -> str:
        head, self._buf = self._buf[:n], self._buf[n:]
        self._pos += n
        return head

    def _reason(self, out: list[str], text: str) -> None:
        if self._lead:
            text = text.lstrip()
            self._lead = not text
        if text:
            out.append(text)

    def _drain(self, *, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        start, end = self._fmt.start, self._fmt.end
        while True:
            buf = self._buf
            if self._state == _BEFORE:
                rest = buf.lstrip()
                if rest.startswith(start):
                    self._eat(len(buf) - len(rest) + len(start))
                    self._state, self.spanned = _IN, True
                    continue
                if not final and start.startswith(rest):  # NOTE: "" or a part of the marker
                    break
                self._state, self.answer_at = _CONTENT, self._pos
            elif self._state == _IN:
                i = buf.find(end)
                if i >= 0:
                    self._reason(reasoning, self._eat(i).rstrip())
                    self._eat(len(end))
                    self._state = _AFTER
                    continue
                if final:
                    self._reason(reasoning, self._eat(len(buf)).rstrip())
                    break
                keep = _partial(buf, end)
                text = buf[:len(buf) - keep].rstrip()
                self._reason(reasoning, self._eat(len(text)))
                break
            elif self._state == _AFTER:
                if self._expect:
                    want = self._expect[0]
                    if buf.startswith(want):
                        self._eat(len(want))
                        self._expect.pop(0)
                        continue
                    if not final and want.startswith(buf):
                        break
                    self._expect = []
                    if not want.strip():  # NOTE: other whitespace than the family's
                        rest = buf.lstrip()
                        if not final and not rest:
                            break
                        self._eat(len(buf) - len(rest))
                self._state, self.answer_at = _CONTENT, self._pos
            else:
                if buf:
                    content.append(self._eat(len(buf)))
                break
        return "".join(reasoning), "".join(content)


def split(fmt: ReasoningFormat, text: str, *, opened: bool) -> tuple[str | None, str, int | None]:
    """``(reasoning or None, content, where the content begins)`` of a whole reply."""
    s = ReasoningSplitter(fmt, opened=opened)
    thought, content = s.step(text, last=True)
    return (thought if s.spanned else None), content, s.answer_at


def reasoning_tokens(texts: TokenTexts, token_ids: Sequence[int], text: str,
                     answer_at: int | None) -> int:
    """How many of a reply's tokens wrote its reasoning span (up to where the content
    begins; all of them when it never does)."""
    if answer_at is None:
        return len(token_ids)
    target = len(text[:answer_at].encode("utf-8"))
    seen = 0
    for n, tid in enumerate(token_ids):
        if seen >= target:
            return n
        seen += len(texts.get(tid)[1])
    return len(token_ids)
