"""The multi-tenant workload of ``bench_router.py``: tenants, each with its own system prompt and
tool set, sending chat requests that must call one of their tools; requests interleaved across
tenants.

Every tenant's requests share a long prompt prefix (system prompt + tool definitions) and one
grammar (its tool set with ``tool_choice: required``); the user turns differ.
"""

from __future__ import annotations

import random
from typing import Any

DOMAINS = ["airline", "bank", "clinic", "court", "energy", "farm", "garage", "hotel", "insurer",
           "library", "museum", "newspaper", "observatory", "pharmacy", "port", "railway",
           "school", "stadium", "theatre", "university", "warehouse", "winery", "zoo", "gym"]
VERBS = ["lookup", "create", "cancel", "update", "list", "schedule", "estimate", "verify"]
NOUNS = ["booking", "account", "order", "ticket", "invoice", "visit", "claim", "report"]


def tenant_tools(t: int) -> list[dict[str, Any]]:
    """Tenant ``t``'s three tools (names and parameters differ between tenants)."""
    rng = random.Random(1000 + t)
    tools = []
    for k in range(3):
        name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}_{t}_{k}"
        props: dict[str, Any] = {
            "reference": {"type": "string", "description": "the record's reference code"},
            "priority": {"type": "string", "enum": ["low", "normal", "high"]},
        }
        if k == 1:
            props["count"] = {"type": "integer", "minimum": 1, "maximum": 20}
        if k == 2:
            props["note"] = {"type": "string", "description": "free text for the clerk"}
        tools.append({"type": "function", "function": {
            "name": name, "description": f"{name.replace('_', ' ')} for tenant {t}",
            "parameters": {"type": "object", "properties": props,
                           "required": ["reference"]}}})
    return tools


def tenant_system(t: int) -> str:
    """Tenant ``t``'s system prompt (a few hundred tokens, distinct per tenant)."""
    rng = random.Random(t)
    domain = DOMAINS[t % len(DOMAINS)]
    rules = [f"Rule {i + 1}: when a customer of the {domain} mentions "
             f"{rng.choice(NOUNS)} number {rng.randrange(100, 999)}, check it with the "
             f"{rng.choice(VERBS)} tool before answering, and never promise a "
             f"{rng.choice(NOUNS)} without a reference." for i in range(8)]
    return (f"You are the assistant of the {domain} number {t}. You help staff and customers "
            "with their records. Always call exactly one tool for each request, with the "
            "reference the user gives.\n" + "\n".join(rules))


def chat_body(t: int, j: int, *, max_tokens: int = 48) -> dict[str, Any]:
    """Request ``j`` of tenant ``t``: a chat body whose reply must be a call of a tenant tool."""
    return {"model": "default", "temperature": 0, "max_tokens": max_tokens,
            "tool_choice": "required", "parallel_tool_calls": False,
            "tools": tenant_tools(t),
            "messages": [{"role": "system", "content": tenant_system(t)},
                         {"role": "user", "content": f"Request {j}: please handle reference "
                          f"R-{t:03d}-{j:04d} with {['low', 'normal', 'high'][j % 3]} "
                          "priority."}]}


def interleaved(tenants: int, per_tenant: int, seed: int = 0) -> list[tuple[int, int]]:
    """``(tenant, request)`` pairs: round by round, each round's tenants in a shuffled order."""
    rng = random.Random(seed)
    order: list[tuple[int, int]] = []
    for j in range(per_tenant):
        round_ = list(range(tenants))
        rng.shuffle(round_)
        order += [(t, j) for t in round_]
    return order
