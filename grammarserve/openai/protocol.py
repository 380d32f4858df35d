"""Request bodies of the OpenAI-compatible routes (pydantic; the OpenAPI document comes from them).

Unknown fields are accepted and ignored (``extra="allow"``), as real clients send many; fields
that would change the output but cannot be honoured are refused in
:mod:`grammarserve.openai.translate`, never dropped silently.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_MESSAGE = ("strings must be valid Unicode: a lone UTF-16 surrogate (a \\ud800-\\udfff "
                      "escape without its pair) cannot be encoded as UTF-8")


def has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (nested lists and dicts, keys included) holds a lone UTF-16
    surrogate, which JSON's ``\\ud800`` escapes can carry but UTF-8 (the tokenizer, the grammar
    compilers, SQLite, the JSON reply) cannot. Request models are checked when they are built.

    NOTE: a loop, not recursion: it runs inside the request's validation, where a value nested
    a few hundred levels deep overflowed Python's recursion limit (issue 20)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item) is not None:
                return True
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


class RequestBody(BaseModel):
    """Base of every request body: unknown fields are accepted, and no string (known or
    unknown field, at any depth) may hold a lone surrogate (a 400 naming the field, not a
    crash further in)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        # nested request models have checked their own fields (and named them)
        if not isinstance(value, BaseModel) and has_lone_surrogate(value):
            raise ValueError(_SURROGATE_MESSAGE)
        return value

    @model_validator(mode="after")
    def _valid_unicode_extra(self) -> RequestBody:
        for key, value in (self.model_extra or {}).items():
            if has_lone_surrogate(key) or has_lone_surrogate(value):
                raise ValueError(f"{key!r}: {_SURROGATE_MESSAGE}")
        return self


class FunctionCall(RequestBody):
    name: str
    arguments: str = ""


class ToolCall(RequestBody):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class CustomCall(RequestBody):
    name: str
    input: str = ""


class CustomToolCall(RequestBody):
    """A past call of a custom tool: its free-text ``input``."""

    id: str = ""
    type: Literal["custom"]
    custom: CustomCall


#: The tags of the function / custom tagged unions below. Pydantic puts a tag into the location
#: of an error inside a member; :func:`grammarserve.openai.errors.validation_error` drops them, so
#: params read ``tools[0].function.parameters`` as before custom tools (hence no field's name).
FUNCTION_TAG, CUSTOM_TAG = "function tool", "custom tool"
UNION_TAGS = frozenset({FUNCTION_TAG, CUSTOM_TAG})


def _tool_type(value: Any) -> str:
    """The tag of a tool, tool call or tool choice: custom for ``"type": "custom"``, else function
    (``type`` may be absent, as before custom tools; a wrong one is the function model's error)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return CUSTOM_TAG if kind == "custom" else FUNCTION_TAG


AnyToolCall = Annotated[Annotated[ToolCall, Tag(FUNCTION_TAG)]
                        | Annotated[CustomToolCall, Tag(CUSTOM_TAG)], Discriminator(_tool_type)]


class ChatMessage(RequestBody):
    """Any role: system/developer/user/assistant/tool (``function`` is the legacy tool role)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[AnyToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    #: An assistant turn's thoughts as replies return them (vLLM's ``reasoning_content`` and
    #: newer ``reasoning``), given to templates that render them (Qwen3's, in tool-call loops).
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(RequestBody):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(RequestBody):
    type: Literal["function"] = "function"
    function: FunctionDef


class CustomGrammar(RequestBody):
    """A custom tool's grammar; its fields are checked by the translation (a 400 naming the
    tool), not here."""

    syntax: str | None = None
    definition: str | None = None


class CustomFormat(RequestBody):
    """``{"type": "text"}`` or ``{"type": "grammar", "grammar": {...}}`` (checked by the
    translation, which names the tool)."""

    type: str
    grammar: CustomGrammar | None = None


class CustomDef(RequestBody):
    name: str
    description: str | None = None
    format: CustomFormat | None = None


class CustomTool(RequestBody):
    """A custom tool: its calls carry free text (``input``), maybe constrained by a grammar."""

    type: Literal["custom"]
    custom: CustomDef


AnyTool = Annotated[Annotated[Tool, Tag(FUNCTION_TAG)] | Annotated[CustomTool, Tag(CUSTOM_TAG)],
                    Discriminator(_tool_type)]


class NamedFunction(RequestBody):
    name: str


class NamedToolChoice(RequestBody):
    type: Literal["function"] = "function"
    function: NamedFunction


class NamedCustomToolChoice(RequestBody):
    type: Literal["custom"]
    custom: NamedFunction


AnyNamedChoice = Annotated[Annotated[NamedToolChoice, Tag(FUNCTION_TAG)]
                           | Annotated[NamedCustomToolChoice, Tag(CUSTOM_TAG)],
                           Discriminator(_tool_type)]


class AllowedTools(RequestBody):
    mode: Literal["auto", "required"]
    tools: list[AnyNamedChoice]


class AllowedToolsChoice(RequestBody):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = (Literal["none", "auto", "required"] | NamedToolChoice | NamedCustomToolChoice
              | AllowedToolsChoice)


class JSONSchemaFormat(RequestBody):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestBody):
    """``text``, ``json_object``, ``json_schema`` or ``structural_tag``; ``json_object`` with a
    top-level ``schema`` is the older instructor / llama.cpp shape, accepted as a (non-strict)
    JSON schema. ``structural_tag`` (vLLM, SGLang): ``format`` (xgrammar's format objects), or
    the legacy ``structures`` and ``triggers``; checked by the grammar layer, which names the
    path of what it refuses."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    format: Any = Field(default=None, description="structural_tag: the format object")
    structures: Any = Field(default=None, description="structural_tag (legacy): "
                            "[{begin, schema, end}]")
    triggers: Any = Field(default=None, description="structural_tag (legacy): the strings "
                          "that start a structure")


class StreamOptions(RequestBody):
    include_usage: bool | None = None


#: ``reasoning_effort``'s values (the OpenAI SDK's ``ReasoningEffort``).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class _Generation(RequestBody):
    """Fields shared by chat and completions (OpenAI sampling plus grammarserve extensions)."""

    model: str
    n: int | None = Field(default=1, ge=1, le=128)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # grammarserve extensions
    regex: str | None = Field(default=None, description="the output must match this regex")
    grammar: str | None = Field(default=None, description="the output must match this Lark grammar")
    choice: list[str] | None = Field(default=None, description="the output is one of these")
    structural_tag: str | dict[str, Any] | None = Field(
        default=None, description="vLLM's older extra field: a structural tag (its JSON text or "
        "object), as response_format of type structural_tag takes it")
    cache_namespace: str | None = Field(
        default=None, description="prefix-cache namespace: requests share cached prompt "
        "prefixes only within one namespace (tenant isolation)")
    top_k: int | None = Field(default=None, ge=0, le=2**63 - 1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(
        default=None, ge=0.01, le=100.0, allow_inf_nan=False,
        description="vLLM's repetition penalty (1 = off): logits of tokens seen in the prompt "
        "or the output are divided by it when positive, multiplied when negative")
    dry_multiplier: float | None = Field(
        default=None, ge=0.0, le=100.0, allow_inf_nan=False,
        description="DRY: a penalty on tokens that extend a repetition inside the reply (0: "
        "off; unset: the server's default for constrained replies)")
    dry_base: float | None = Field(default=None, ge=1.0, le=10.0, allow_inf_nan=False)
    dry_allowed_length: int | None = Field(default=None, ge=1, le=2**31 - 1)
    ignore_eos: bool | None = None


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage]
    tools: list[AnyTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    # reasoning (grammarserve.openai.reasoning; vLLM's and SGLang's names)
    reasoning_effort: ReasoningEffort | None = None
    # NOTE: strict: "10", true and 10.0 are refused (400 naming the field), not read as numbers
    thinking_token_budget: int | None = Field(
        default=None, ge=0, le=2**31 - 1, strict=True,
        description="vLLM's name: reasoning tokens before the span is closed")
    thinking_budget: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True,
                                        description="the same, SGLang's and Qwen's name")
    strict_thinking: bool | None = Field(
        default=None, description="no stop token and no tool-call marker inside the "
        "reasoning span (unset: the server's --strict-thinking)")
    include_reasoning: bool | None = None
    separate_reasoning: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="more arguments for the chat template (enable_thinking, ...)")


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=128)


class TokenizeRequest(RequestBody):
    """Either ``prompt`` (text, tokenized as is) or ``messages`` (rendered with the chat
    template, like a chat completion would be)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]
