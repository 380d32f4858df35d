"""How deep a request's JSON may nest, checked on its bytes before anything parses them.

Python's JSON parser, pydantic, the request models' validators and the grammar front end all
recurse per level; a body nested a few hundred levels deep gave 500s (``RecursionError``) or
dropped connections (issue 20). So the server (and the batch runners, per line) measure the
depth first, without recursion (:func:`grammarserve.fsm.schema.depth.text_depth`), and refuse deeper
bodies with a 400 that names the limit.
"""

from __future__ import annotations

from grammarserve.errors import InvalidRequestError
from grammarserve.fsm.limits import DEFAULT_MAX_DEPTH
from grammarserve.fsm.schema.depth import text_depth

#: Default deepest nesting of a request body. A schema at the schema limit
#: (:data:`~grammarserve.fsm.limits.DEFAULT_MAX_DEPTH`, 64) sits at most 5 levels down
#: (``tools[i].function.parameters``), and clients' other fields nest less than 10 levels, so
#: 128 refuses no request the grammar layer would take; Python's parser and the validators
#: recurse out near 1,000 levels, far beyond it.
DEFAULT_MAX_JSON_DEPTH = 2 * DEFAULT_MAX_DEPTH


def check_json_depth(raw: bytes | str, limit: int, *, what: str = "the request body",
                     flag: str = "--max-json-depth") -> None:
    """Raise :class:`InvalidRequestError` (400) if the JSON text ``raw`` nests deeper than
    ``limit`` levels (``[[1]]`` is 2)."""
    depth = text_depth(raw)
    if depth > limit:
        raise InvalidRequestError(f"{what} is nested {depth} levels deep; this server accepts "
                                  f"JSON nested at most {limit} levels ({flag})")
