"""What a request's output must match: a JSON schema, regex, grammar, choice, tool calls or a
structural tag.

A :class:`Constraint` travels inside :class:`~grammarserve.sampling_params.SamplingParams`; the
engine compiles it with :class:`grammarserve.fsm.GrammarCompiler` (cached) and enforces it token
by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

ConstraintKind = Literal["json_schema", "regex", "grammar", "choice", "tool_calls",
                         "structural_tag"]


class StructuralFormat(str, Enum):
    """The ``type`` of a format object of a structural tag (xgrammar's names, as vLLM and SGLang
    accept them in ``response_format: {"type": "structural_tag", "format": {...}}``). Which of
    them grammarserve compiles, and why not the others: ``grammarserve.fsm.structural_tag``."""

    CONST_STRING = "const_string"
    JSON_SCHEMA = "json_schema"
    GRAMMAR = "grammar"
    REGEX = "regex"
    ANY_TEXT = "any_text"
    SEQUENCE = "sequence"
    OR = "or"
    OPTIONAL = "optional"
    PLUS = "plus"
    STAR = "star"
    REPEAT = "repeat"
    TAG = "tag"
    TRIGGERED_TAGS = "triggered_tags"
    TAGS_WITH_SEPARATOR = "tags_with_separator"
    DISPATCH = "dispatch"
    TOKEN = "token"
    EXCLUDE_TOKEN = "exclude_token"
    ANY_TOKENS = "any_tokens"
    TOKEN_TRIGGERED_TAGS = "token_triggered_tags"
    TOKEN_DISPATCH = "token_dispatch"
    QWEN_XML_PARAMETER = "qwen_xml_parameter"

#: ``response_format: {"type": "json_object"}``: any JSON object.
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """One output constraint. Build it with the class methods.

    ``spec`` is the schema (dict or JSON text), the regex, the grammar text, the list of choices,
    the list of OpenAI tools, or the structural tag (``{"format": {...}}``, or the legacy
    ``{"structures": [...], "triggers": [...]}``; ``type`` optional), depending on ``kind``.
    """

    kind: ConstraintKind
    spec: Any
    strict: bool = False  # json_schema: OpenAI strict-mode rules
    syntax: str = "lark"  # grammar: "lark" or "ebnf"
    tool_choice: Any = "required"  # tool_calls: "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool = True
    tool_format: str = "hermes"  # tool_calls: a name of grammarserve.fsm.tool_formats.FORMATS
    #: The grammar layer's validated form of this constraint (a ``GrammarSpec``), when the
    #: caller already made it with a compiler of the same options (the server's, for the
    #: engine process): the engine compiles it without running the front end again.
    prepared: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, *, strict: bool = False) -> Constraint:
        return cls("json_schema", schema, strict=strict)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls("json_schema", JSON_OBJECT_SCHEMA)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str, syntax: str = "lark") -> Constraint:
        return cls("grammar", text, syntax=syntax)

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        return cls("choice", list(options))

    @classmethod
    def tool_calls(cls, tools: list[dict[str, Any]], tool_choice: Any = "required", *,
                   parallel: bool = True, tool_format: str = "hermes") -> Constraint:
        return cls("tool_calls", tools, tool_choice=tool_choice, parallel_tool_calls=parallel,
                   tool_format=tool_format)

    @classmethod
    def structural_tag(cls, tag: dict[str, Any] | str) -> Constraint:
        """Free text and tagged structures (``grammarserve.fsm.structural_tag``): the
        ``response_format`` object of type ``structural_tag``, as vLLM and SGLang take it (or
        its JSON text)."""
        return cls("structural_tag", tag)

    @property
    def may_repeat_calls(self) -> bool:
        """A tool-call constraint that allows more than one call (``required`` or ``auto`` with
        parallel calls): the engine's repeated-call stop applies to it."""
        return (self.kind == "tool_calls" and self.parallel_tool_calls
                and self.tool_choice in ("auto", "required")
                and self.tool_format in ("hermes", "json_array"))  # the guard's formats

    def compile_args(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """``(kind, args, kwargs)`` for :meth:`GrammarCompiler.compile_async`."""
        if self.kind == "json_schema":
            return "json_schema", (self.spec,), {"strict": self.strict}
        if self.kind == "grammar":
            return "grammar", (self.spec,), {"syntax": self.syntax}
        if self.kind == "tool_calls":
            return "tool_calls", (self.spec, self.tool_choice), {
                "parallel": self.parallel_tool_calls, "call_format": self.tool_format}
        return self.kind, (self.spec,), {}


@dataclass(frozen=True)
class ReasoningSpan:
    """The free-text reasoning span a reply starts with; the request's constraint (if any)
    applies from its end on (``grammarserve.fsm.reasoning``).

    ``open`` is forced first (the prompt did not open the span; empty: the reply starts inside
    it). The span ends where the model writes ``end`` (on a token boundary), or where
    ``budget`` tokens of it have been written: then ``close`` (which ends with ``end``) is
    forced. ``after`` is forced after ``end``, before the answer. ``strict``: no stop token
    and none of ``banned`` (tool-call markers) inside the span; a constrained reply never
    stops inside it either way.
    """

    end: str
    open: str = ""
    close: str = ""
    after: str = ""
    budget: int | None = None
    strict: bool = False
    banned: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.end:
            raise ValueError("a reasoning span needs its end marker")
        if self.close and not self.close.endswith(self.end):
            raise ValueError(f"the forced close {self.close!r} must end with {self.end!r}")
        if self.budget is not None and (isinstance(self.budget, bool) or self.budget < 0):
            raise ValueError(f"the thinking budget must be an integer >= 0, got {self.budget!r}")
