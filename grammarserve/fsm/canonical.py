"""Jump-forward spans tokenized the way the model's tokenizer writes the same text.

A backend's forced tokens spell the forced bytes, but not as the tokenizer would: llguidance and
xgrammar pick tokens by the token trie, so ``{`` + ``\\n  "vendor": "`` comes out as ``\\n  ``,
``"``, ``ven``, ``dor``, ``":``, `` "`` where the tokenizer writes ``\\n ``, `` "``, ``v``,
``endor``, ``":``, `` "``. A model is trained on its tokenizer's output only: fed a tokenization
it never wrote, a small model loses its place (SmolLM2 then loops inside strings and arrays:
benchmarks/README.md, issue 32). :class:`CanonicalSpans` re-tokenizes each span in context:

- the text of the last ``context`` output tokens plus the span's text is encoded; the tokens
  after the context are the span, when the context tokens come back unchanged (else the span
  starts where the model's own tokens would be re-split: the span text is encoded alone);
- at the span's end, a token that would merge with what comes next (`` `` before ``true`` is
  `` true``) is left for the model to write: the span keeps only the tokens that every probe
  continuation (``PROBES``) leaves unchanged;
- when the tokens do not spell exactly the span's bytes (a partial UTF-8 character, a tokenizer
  that adds a prefix space), the backend's span is kept as it was.

The result spells a prefix of the backend's forced bytes, so every token of it is legal: the
backends, the lexical trackers and the value checks all advance by bytes. Results are memoized
per (context tokens, span tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

#: Continuations the end of a span is tried against: what most often follows a forced span in
#: JSON (the first letter or digit of a value or key, whitespace). Punctuation is left out: an
#: opened string is rarely empty (`` "`` + ``"`` is `` ""``); a rarer first character (``-``
#: after `` "``: `` "-``) may then follow a token it would have merged with.
PROBES = ("a", "A", "1", " ", "\n")


class CanonicalSpans:
    """Re-tokenizes jump-forward spans canonically (see the module docstring).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerFast
        The model's tokenizer.
    context : int
        Output tokens before the span that are re-encoded with it.
    cache_entries : int
        Memoized spans.
    """

    def __init__(self, tokenizer: Any, *, context: int = 2, cache_entries: int = 16384) -> None:
        self._tok = tokenizer
        self.context = context
        self._canonical = lru_cache(maxsize=cache_entries)(self._compute)

    def canonical(self, output: Sequence[int], span: list[int]) -> list[int]:
        """The tokens to force for the backend's ``span`` after the output tokens ``output``:
        canonical tokens spelling a prefix of ``span``'s bytes (possibly all of them, possibly
        none), or ``span`` itself where no canonical form is safe."""
        if not span:
            return span
        ctx = tuple(output[-self.context:]) if self.context else ()
        return list(self._canonical(ctx, tuple(span)))

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False))

    def _encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def _compute(self, ctx: tuple[int, ...], span: tuple[int, ...]) -> tuple[int, ...]:
        text = self._decode(span)
        if "\ufffd" in text:
            return span
        prefix = self._decode(ctx) if ctx else ""
        if "\ufffd" in prefix or (ctx and tuple(self._encode(prefix)) != ctx):
            prefix, ctx = "", ()  # the context itself is not canonical: encode the span alone
        whole = self._encode(prefix + text)
        if tuple(whole[:len(ctx)]) != ctx:
            whole, ctx, prefix = self._encode(text), (), ""
        keep = len(whole)
        for probe in PROBES:
            ids = self._encode(prefix + text + probe)
            same = 0
            while same < keep and same < len(ids) and ids[same] == whole[same]:
                same += 1
            keep = same
        tokens = whole[len(ctx):keep] if keep > len(ctx) else []
        if not text.startswith(self._decode(tokens)):
            return span
        return tuple(tokens)
