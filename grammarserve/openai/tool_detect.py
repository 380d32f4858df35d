"""Which tool-call format a chat template's model writes: ``--tool-call-parser`` resolved.

``auto`` reads the template for the family's markers (:data:`FINGERPRINTS`, first match wins,
as the template writes past calls); a template without any (SmolLM2's) keeps the built-in
formats: ``EngineConfig.tool_call_format`` for ``required`` and named calls, Hermes for
``auto``. A name of the formats table (or one of vLLM's names, :data:`ALIASES`) forces that
format for every mode; ``mistral`` means the variant the template writes (``[ARGS]``: v11+).
"""

from __future__ import annotations

from grammarserve.errors import InvalidRequestError
from grammarserve.fsm.tool_formats import ALIASES, FORMATS, tool_format

#: ``(markers all in the template, format)``, most specific first.
FINGERPRINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<function=", "<parameter="), "qwen3_coder"),
    (("<|channel|>", "functions."), "harmony"),
    (("<｜tool▁calls▁begin｜>", "```json"), "deepseek_v3"),
    (("<｜tool▁calls▁begin｜>",), "deepseek_v31"),
    (("[TOOL_CALLS]", "[ARGS]"), "mistral_v11"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<tool_call>",), "hermes"),
    (("[func_name1(",), "pythonic"),  # vLLM's llama3.2 pythonic template; tests' own
    (('"parameters": ',), "llama3_json"),
)
#: Every value ``--tool-call-parser`` takes.
PARSER_NAMES = ("auto", *FORMATS, *ALIASES)


def detect_tool_format(template: str | None) -> str | None:
    """The format whose markers ``template`` holds, or None."""
    if not isinstance(template, str):
        return None
    for markers, name in FINGERPRINTS:
        if all(m in template for m in markers):
            return name
    return None


def resolve_tool_parser(name: str, template: str | None) -> str | None:
    """The format of ``--tool-call-parser name`` for a model with chat ``template``: a name of
    the formats table, or None for the built-in behaviour (``auto`` and no markers found)."""
    if name == "auto":
        return detect_tool_format(template)
    if name == "mistral" and isinstance(template, str) and "[ARGS]" in template:
        return "mistral_v11"
    try:
        return tool_format(name).name
    except KeyError:
        raise InvalidRequestError(f"tool_call_parser must be one of {', '.join(PARSER_NAMES)}, "
                                  f"got {name!r}", param="tool_call_parser") from None
