"""The quality matrix's workload: schema shapes x prompt styles, documents with ground truth.

Each shape is a Pydantic-style JSON schema (no ``additionalProperties``, ``anyOf`` with null for
``Optional``, as ``model_json_schema()`` emits) and a generator of (document, truth) pairs: the
truth is drawn first, the document is written from it in prose or a semi-structured layout,
several items per document where the shape has arrays. Deterministic for a seed.

Prompt styles (``PROMPT_STYLES``):

- ``fewshot_compact`` / ``fewshot_spaced`` / ``fewshot_indented``: two worked examples (other
  documents of the same shape) answered in that JSON style as earlier chat turns;
- ``zeroshot``: an instruction to answer with JSON, no examples;
- ``schema_prompt``: the schema itself in the system prompt;
- ``no_json``: a task description only, no word about JSON (what ``parse()`` users send).

:func:`field_scores` compares a parsed reply with the truth leaf by leaf (list items by index,
numbers numerically, strings case- and space-insensitively).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROMPT_STYLES = ("fewshot_compact", "fewshot_spaced", "fewshot_indented", "zeroshot",
                 "schema_prompt", "no_json")

_NAMES = ["Maria Lopez", "John Carter", "Aiko Tanaka", "Pierre Dubois", "Fatima Khan",
          "Lars Nilsson", "Chen Wei", "Olga Petrova", "Ravi Patel", "Ana Costa"]
_COMPANIES = ["Acme Hardware", "Bluebird Catering", "Klein Elektro", "Northwind Traders",
              "Summit Outdoor", "Harbor Books", "Pixel Forge", "Green Valley Farms"]
_CITIES = ["Lisbon", "Denver", "Osaka", "Lyon", "Toronto", "Oslo", "Austin", "Madrid"]
_ITEMS = [("Claw hammer", 14.5), ("Duct tape roll", 3.99), ("Ladder 6ft", 89.0),
          ("USB-C cable", 4.2), ("Power strip", 18.9), ("Coffee urn rental", 15.0),
          ("Sandwich platter", 24.0), ("Paint brush set", 12.75), ("LED bulb", 2.5),
          ("Garden hose", 29.99)]
_PRODUCTS = ["trail running shoes", "espresso machine", "noise-cancelling headphones",
             "standing desk", "cast iron skillet", "electric kettle", "yoga mat"]


@dataclass(frozen=True)
class Shape:
    """One schema shape: its schema, a truth generator and a document writer."""

    name: str
    schema: dict[str, Any]
    task: str  # what the no_json prompt asks for
    draw: Callable[[random.Random], dict[str, Any]]
    write: Callable[[dict[str, Any], random.Random], str]

    def documents(self, n: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
        rng = random.Random(f"{self.name}-{seed}")
        out = []
        for _ in range(n):
            truth = self.draw(rng)
            out.append((self.write(truth, rng), truth))
        return out


def _email(name: str, rng: random.Random) -> str:
    first, last = name.lower().split()
    return f"{first}.{last}@{rng.choice(['example.com', 'mail.org', 'corp.net'])}"


# -- flat ------------------------------------------------------------------------------------
def _contact(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(_NAMES)
    return {"name": name, "age": rng.randint(21, 70), "city": rng.choice(_CITIES),
            "email": _email(name, rng), "employer": rng.choice(_COMPANIES)}


def _contact_doc(t: dict[str, Any], rng: random.Random) -> str:
    return (f"{t['name']} ({t['age']}) lives in {t['city']} and works at {t['employer']}. "
            f"You can reach them at {t['email']}.")


# -- nested objects ----------------------------------------------------------------------------
_CATEGORIES = ["billing", "shipping", "technical", "account"]
_PRIORITIES = ["low", "medium", "high"]
_ISSUES = {"billing": "I was charged twice for order {}.",
           "shipping": "My parcel for order {} has not arrived.",
           "technical": "Since your last update the app crashes when I open order {}.",
           "account": "I cannot log in to see my order {}."}


def _ticket(rng: random.Random) -> dict[str, Any]:
    name, cat = rng.choice(_NAMES), rng.choice(_CATEGORIES)
    return {"customer": {"name": name, "email": _email(name, rng)},
            "issue": {"category": cat, "priority": rng.choice(_PRIORITIES)},
            "order_number": str(rng.randint(10000, 99999))}


def _ticket_doc(t: dict[str, Any], rng: random.Random) -> str:
    c, i = t["customer"], t["issue"]
    return (f"From: {c['name']} <{c['email']}>\nSubject: {i['category']} problem\n\n"
            f"Hello, {_ISSUES[i['category']].format(t['order_number'])} "
            f"Please treat this as {i['priority']} priority.\nThanks, {c['name'].split()[0]}")


# -- arrays of objects ---------------------------------------------------------------------------
def _invoice(rng: random.Random) -> dict[str, Any]:
    items = [{"description": d, "quantity": rng.randint(1, 6), "unit_price": p}
             for d, p in rng.sample(_ITEMS, rng.randint(2, 3))]
    total = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    return {"vendor": rng.choice(_COMPANIES), "invoice_number": f"INV-{rng.randint(1000, 99999)}",
            "line_items": items, "total": total}


def _invoice_doc(t: dict[str, Any], rng: random.Random) -> str:
    lines = "\n".join(f"{i['quantity']} x {i['description']} @ {i['unit_price']:.2f}"
                      for i in t["line_items"])
    return (f"INVOICE {t['invoice_number']}\n{t['vendor']}\nBill to: {rng.choice(_NAMES)}\n\n"
            f"{lines}\n\nTotal due: {t['total']:.2f}")


# -- optional / nullable -------------------------------------------------------------------------
def _cv(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(_NAMES)
    return {"name": name, "title": rng.choice(["Data Engineer", "Nurse", "Accountant", "Chef"]),
            "years_experience": rng.choice([None, rng.randint(1, 25)]),
            "phone": rng.choice([None, f"+1-555-{rng.randint(1000, 9999)}"])}


def _cv_doc(t: dict[str, Any], rng: random.Random) -> str:
    parts = [f"{t['name']}, {t['title']}."]
    if t["years_experience"] is not None:
        parts.append(f"{t['years_experience']} years of experience.")
    parts.append(f"Phone: {t['phone']}." if t["phone"] else "No phone number given.")
    return " ".join(parts)


# -- enums ---------------------------------------------------------------------------------------
_SENTIMENT = {"positive": "I love it, works perfectly", "negative": "broke after a week, awful",
              "neutral": "it is fine, nothing special"}


def _review(rng: random.Random) -> dict[str, Any]:
    return {"product": rng.choice(_PRODUCTS), "sentiment": rng.choice(list(_SENTIMENT)),
            "stars": rng.randint(1, 5), "recommend": rng.choice([True, False])}


def _review_doc(t: dict[str, Any], rng: random.Random) -> str:
    rec = "I would recommend it." if t["recommend"] else "I would not recommend it."
    return (f"Review of the {t['product']}: {_SENTIMENT[t['sentiment']]}. "
            f"{t['stars']} out of 5 stars. {rec}")


# -- patterns and dates --------------------------------------------------------------------------
def _order(rng: random.Random) -> dict[str, Any]:
    return {"order_id": f"ORD-{rng.randint(10000, 99999)}",
            "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "zip_code": f"{rng.randint(10000, 99999)}", "city": rng.choice(_CITIES)}


def _order_doc(t: dict[str, Any], rng: random.Random) -> str:
    return (f"Order {t['order_id']} was placed on {t['date']} for delivery to "
            f"{t['city']}, postal code {t['zip_code']}.")


# -- numbers and floats --------------------------------------------------------------------------
def _product(rng: random.Random) -> dict[str, Any]:
    return {"name": rng.choice(_PRODUCTS), "price": round(rng.uniform(5, 500), 2),
            "rating": round(rng.uniform(1, 5), 1), "stock": rng.randint(0, 400),
            "weight_kg": round(rng.uniform(0.1, 20), 2)}


def _product_doc(t: dict[str, Any], rng: random.Random) -> str:
    return (f"{t['name'].title()} - now ${t['price']:.2f}. Rated {t['rating']} / 5. "
            f"{t['stock']} units in stock. Shipping weight {t['weight_kg']} kg.")


def _obj(props: dict[str, Any], title: str, defs: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"properties": props, "required": list(props), "title": title,
                           "type": "object"}
    if defs:
        out["$defs"] = defs
    return out


_S, _I, _N = {"type": "string"}, {"type": "integer"}, {"type": "number"}
_NULLABLE_S = {"anyOf": [_S, {"type": "null"}]}

SHAPES: dict[str, Shape] = {s.name: s for s in [
    Shape("flat", _obj({"name": _S, "age": _I, "city": _S, "email": _S, "employer": _S},
                       "Contact"), "Extract the contact details.", _contact, _contact_doc),
    Shape("nested", _obj({"customer": {"$ref": "#/$defs/Customer"},
                          "issue": {"$ref": "#/$defs/Issue"}, "order_number": _S}, "Ticket", {
        "Customer": _obj({"name": _S, "email": _S}, "Customer"),
        "Issue": _obj({"category": {"enum": _CATEGORIES, "type": "string"},
                       "priority": {"enum": _PRIORITIES, "type": "string"}}, "Issue")}),
        "Triage the support ticket.", _ticket, _ticket_doc),
    Shape("array_of_objects", _obj({
        "vendor": _S, "invoice_number": {"pattern": r"^INV-\d{4,6}$", "type": "string"},
        "line_items": {"items": {"$ref": "#/$defs/LineItem"}, "type": "array"}, "total": _N},
        "Invoice", {"LineItem": _obj({"description": _S,
                                      "quantity": {"minimum": 1, "type": "integer"},
                                      "unit_price": {"minimum": 0, "type": "number"}},
                                     "LineItem")}),
        "Extract the invoice data.", _invoice, _invoice_doc),
    Shape("optional_nullable", _obj({"name": _S, "title": _S,
                                     "years_experience": {"anyOf": [_I, {"type": "null"}]},
                                     "phone": _NULLABLE_S}, "Resume"),
          "Summarize the resume.", _cv, _cv_doc),
    Shape("enums", _obj({"product": _S,
                         "sentiment": {"enum": list(_SENTIMENT), "type": "string"},
                         "stars": {"maximum": 5, "minimum": 1, "type": "integer"},
                         "recommend": {"type": "boolean"}}, "Review"),
          "Analyze the product review.", _review, _review_doc),
    Shape("patterns_dates", _obj({"order_id": {"pattern": r"^ORD-\d{5}$", "type": "string"},
                                  "date": {"format": "date", "type": "string"},
                                  "zip_code": {"pattern": r"^\d{5}$", "type": "string"},
                                  "city": _S}, "Order"),
          "Record the order.", _order, _order_doc),
    Shape("numbers", _obj({"name": _S, "price": _N, "rating": _N, "stock": _I,
                           "weight_kg": _N}, "Product"),
          "Catalog the product.", _product, _product_doc),
]}


def dump(value: Any, style: str) -> str:
    """``value`` as JSON in a few-shot style (compact, spaced or indented)."""
    if style == "compact":
        return json.dumps(value, separators=(",", ":"))
    if style == "indented":
        return json.dumps(value, indent=2)
    return json.dumps(value)


def messages(shape: Shape, doc: str, style: str) -> list[dict[str, str]]:
    """The chat messages of one request: ``doc`` asked in prompt ``style``."""
    if style.startswith("fewshot_"):
        msgs = [{"role": "system", "content": "Extract the data from the document as JSON."}]
        for ex_doc, ex_truth in shape.documents(2, seed=10_000):
            msgs += [{"role": "user", "content": ex_doc},
                     {"role": "assistant", "content": dump(ex_truth, style.split("_", 1)[1])}]
        return msgs + [{"role": "user", "content": doc}]
    system = {
        "zeroshot": "Extract the data from the document. Answer with a JSON object only.",
        "schema_prompt": "Extract the data from the document. Answer with a JSON object that "
                         f"matches this JSON schema:\n{json.dumps(shape.schema)}",
        "no_json": shape.task,
    }[style]
    return [{"role": "system", "content": system}, {"role": "user", "content": doc}]


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}/{k}"))
        return out
    if isinstance(value, list):
        out = {f"{path}/#": len(value)}
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{path}/{i}"))
        return out
    return {path: value}


def _same(truth: Any, got: Any) -> bool:
    if isinstance(truth, bool) or isinstance(got, bool):
        return truth is got
    if isinstance(truth, (int, float)) and isinstance(got, (int, float)):
        return abs(truth - got) <= 1e-6 * max(1.0, abs(truth))
    if isinstance(truth, str) and isinstance(got, str):
        return " ".join(truth.lower().split()) == " ".join(got.lower().split())
    return truth == got


def field_scores(truth: dict[str, Any], parsed: Any) -> tuple[int, int]:
    """(correct, total) leaf fields of ``truth`` in ``parsed`` (a list's length counts as one
    field, its items by index); a reply that did not parse scores 0 of the total."""
    want = _leaves(truth)
    got = _leaves(parsed) if isinstance(parsed, dict) else {}
    return sum(1 for k, v in want.items() if k in got and _same(v, got[k])), len(want)


def batch_input(path: Any, shape: Shape, style: str, n: int, max_tokens: int
                ) -> list[dict[str, Any]]:
    """A Batch-API input file of ``n`` documents of ``shape`` asked in prompt ``style``
    (``response_format`` json_schema, not strict, greedy); returns the truths, line order."""
    truths = []
    with open(path, "w") as f:
        for i, (doc, truth) in enumerate(shape.documents(n)):
            body = {"model": "default", "messages": messages(shape, doc, style),
                    "max_tokens": max_tokens, "temperature": 0,
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": shape.schema["title"], "schema": shape.schema}}}
            f.write(json.dumps({"custom_id": f"doc-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")
            truths.append(truth)
    return truths
