"""DRY ("don't repeat yourself"), a penalty on tokens that would extend a repetition.

A small model inside a JSON string value can fall into a loop it cannot leave
(``"jay.jay.jay..."``, an e-mail address written again after a comma) until ``max_tokens``: the
constraint allows any string, and each repeat makes the next more likely. DRY (as in
text-generation-webui and llama.cpp) looks, before each sampled token, for earlier places in
the reply where the tokens just written already occurred: if the last ``m`` tokens also occur
earlier, followed by token ``t``, then ``t`` would extend a repeat of length ``m + 1`` and its
logit is lowered by ``multiplier * base ** (m - allowed_length)`` (for ``m >= allowed_length``).

DRY acts only inside JSON string values, and only on repeats within the string being written:
where the reply so far has an odd number of quotes (outside a string, a penalty would change
numbers: ``1.0`` after an earlier ``1.00``), and the earlier occurrence must lie after the
string's opening quote. A string that repeats an earlier one (an array item copied whole) is
left to the loop guard (``grammarserve.fsm.loop_guard``): penalized, the copy became a near copy
(``GmbH``, ``Gmbh``) that the guard cannot see, and the loop went on. Sequence breakers stop a
match: a token whose text holds one of ``BREAKERS``, or only whitespace, neither matches nor is
crossed; nor is a breaker itself penalized (a penalty on the closing quote would hold a string
open). Only the reply's own tokens are read.

The penalty is a per-row logit bias for the step, applied with the others before the
constraint's mask, so it never allows a token the constraint forbids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Characters that end a repeat match (JSON structure and line ends).
BREAKERS = ('"', ":", "\n", "{", "}", "[", "]")
#: Repeats are looked for among the last this many tokens of the reply.
WINDOW = 512


@dataclass(frozen=True)
class DryParams:
    """DRY's settings for one request (``multiplier`` 0: off; defaults: ``SamplingParams``)."""

    multiplier: float
    base: float
    allowed_length: int


class DryPenalty:
    """DRY biases for the rows of a step, from each row's reply so far.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerFast
        The model's tokenizer (which tokens are sequence breakers).
    vocab_size : int
        Logits width (ids beyond the tokenizer's are no breakers).
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        breaker = np.zeros(vocab_size, dtype=bool)
        quotes = np.zeros(vocab_size, dtype=np.int64)
        n = min(vocab_size, len(tokenizer))
        texts = tokenizer.batch_decode([[t] for t in range(n)])
        breaker[:n] = [any(b in text for b in BREAKERS) or not text.strip() for text in texts]
        quotes[:n] = [text.count('"') - text.count('\\"') for text in texts]
        self._breaker = breaker
        self._quotes = quotes

    def bias(self, output: Sequence[int], params: DryParams) -> dict[int, float]:
        """Token id -> (negative) bias for the next token after ``output``."""
        if params.multiplier <= 0.0 or len(output) < 2:
            return {}
        whole = np.asarray(output, dtype=np.int64)
        if self._breaker[whole[-1]] or int(self._quotes[whole].sum()) % 2 == 0:
            return {}  # NOTE: outside a string (an even number of quotes so far)
        seq = whole[-WINDOW:]
        n = len(seq)
        # NOTE: match[j] = how many tokens ending at j equal the reply's last tokens (a
        # backward walk per candidate end; candidates are the earlier places of the last token
        # inside the open string: after the last token holding a quote, its opening one)
        quoted = np.flatnonzero(self._quotes[seq] != 0)
        opened = int(quoted[-1]) if len(quoted) else -1
        ends = np.flatnonzero(seq[:-1] == seq[-1])
        ends = ends[ends > opened]
        out: dict[int, float] = {}
        for j in ends[::-1]:
            m = 0
            while m <= j and seq[j - m] == seq[n - 1 - m] and not self._breaker[seq[j - m]]:
                m += 1
            if m < params.allowed_length:
                continue
            nxt = int(seq[j + 1])
            if self._breaker[nxt]:  # NOTE: never hold a string open (its closing quote)
                continue
            penalty = params.multiplier * params.base ** (m - params.allowed_length)
            out[nxt] = min(out.get(nxt, 0.0), -min(penalty, 100.0))
        return out
