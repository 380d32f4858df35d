"""Request bodies of the OpenAI-compatible routes (pydantic; the OpenAPI document comes from them).

Unknown fields are accepted and ignored (``extra="allow"``), as real clients send many; fields
that would change the output but cannot be honoured are refused in
:mod:`grammarserve.server.translate`, never dropped silently.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class FunctionCall(_Body):
    name: str
    arguments: str = ""


class ToolCall(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    """Any role: system/developer/user/assistant/tool (``function`` is the legacy tool role)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(_Body):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice]


class AllowedToolsChoice(_Body):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class JSONSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``text``, ``json_object`` or ``json_schema``; ``json_object`` with a top-level ``schema``
    is the older instructor / llama.cpp shape, accepted as a (non-strict) JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class StreamOptions(_Body):
    include_usage: bool | None = None


class _Generation(_Body):
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
    cache_namespace: str | None = Field(
        default=None, description="prefix-cache namespace: requests share cached prompt "
        "prefixes only within one namespace (tenant isolation)")
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    ignore_eos: bool | None = None


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=128)


class TokenizeRequest(_Body):
    """Either ``prompt`` (text, tokenized as is) or ``messages`` (rendered with the chat
    template, like a chat completion would be)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
