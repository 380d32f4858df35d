"""``POST /v1/responses`` requests: the body, and its translation to a chat request.

The Responses API is served statelessly (``store`` is accepted and ignored: nothing is kept, so
``previous_response_id`` and ``conversation`` are refused with a 400 naming them). A request is
translated to a :class:`ChatCompletionRequest` and prepared by :func:`prepare_chat`, so it gets
the same checks, constraint and tool-call handling as chat; errors name the Responses parameter
(``text.format``, ``input``, ``max_output_tokens``, ``tools[0].parameters``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from grammarserve.errors import InvalidRequestError
from grammarserve.openai.bodies import new_id
from grammarserve.openai.context import ModelContext
from grammarserve.openai.errors import validation_error
from grammarserve.openai.prepare import Prepared, prepare_chat
from grammarserve.openai.protocol import ChatCompletionRequest, ReasoningEffort, RequestBody


class ResponsesFunctionTool(RequestBody):
    """A function tool, flat (``{"type": "function", "name", "parameters", ...}``)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesCustomFormat(RequestBody):
    """A custom tool's ``format``: ``{"type": "text"}`` or ``{"type": "grammar", "syntax",
    "definition"}`` (flat; checked by the chat translation, which names the tool)."""

    type: str
    syntax: str | None = None
    definition: str | None = None


class ResponsesCustomTool(RequestBody):
    """A custom tool, flat (``{"type": "custom", "name", "description", "format"}``)."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: ResponsesCustomFormat | None = None


ResponsesTool = Annotated[ResponsesFunctionTool | ResponsesCustomTool, Field(discriminator="type")]


class ResponsesNamedTool(RequestBody):
    type: Literal["function"]
    name: str


class ResponsesNamedCustomTool(RequestBody):
    type: Literal["custom"]
    name: str


ResponsesNamed = Annotated[ResponsesNamedTool | ResponsesNamedCustomTool,
                           Field(discriminator="type")]


class ResponsesAllowedTools(RequestBody):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[ResponsesNamed]


class ResponsesTextFormat(RequestBody):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (flat: name, schema,
    strict)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponsesText(RequestBody):
    format: ResponsesTextFormat | None = None


class ResponsesReasoning(RequestBody):
    """``reasoning``: its ``effort`` becomes the chat ``reasoning_effort`` (a thinking budget,
    ``grammarserve.openai.reasoning``); ``summary`` is accepted (no summaries are written: the
    reasoning item carries the span's text)."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(RequestBody):
    """The body of ``POST /v1/responses`` (the fields grammarserve honours; unknown fields are
    accepted and ignored, stateful ones refused)."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    text: ResponsesText | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: (Literal["none", "auto", "required"] | ResponsesNamedTool
                  | ResponsesNamedCustomTool | ResponsesAllowedTools | None) = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool | None = False
    store: bool | None = None  # accepted; nothing is stored
    previous_response_id: str | None = None  # refused: the server keeps no state
    metadata: dict[str, str] | None = None
    user: str | None = None
    # grammarserve extensions, as in chat
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    cache_namespace: str | None = None
    reasoning: ResponsesReasoning | None = None
    # reasoning extensions, as in chat (vLLM's and SGLang's names)
    thinking_token_budget: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True)
    thinking_budget: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True)
    strict_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


#: Fields of other routes (or stateful ones) that would change the reply; refused with a pointer.
_REFUSED = {
    "conversation": "conversations are not supported (the server is stateless); send the whole "
                    "conversation in 'input'",
    "response_format": "use 'text.format' on /v1/responses",
    "messages": "use 'input' on /v1/responses",
    "max_tokens": "use 'max_output_tokens' on /v1/responses",
    "max_completion_tokens": "use 'max_output_tokens' on /v1/responses",
    "prompt": "prompt templates are not supported; send 'instructions' and 'input'",
    "top_logprobs": "logprobs are not supported on /v1/responses; use /v1/chat/completions",
}

#: Chat parameter prefixes as the Responses parameters they came from (errors name these).
_PARAMS = [
    (re.compile(r"^response_format(\.json_schema)?(\.schema)?"), "text.format"),
    (re.compile(r"^messages"), "input"),
    (re.compile(r"^max_completion_tokens"), "max_output_tokens"),
    (re.compile(r"^reasoning_effort"), "reasoning.effort"),
    (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
    (re.compile(r"^(tools\[\d+\])\.custom\.format\.grammar"), r"\1.format"),
    (re.compile(r"^(tools\[\d+\])\.custom"), r"\1"),
    (re.compile(r"^tool_choice\.allowed_tools"), "tool_choice"),
    (re.compile(r"^tool_choice\.(function|custom)"), "tool_choice"),
]


def _param(param: str | None) -> str | None:
    if param is None:
        return None
    for pattern, repl in _PARAMS:
        param = pattern.sub(repl, param, count=1)
    return param


def check_stateless(req: ResponsesRequest) -> None:
    """Refuse what needs server-side state or belongs to another route."""
    if req.previous_response_id is not None:
        raise InvalidRequestError(
            "previous_response_id is not supported: grammarserve keeps no responses (it is "
            "stateless, as with store=false); send the whole conversation in 'input'",
            param="previous_response_id")
    extra = req.model_extra or {}
    for key, hint in _REFUSED.items():
        if extra.get(key) is not None:
            raise InvalidRequestError(f"'{key}' is not supported on /v1/responses: {hint}",
                                      param=key)
    if extra.get("background"):
        raise InvalidRequestError("background responses are not supported (the server keeps "
                                  "no state)", param="background")


def _text_of(content: Any, where: str) -> str:
    """The text of an input item's ``content`` (a string or text parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content must be a string or a list of parts",
                                  param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise InvalidRequestError(f"{where}.content[{j}]: content of type {kind!r} is not "
                                      "supported by this text-only model",
                                      param=f"{where}.content[{j}].type")
        else:
            raise InvalidRequestError(f"{where}.content[{j}] must be {{'type': 'input_text', "
                                      f"'text': ...}}, got type {kind!r}",
                                      param=f"{where}.content[{j}]")
    return "\n".join(texts)


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages (consecutive ``function_call`` /
    ``custom_tool_call`` items become one assistant message with parallel ``tool_calls``)."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"{where}.role must be user, system, developer or "
                                          f"assistant, got {role!r}", param=f"{where}.role")
            messages.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind in ("function_call", "custom_tool_call"):
            call = _past_call(item)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _text_of(output, where) if output is not None else ""})
        else:
            raise InvalidRequestError(f"{where}: input items of type {kind!r} are not supported "
                                      "(message, function_call, function_call_output, "
                                      "custom_tool_call and custom_tool_call_output are)",
                                      param=f"{where}.type")
    return messages


def _past_call(item: dict[str, Any]) -> dict[str, Any]:
    """A ``function_call`` / ``custom_tool_call`` input item as a chat tool call."""
    call_id = str(item.get("call_id") or "")
    if item.get("type") == "custom_tool_call":
        return {"id": call_id, "type": "custom",
                "custom": {"name": item.get("name"), "input": item.get("input")}}
    return {"id": call_id, "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")}}


def _chat_tool(tool: ResponsesFunctionTool | ResponsesCustomTool) -> dict[str, Any]:
    """A Responses tool (flat) as a chat tool."""
    if isinstance(tool, ResponsesFunctionTool):
        return {"type": "function", "function": tool.model_dump(exclude={"type"},
                                                                exclude_none=True)}
    custom: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        custom["description"] = tool.description
    fmt = tool.format
    if fmt is not None:
        custom["format"] = {"type": fmt.type} if fmt.type != "grammar" else {
            "type": "grammar", "grammar": {"syntax": fmt.syntax, "definition": fmt.definition}}
    return {"type": "custom", "custom": custom}


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.name is None:
        raise InvalidRequestError("text.format of type 'json_schema' needs a 'name'",
                                  param="text.format.name")
    spec: dict[str, Any] = {"name": fmt.name, "strict": fmt.strict}
    if fmt.schema_ is not None:
        spec["schema"] = fmt.schema_
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if isinstance(choice, (ResponsesNamedTool, ResponsesNamedCustomTool)):
        return _named(choice)
    if isinstance(choice, ResponsesAllowedTools):
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": choice.mode, "tools": [_named(t) for t in choice.tools]}}
    return choice


def _named(choice: ResponsesNamedTool | ResponsesNamedCustomTool) -> dict[str, Any]:
    return {"type": choice.type, choice.type: {"name": choice.name}}


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request a Responses request means."""
    body: dict[str, Any] = {
        "model": req.model, "messages": input_messages(req),
        "response_format": _response_format(req),
        "tool_choice": _tool_choice(req), "parallel_tool_calls": req.parallel_tool_calls,
        "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature,
        "top_p": req.top_p, "user": req.user, "seed": req.seed,
        "cache_namespace": req.cache_namespace, "stream": bool(req.stream),
        "reasoning_effort": req.reasoning.effort if req.reasoning is not None else None,
        "thinking_token_budget": req.thinking_token_budget,
        "thinking_budget": req.thinking_budget, "strict_thinking": req.strict_thinking,
        "chat_template_kwargs": req.chat_template_kwargs}
    if req.tools is not None:
        body["tools"] = [_chat_tool(t) for t in req.tools]
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def prepare_response(ctx: ModelContext, req: ResponsesRequest) -> Prepared:
    """Validate and translate a Responses request (one choice; its id is ``resp_...``)."""
    try:
        check_stateless(req)
        prep = prepare_chat(ctx, chat_request(req))
    except InvalidRequestError as e:
        raise InvalidRequestError(str(e), param=_param(e.param), kind=e.kind) from None
    return dataclasses.replace(prep, id=new_id("resp", sep="_"), rename=_param, source=req)
