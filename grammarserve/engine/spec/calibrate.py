"""Measure what one forward costs for a few span lengths and contexts before serving, and feed
those steps to the cost fit (``cost.py``): without them the fit starts from its prior, and the
first requests' steps (one sampled token, now and then a jump-forward span, nearly one context
length) cannot tell the cost of a token from the cost of a step, so the first minute of a
server drafted little or nothing."""

from __future__ import annotations

import time

from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.engine.spec.cost import StepCost

CONTEXTS = (128, 640)  # positions of the first span token: a short and a few-shot prompt
SPANS = (1, 4, 8)  # tokens fed (1: a plain decode step; the others: a draft's verification)
REPEAT = 3
TOKEN = 100  # any ordinary token id: the cost does not depend on which


def calibrate(runner: ModelRunner, cost: StepCost, seq_id: int) -> None:
    """Run ``REPEAT`` forwards of each span length after each context on a scratch table row
    (``seq_id``: an identity no request uses), observe their times in ``cost``, and free the
    row and its KV slots. Contexts beyond the model's or the pool's room are cut to it; does
    nothing when there is no room at all."""
    span = max(SPANS)
    room = min(runner.req_to_token.max_context, runner.pool.num_free) - span
    contexts = sorted({min(c, room) for c in CONTEXTS})  # a small model's context: shorter
    if runner.req_to_token.num_free < 1 or room < 1:
        return
    row = runner.req_to_token.alloc()
    slots = runner.pool.alloc(contexts[-1] + span)
    try:
        runner.req_to_token.write(row, 0, slots)
        runner.forward([BatchEntry(row, 0, [TOKEN] * contexts[-1], seq_id=seq_id)])
        for ctx in contexts:
            runner.forward([BatchEntry(row, ctx, [TOKEN], seq_id=seq_id)])  # NOTE: the KV
            for _ in range(REPEAT):  # mirror's rebuild for a new length is not a step's cost
                for n in SPANS:
                    t0 = time.perf_counter()
                    runner.forward([BatchEntry(row, ctx, [TOKEN] * n, seq_id=seq_id,
                                               num_logits=n)])
                    cost.observe(n, n * (ctx + n / 2) / 1000, time.perf_counter() - t0)
    finally:
        runner.pool.free(slots)
        runner.req_to_token.free(row)
