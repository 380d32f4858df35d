"""What a request's output must match: a JSON schema, regex, grammar, choice, tool calls or a
structural tag.

A :class:`Constraint` travels inside :class:`~grammarserve.sampling_params.SamplingParams`; the
engine compiles it with :class:`grammarserve.fsm.GrammarCompiler` (cached) and enforces it token
by token.

The kinds are defined once, here, below every layer that reads them: :class:`ConstraintKind`
(what a constraint is) and :class:`GrammarSyntax` (how a grammar is written); the grammar
layer's kind of a compiled spec is one of them (:data:`SpecKind`: a grammar's is its syntax).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeAlias


class ConstraintKind(str, Enum):
    """What a :class:`Constraint`'s ``spec`` is (the value is its name in the compiler's API,
    ``GrammarCompiler.compile_async``)."""

    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    GRAMMAR = "grammar"
    CHOICE = "choice"
    TOOL_CALLS = "tool_calls"
    STRUCTURAL_TAG = "structural_tag"

    def __str__(self) -> str:
        return self.value


class GrammarSyntax(str, Enum):
    """How a ``grammar`` constraint is written: Lark, or EBNF (GBNF)."""

    LARK = "lark"
    EBNF = "ebnf"

    def __str__(self) -> str:
        return self.value


#: The kind of the grammar layer's validated spec (``GrammarSpec.kind``, what a backend
#: compiles): the constraint's kind, except that a grammar's is its syntax.
SpecKind: TypeAlias = ConstraintKind | GrammarSyntax


class PreparedSpec(Protocol):
    """The grammar layer's validated form of a constraint, :class:`grammarserve.fsm.GrammarSpec`
    (typed by what it offers, so this module imports nothing above it): what the engine
    compiles without running the front end again (``GrammarCompiler.compile_prepared_async``
    takes only a ``GrammarSpec``)."""

    @property
    def kind(self) -> SpecKind: ...

    @property
    def source(self) -> str: ...

    def key(self, fingerprint: str, backend: str) -> str: ...


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
    syntax: GrammarSyntax = GrammarSyntax.LARK  # grammar
    tool_choice: Any = "required"  # tool_calls: "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool = True
    tool_format: str = "hermes"  # tool_calls: a name of grammarserve.fsm.tool_formats.FORMATS
    #: The grammar layer's validated form of this constraint (a ``GrammarSpec``), when the
    #: caller already made it with a compiler of the same options (the server's, for the
    #: engine process): the engine compiles it without running the front end again.
    prepared: PreparedSpec | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ConstraintKind):
            raise TypeError(f"a Constraint's kind is a ConstraintKind, got {self.kind!r} (build "
                            "it with Constraint.json_schema(...), .regex(...), .grammar(...), ...)")
        if not isinstance(self.syntax, GrammarSyntax):
            raise TypeError(f"a Constraint's syntax is a GrammarSyntax, got {self.syntax!r}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, *, strict: bool = False) -> Constraint:
        return cls(ConstraintKind.JSON_SCHEMA, schema, strict=strict)

    @classmethod
    def json_object(cls) -> Constraint:
        return cls(ConstraintKind.JSON_SCHEMA, JSON_OBJECT_SCHEMA)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def grammar(cls, text: str, syntax: GrammarSyntax | str = GrammarSyntax.LARK) -> Constraint:
        """A context-free grammar in ``syntax`` (``"lark"`` or ``"ebnf"``)."""
        try:
            form = GrammarSyntax(syntax)
        except ValueError:
            raise ValueError(f"grammar syntax must be 'lark' or 'ebnf', got {syntax!r}") from None
        return cls(ConstraintKind.GRAMMAR, text, syntax=form)

    @classmethod
    def choice(cls, options: Sequence[str]) -> Constraint:
        return cls(ConstraintKind.CHOICE, list(options))

    @classmethod
    def tool_calls(cls, tools: list[dict[str, Any]], tool_choice: Any = "required", *,
                   parallel: bool = True, tool_format: str = "hermes") -> Constraint:
        return cls(ConstraintKind.TOOL_CALLS, tools, tool_choice=tool_choice,
                   parallel_tool_calls=parallel, tool_format=tool_format)

    @classmethod
    def structural_tag(cls, tag: dict[str, Any] | str) -> Constraint:
        """Free text and tagged structures (``grammarserve.fsm.structural_tag``): the
        ``response_format`` object of type ``structural_tag``, as vLLM and SGLang take it (or
        its JSON text)."""
        return cls(ConstraintKind.STRUCTURAL_TAG, tag)

    @property
    def may_repeat_calls(self) -> bool:
        """A tool-call constraint that allows more than one call (``required`` or ``auto`` with
        parallel calls): the engine's repeated-call stop applies to it."""
        return (self.kind is ConstraintKind.TOOL_CALLS and self.parallel_tool_calls
                and self.tool_choice in ("auto", "required")
                and self.tool_format in ("hermes", "json_array"))  # the guard's formats

    def compile_args(self) -> tuple[ConstraintKind, tuple[Any, ...], dict[str, Any]]:
        """``(kind, args, kwargs)`` for :meth:`GrammarCompiler.compile_async`."""
        if self.kind is ConstraintKind.JSON_SCHEMA:
            return self.kind, (self.spec,), {"strict": self.strict}
        if self.kind is ConstraintKind.GRAMMAR:
            return self.kind, (self.spec,), {"syntax": self.syntax}
        if self.kind is ConstraintKind.TOOL_CALLS:
            return self.kind, (self.spec, self.tool_choice), {
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
