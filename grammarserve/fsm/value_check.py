"""``ValueCheck``: a constraint the grammar does not hold, checked when a value of the generated
document closes (see ``schema/checks/split.py`` for where they come from and ``checked_matcher.py`` for how
they run).

A check names an instance *location*: a pattern of steps from the document root, one per
container level. Each step is one of

- ``("key", name)``: the member ``name`` of an object;
- ``("other", names)``: any member whose key is not one of ``names`` (``additionalProperties``);
- ``("index", i)``: item ``i`` of an array (``prefixItems``);
- ``("from", n)``: any item at index ``n`` or later (``items``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Step = tuple[str, Any]
CheckKind = Literal["schema", "unique", "contains"]


@dataclass(frozen=True)
class ValueCheck:
    """One run-time check of the values at ``location``.

    Attributes
    ----------
    location : tuple[Step, ...]
        Where the checked values are in the document (see the module docstring).
    kind : {"schema", "unique", "contains"}
        ``schema``: the closed value must validate against ``schema``. ``unique``: the value is
        an array whose items must be distinct; each item is compared with the earlier ones as it
        closes. ``contains``: the value is an array that ``schema`` (``contains`` with
        ``minContains``/``maxContains``) checks when it closes; ``item_schema`` says which items
        count, so a failure can be retried at the right place (the close, or the item too many).
    keyword : str
        The keyword the grammar could not hold (for messages and counts).
    schema_path : str
        The keyword's JSON path in the schema (for messages).
    schema : str
        Canonical JSON of the (Draft 2020-12) schema the closed value must satisfy; "" for
        ``unique``.
    item_schema : str
        For ``contains``: canonical JSON of the schema an item must satisfy to count.
    """

    location: tuple[Step, ...]
    kind: CheckKind
    keyword: str
    schema_path: str
    schema: str = ""
    item_schema: str = ""

    def matches(self, path: tuple[str | int, ...]) -> bool:
        """True if the value at instance ``path`` (keys and indices from the root) is checked."""
        if len(path) != len(self.location):
            return False
        return all(step_matches(step, part) for step, part in zip(self.location, path))

    def key(self) -> list[Any]:
        """A JSON-able form (part of the grammar's cache key)."""
        return [[list(s) if s[0] != "other" else ["other", sorted(s[1])] for s in self.location],
                self.kind, self.keyword, self.schema_path, self.schema, self.item_schema]

    def where(self) -> str:
        """The location as a JSON-pointer-like pattern (``/tags/*``) for messages."""
        parts = []
        for kind, arg in self.location:
            parts.append({"key": str(arg), "index": str(arg)}.get(kind, "*"))
        return "/" + "/".join(parts) if parts else "/"


def step_matches(step: Step, part: str | int) -> bool:
    """Whether one path element (an object key or an array index) matches ``step``."""
    kind, arg = step
    if kind == "key":
        return isinstance(part, str) and part == arg
    if kind == "other":
        return isinstance(part, str) and part not in arg
    if kind == "index":
        return isinstance(part, int) and part == arg
    return isinstance(part, int) and part >= arg  # "from"


def identity(value: Any) -> str:
    """One key per JSON value up to JSON Schema equality (``1`` and ``1.0`` share one)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"n:{value!r}" if isinstance(value, int) or not value.is_integer() \
            else f"n:{int(value)!r}"
    if isinstance(value, list):
        return "[" + ",".join(identity(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{identity(v)}"
                              for k, v in sorted(value.items())) + "}"
    return repr(value)
