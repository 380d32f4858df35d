"""Test helper: one request's greedy output, run two ways (in a batch and alone, with and without
the prefix cache), must agree up to fp32 near-ties (DESIGN.md, invariant 2).

Why not exact equality: a row's reduction order depends on the batch shape (an M=1 matmul is not
an M=8 one), so logits differ in the last bits between the two runs. Where two tokens are that
close, greedy may pick either, and both replies are right. Why not only validity: a real bug in
batching (a wrong KV slot, a mask leaking across rows) changes tokens that are not close. So the
check is: the same tokens, or the same tokens up to a position where both runs saw a near-tie
(the two best tokens within ``NEAR_TIE`` in log-probability). The outputs need
``top_logprobs >= 2`` (which changes no token: the top list is read off the same logits).
"""

from __future__ import annotations

from grammarserve.engine.request import RequestOutput

# fp32 reduction-order differences between batch shapes move a logprob by ~1e-5; a genuinely
# different distribution moves the top tokens by far more.
NEAR_TIE = 1e-3


def assert_same_greedy(a: RequestOutput, b: RequestOutput, *, near_tie: float = NEAR_TIE) -> None:
    """``a`` and ``b`` picked the same tokens, or diverged only at a near-tie."""
    if a.token_ids == b.token_ids:
        return
    common = min(len(a.token_ids), len(b.token_ids))
    i = next((k for k in range(common) if a.token_ids[k] != b.token_ids[k]), common)
    gaps = [out.top_logprobs[i][0][1] - out.top_logprobs[i][1][1]
            for out in (a, b) if i < len(out.top_logprobs) and len(out.top_logprobs[i]) >= 2]
    assert gaps, f"outputs differ at token {i} but carry no top_logprobs there"
    assert all(g <= near_tie for g in gaps), (
        f"outputs differ at token {i} where the best two tokens are {gaps} apart in "
        f"log-probability (not a near-tie): {a.text!r} vs {b.text!r}")
