"""The decode mirror's reuse of a finished request's row (grammarserve/attention/row_mirror.py)
on the embedded model: requests one after another behind the same cached prompt (a tool list)
take the previous one's row and gather only what is new, with greedy outputs token for token
those of the path that gathers every row from the pool (reuse off)."""

from __future__ import annotations

from typing import Any

import pytest

from grammarserve.attention import row_mirror
from grammarserve.attention.row_mirror import RowMirror
from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.llm import LLM
from grammarserve.openai.protocol import ChatMessage
from grammarserve.openai.render import render_chat
from grammarserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

QUESTIONS = ("What's the weather in Lisbon right now, in celsius?",
             "Send an e-mail to ana@example.com saying the report is ready.",
             "What's the weather in Lisbon right now, in celsius?",
             "Book a table for four at Lumi tomorrow.")


_TOOLS = [("get_weather", "Current weather for a city.", ("city", "unit")),
          ("send_email", "Send an e-mail.", ("to", "subject", "body")),
          ("create_event", "Create a calendar event.", ("title", "start", "end")),
          ("create_ticket", "Open a support ticket.", ("title", "priority", "body")),
          ("get_order", "Look up an order by its number.", ("order_id",)),
          ("refund_payment", "Refund a payment, fully or partly.", ("payment_id", "amount")),
          ("track_shipment", "Track a parcel by its tracking number.", ("tracking_number",)),
          ("run_sql", "Run a read-only SQL query.", ("query", "database")),
          ("read_file", "Read a text file.", ("path",)),
          ("book_table", "Book a restaurant table.", ("restaurant", "date", "party_size")),
          ("translate_text", "Translate text to another language.", ("text", "language")),
          ("set_reminder", "Set a reminder.", ("text", "at"))]


def _tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "required": list(params),
                       "properties": {p: {"type": "string"} for p in params}}}}
        for name, desc, params in _TOOLS]


def _run(smollm, monkeypatch: pytest.MonkeyPatch, reuse: bool) -> tuple[list[list[int]], RowMirror]:  # type: ignore[no-untyped-def]
    if not reuse:
        monkeypatch.setattr(row_mirror, "MIN_REUSE", 10**9)
    llm = LLM.from_engine(Engine(EngineConfig(device="cpu", kv_cache_tokens=8192,
                                              max_num_reqs=4), loaded=smollm))
    mirror = llm.engine.runner.attn.mirror
    assert isinstance(mirror, RowMirror)
    tools = _tools()
    outs = []
    for q in QUESTIONS:  # one at a time: each behind the cached tool block
        text = render_chat(llm.tokenizer, [ChatMessage(role="user", content=q)], tools=tools)
        out = llm.generate([text], SamplingParams(max_tokens=12, temperature=0))[0]
        outs.append(list(out.token_ids))
    monkeypatch.undo()
    return outs, mirror


def test_reused_rows_give_the_same_greedy_tokens_as_gathered_ones(smollm, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    new, m_new = _run(smollm, monkeypatch, reuse=True)
    old, m_old = _run(smollm, monkeypatch, reuse=False)
    assert m_old.reused_positions == 0
    assert m_new.reused_positions > 3 * 600  # the tool block (~700 tokens), three times
    assert m_new.gathered_positions < m_old.gathered_positions - 3 * 600
    assert new == old
    assert all(len(o) == 12 for o in new)
