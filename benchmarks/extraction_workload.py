"""The JSON-extraction workload shared by the benchmarks: a 7-field contact-record schema, a
shared instruction prompt with few-shot examples, and N synthetic documents (deterministic).

The few-shot answers are written in one of ``FEW_SHOT_STYLES`` (``style=`` of ``instructions`` and
``messages``), to measure how a JSON output style the prompt shows (or does not show) changes what
the model writes:

- ``spaced`` (default, the workload of issue 15): ``json.dumps`` defaults, ``", "`` and ``": "``
  (``{"name": "Maria Lopez", "age": 34, ...}``)
- ``compact``: ``","`` and ``":"`` (``{"name":"Maria Lopez","age":34,...}``)
- ``indented``: ``indent=2``, one field per line
- ``none``: no worked examples at all (task, schema and rules only)

Only the answers change; the documents, the schema shown in the prompt (``indent=2``) and the
rules are the same in every style.
"""

from __future__ import annotations

import json
import random
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "occupation": {"type": "string"},
        "employer": {"type": "string"},
        "city": {"type": "string"},
        "email": {"type": "string"},
        "status": {"enum": ["active", "inactive", "unknown"]},
    },
    "required": ["name", "age", "occupation", "employer", "city", "email", "status"],
    "additionalProperties": False,
}

_FIRST = ["Maria", "John", "Aiko", "Pierre", "Fatima", "Lars", "Chen", "Olga", "Ravi", "Ana",
          "Tom", "Sara", "Kofi", "Elena", "Omar", "Greta"]
_LAST = ["Lopez", "Smith", "Tanaka", "Dubois", "Haddad", "Berg", "Wei", "Ivanova", "Patel",
         "Costa", "Brown", "Klein", "Mensah", "Rossi", "Farouk", "Nilsson"]
_JOBS = ["nurse", "software engineer", "teacher", "accountant", "chef", "architect",
         "pharmacist", "electrician", "journalist", "data analyst"]
_EMPLOYERS = ["St. Mary Hospital", "Acme Corp", "Northside High School", "Blue River Bank",
              "Luna Bistro", "Studio Forma", "CityCare Pharmacy", "BrightWire Ltd",
              "The Daily Ledger", "Metrics Inc"]
_CITIES = ["Denver", "Lyon", "Osaka", "Porto", "Oslo", "Austin", "Cairo", "Leeds", "Pune",
           "Turin"]


def _record(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    return {"name": f"{first} {last}", "age": rng.randint(21, 70),
            "occupation": rng.choice(_JOBS), "employer": rng.choice(_EMPLOYERS),
            "city": rng.choice(_CITIES), "email": f"{first.lower()}.{last.lower()}@example.com",
            "status": rng.choice(["active", "inactive", "unknown"])}


def _document(rec: dict[str, Any], rng: random.Random) -> str:
    status = {"active": "still works there", "inactive": "left the job last year",
              "unknown": "may or may not still work there"}[rec["status"]]
    filler = rng.choice(["The meeting was rescheduled twice because of the weather.",
                         "Parking near the office is difficult on weekdays.",
                         "The quarterly report is due at the end of the month.",
                         "Several colleagues mentioned the new coffee machine."])
    return (f"Notes from the intake call. {rec['name']} is {rec['age']} years old and works as "
            f"a {rec['occupation']} at {rec['employer']} in {rec['city']}. {filler} "
            f"Contact: {rec['email']}. According to the HR file, {rec['name'].split()[0]} "
            f"{status}.")


FEW_SHOT_STYLES = ("spaced", "compact", "indented", "none")


def dump_answer(rec: dict[str, Any], style: str = "spaced") -> str:
    """One few-shot answer in ``style`` (see the module docstring)."""
    if style == "spaced":
        return json.dumps(rec)
    if style == "compact":
        return json.dumps(rec, separators=(",", ":"))
    if style == "indented":
        return json.dumps(rec, indent=2)
    raise ValueError(f"few-shot style {style!r}: one of {', '.join(FEW_SHOT_STYLES)}")


def instructions(shots: int = 6, style: str = "spaced") -> str:
    """The shared system prompt: task, schema and ``shots`` worked examples (~1,300 tokens at 6)
    whose answers are written in ``style``; ``style="none"`` leaves the examples out."""
    if style not in FEW_SHOT_STYLES:
        raise ValueError(f"few-shot style {style!r}: one of {', '.join(FEW_SHOT_STYLES)}")
    if style == "none":
        shots = 0
    rng = random.Random(1234)
    parts = [("You are a data-extraction service. Read the document and return one JSON object "
              "with exactly these fields, following this JSON Schema:\n"),
             json.dumps(SCHEMA, indent=2),
             ("\nRules: copy names, employers and e-mail addresses exactly as written; age is an "
              "integer; status is active, inactive or unknown. Output only the JSON.\n")]
    for i in range(shots):
        rec = _record(rng)
        parts.append(f"\nExample {i + 1}\nDocument: {_document(rec, rng)}\nJSON: "
                     f"{dump_answer(rec, style)}\n")
    return "".join(parts)


def documents(n: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """``n`` (document, expected record) pairs."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        rec = _record(rng)
        out.append((_document(rec, rng), rec))
    return out


def messages(doc: str, shots: int = 6, style: str = "spaced") -> list[dict[str, str]]:
    """Chat messages for one document (the system prompt is shared by every document)."""
    return [{"role": "system", "content": instructions(shots, style)},
            {"role": "user", "content": f"Document: {doc}\nJSON:"}]
