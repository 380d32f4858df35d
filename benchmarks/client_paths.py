"""Seven everyday client paths to a nested Pydantic model, as a user of each library writes them,
shared by ``benchmarks/bench_clients.py`` and ``tests/test_clients_nested_e2e.py``.

The model: an ``Invoice`` with a list of ``LineItem`` sub-objects, a ``Literal`` currency and an
``Optional[str]`` purchase order (required and nullable, as Pydantic emits it). The prompt is what
a user writes: a system message "Extract the invoice." and the document; no JSON example, no word
about JSON (the schema travels in ``response_format`` or in a tool's parameters). Greedy
(temperature 0), ``max_tokens`` 400, one attempt (no client-side retries).

Each path is ``(base_url, document, log=None, cold=None) -> Invoice``: it returns the parsed
object or raises whatever the client raises. ``log`` (a :class:`RawLog`) collects the raw HTTP
bodies so a failure can be read. ``cold`` (a string) puts the request in a prefix-cache namespace
of its own (``cache_namespace`` for grammarserve, ``cache_salt`` for vLLM; each ignores the
other's field), so its prompt is prefilled from scratch whatever ran before: the greedy reply can
differ between a cold and a cached prefill where two tokens are within float noise (measured:
``DOC-1`` then ``1`` vs ``2`` at logprob -1.7998 vs -1.7997 on the hardware invoice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import instructor
import openai
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

MODEL = "default"
MAX_TOKENS = 400
SYSTEM = "Extract the invoice."
TIMEOUT = 300.0


class LineItem(BaseModel):
    description: str
    quantity: int
    unit_price: float


class Invoice(BaseModel):
    vendor: str
    invoice_number: str
    currency: Literal["USD", "EUR", "GBP"]
    line_items: list[LineItem]
    total: float
    purchase_order: Optional[str]  # noqa: UP045 -- the spelling users write


DOCUMENTS: dict[str, str] = {
    "hardware": (
        "Northwind Hardware Supply\n"
        "412 Elm Street, Dayton, OH 45402\n\n"
        "INVOICE No. NW-20931\n"
        "Date: March 4, 2026\n"
        "Bill to: Riverside Property Management\n"
        "PO: PO-7781\n\n"
        "Item                     Qty   Unit price\n"
        "Duct tape, 2 in          4     $6.50\n"
        "Extension cord, 25 ft    2     $18.99\n"
        "LED work light           1     $42.00\n\n"
        "Total due: $110.98 (USD)\n"),
    "translation": (
        "Atelier Lumière SARL - 18 rue des Lilas, 69003 Lyon\n\n"
        "Facture / Invoice: AL-2026-044\n"
        "Date: 12 February 2026\n"
        "Client: Brightwave GmbH, Berlin\n\n"
        "Translation of user manual (FR>EN), 3 pages at EUR 45.00 per page\n"
        "Proofreading, 2 hours at EUR 30.00 per hour\n\n"
        "Total: EUR 195.00\n"
        "Payment within 30 days. No purchase order reference.\n"),
    "catering": (
        "Invoice INV-5512\n"
        "From: Hartley & Sons Catering Ltd, 9 Mill Lane, Leeds LS1 4AB\n"
        "To: Pennine Events, purchase order PE-0392\n"
        "Issued 21 January 2026\n\n"
        "- Sandwich platter x 6 @ £24.00\n"
        "- Fruit bowl x 3 @ £15.50\n\n"
        "Amount due: £190.50 GBP\n"),
}

TRUTH: dict[str, dict[str, Any]] = {
    "hardware": {
        "vendor": "Northwind Hardware Supply", "invoice_number": "NW-20931", "currency": "USD",
        "line_items": [
            {"description": "Duct tape, 2 in", "quantity": 4, "unit_price": 6.5},
            {"description": "Extension cord, 25 ft", "quantity": 2, "unit_price": 18.99},
            {"description": "LED work light", "quantity": 1, "unit_price": 42.0}],
        "total": 110.98, "purchase_order": "PO-7781"},
    "translation": {
        "vendor": "Atelier Lumière SARL", "invoice_number": "AL-2026-044", "currency": "EUR",
        "line_items": [
            {"description": "Translation of user manual (FR>EN)", "quantity": 3,
             "unit_price": 45.0},
            {"description": "Proofreading", "quantity": 2, "unit_price": 30.0}],
        "total": 195.0, "purchase_order": None},
    "catering": {
        "vendor": "Hartley & Sons Catering Ltd", "invoice_number": "INV-5512", "currency": "GBP",
        "line_items": [
            {"description": "Sandwich platter", "quantity": 6, "unit_price": 24.0},
            {"description": "Fruit bowl", "quantity": 3, "unit_price": 15.5}],
        "total": 190.5, "purchase_order": "PE-0392"},
}


@dataclass
class RawLog:
    """The raw HTTP request and reply bodies of a path's calls, oldest first."""

    requests: list[str] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)

    def hooks(self) -> dict[str, list[Any]]:
        return {"request": [self.on_request], "response": [self.on_response]}

    def ahooks(self) -> dict[str, list[Any]]:
        async def on_request(request: Any) -> None:
            self.on_request(request)

        async def on_response(response: Any) -> None:
            await response.aread()
            self.bodies.append(response.text)
        return {"request": [on_request], "response": [on_response]}

    def on_request(self, request: Any) -> None:
        self.requests.append(request.content.decode(errors="replace"))

    def on_response(self, response: Any) -> None:
        response.read()
        self.bodies.append(response.text)


def _http(log: RawLog | None) -> openai.DefaultHttpxClient:
    """The SDK's own HTTP client (openai 3.x runs on ``httpx2``), with ``log``'s hooks."""
    return openai.DefaultHttpxClient(timeout=TIMEOUT, event_hooks=log.hooks() if log else {})


def _client(base_url: str, log: RawLog | None) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=TIMEOUT,
                         http_client=_http(log))


def _messages(document: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": document}]


class NotParsed(Exception):
    """The client returned no parsed object (it reported a refusal or an empty parse)."""


def _extra(cold: str | None) -> dict[str, Any] | None:
    return {"cache_namespace": cold, "cache_salt": cold} if cold else None


def sdk_parse(base_url: str, document: str, log: RawLog | None = None,
              cold: str | None = None) -> Invoice:
    """``client.chat.completions.parse(response_format=Invoice)``."""
    reply = _client(base_url, log).chat.completions.parse(
        model=MODEL, messages=_messages(document), response_format=Invoice,
        max_tokens=MAX_TOKENS, temperature=0, extra_body=_extra(cold))
    parsed = reply.choices[0].message.parsed
    if parsed is None:
        raise NotParsed(reply.choices[0].message.content)
    return parsed


def responses_parse(base_url: str, document: str, log: RawLog | None = None,
                    cold: str | None = None) -> Invoice:
    """``client.responses.parse(text_format=Invoice)`` with the instruction as ``instructions``."""
    reply = _client(base_url, log).responses.parse(
        model=MODEL, instructions=SYSTEM, input=document, text_format=Invoice,
        max_output_tokens=MAX_TOKENS, temperature=0, extra_body=_extra(cold))
    if reply.output_parsed is None:
        raise NotParsed(reply.output_text)
    return reply.output_parsed


def _instructor(mode: instructor.Mode) -> Callable[..., Invoice]:
    def path(base_url: str, document: str, log: RawLog | None = None,
             cold: str | None = None) -> Invoice:
        patched = instructor.from_openai(_client(base_url, log), mode=mode)
        return patched.chat.completions.create(
            model=MODEL, response_model=Invoice, messages=_messages(document),
            max_tokens=MAX_TOKENS, temperature=0, max_retries=0, extra_body=_extra(cold))
    path.__doc__ = f"instructor ``from_openai(mode={mode})``, one attempt."
    return path


instructor_tools = _instructor(instructor.Mode.TOOLS)
instructor_json_schema = _instructor(instructor.Mode.JSON_SCHEMA)


def _langchain(method: Literal["json_schema", "function_calling"]) -> Callable[..., Invoice]:
    def path(base_url: str, document: str, log: RawLog | None = None,
             cold: str | None = None) -> Invoice:
        llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key="x",  # type: ignore[arg-type]
                         temperature=0, max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
                         max_retries=0, timeout=TIMEOUT, http_client=_http(log),
                         extra_body=_extra(cold))
        out = llm.with_structured_output(Invoice, method=method, include_raw=True).invoke(
            [("system", SYSTEM), ("human", document)])
        if out["parsing_error"] is not None:
            raise out["parsing_error"]
        if not isinstance(out["parsed"], Invoice):
            raise NotParsed(repr(out["raw"]))
        return out["parsed"]
    path.__doc__ = f"LangChain ``with_structured_output(Invoice, method={method!r})``."
    return path


langchain_json_schema = _langchain("json_schema")
langchain_function_calling = _langchain("function_calling")


def pydantic_ai_agent(base_url: str, document: str, log: RawLog | None = None,
                      cold: str | None = None) -> Invoice:
    """pydantic-ai ``Agent(output_type=Invoice)`` on its OpenAI provider; no output retry."""
    async def run() -> Invoice:
        hooks = log.ahooks() if log else {}
        async with openai.DefaultAsyncHttpxClient(timeout=TIMEOUT, event_hooks=hooks) as http:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0,
                                        timeout=TIMEOUT, http_client=http)
            model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, output_type=Invoice, system_prompt=SYSTEM, retries=0)
            settings = ModelSettings(temperature=0, max_tokens=MAX_TOKENS)
            if cold:
                settings["extra_body"] = _extra(cold)
            result = await agent.run(document, model_settings=settings)
            return result.output
    return asyncio.run(run())


PATHS: dict[str, Callable[..., Invoice]] = {
    "sdk_parse": sdk_parse,
    "responses_parse": responses_parse,
    "instructor_tools": instructor_tools,
    "instructor_json_schema": instructor_json_schema,
    "langchain_json_schema": langchain_json_schema,
    "langchain_function_calling": langchain_function_calling,
    "pydantic_ai": pydantic_ai_agent,
}


def checked_fields(truth: dict[str, Any]) -> int:
    """How many fields :func:`field_scores` checks for ``truth`` (what a failed parse misses)."""
    return 5 + 3 * len(truth["line_items"])


def field_scores(invoice: Invoice, truth: dict[str, Any]) -> tuple[int, int]:
    """``(right, checked)`` over vendor, invoice_number, currency, the number of line items, each
    truth item's description / quantity / unit_price (matched by position) and total. Strings
    compare without case and surrounding space; numbers within 0.005."""
    def same(a: Any, b: Any) -> bool:
        if isinstance(b, str):
            return isinstance(a, str) and a.strip().casefold() == b.strip().casefold()
        return isinstance(a, (int, float)) and abs(float(a) - float(b)) < 0.005

    got = invoice.model_dump()
    checks = [same(got[k], truth[k]) for k in ("vendor", "invoice_number", "currency", "total")]
    checks.append(len(got["line_items"]) == len(truth["line_items"]))
    for i, want in enumerate(truth["line_items"]):
        have = got["line_items"][i] if i < len(got["line_items"]) else None
        checks += [have is not None and same(have[k], want[k]) for k in want]
    return sum(checks), len(checks)
