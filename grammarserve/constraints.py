"""What a request's output must match: a JSON schema, regex, grammar, choice or tool calls.

A :class:`Constraint` travels inside :class:`~grammarserve.sampling_params.SamplingParams`; the
engine compiles it with :class:`grammarserve.fsm.GrammarCompiler` (cached) and enforces it token
by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ConstraintKind = Literal["json_schema", "regex", "grammar", "choice", "tool_calls"]

#: ``response_format: {"type": "json_object"}``: any JSON object.
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """One output constraint. Build it with the class methods.

    ``spec`` is the schema (dict or JSON text), the regex, the grammar text, the list of choices,
    or the list of OpenAI tools, depending on ``kind``.
    """

    kind: ConstraintKind
    spec: Any
    strict: bool = False  # json_schema: OpenAI strict-mode rules
    syntax: str = "lark"  # grammar: "lark" or "ebnf"
    tool_choice: Any = "required"  # tool_calls: "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool = True
    tool_format: str = "hermes"  # tool_calls: "hermes" | "json_array" (grammarserve.fsm.tools)
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

    @property
    def may_repeat_calls(self) -> bool:
        """A tool-call constraint that allows more than one call (``required`` or ``auto`` with
        parallel calls): the engine's repeated-call stop applies to it."""
        return (self.kind == "tool_calls" and self.parallel_tool_calls
                and self.tool_choice in ("auto", "required"))

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
