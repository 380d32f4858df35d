"""Chat messages (+ tools) to prompt text, through the model's chat template.

A template that handles ``tools`` itself gets them as ``tools=``; otherwise the tools are described
in a Hermes-style system block that asks for calls in the request's format (a row of
:mod:`grammarserve.fsm.tool_formats`). A template that renders ``tool_calls`` gets the past calls
and results OpenAI-shaped, adapted to what it accepts (:mod:`grammarserve.openai.render_tools`);
otherwise they are written as text in the same format the model is asked (and constrained) to
produce (``<tool_call>`` blocks, one JSON array of ``{"name", "parameters"}`` objects, ...), and
results as ``<tool_response>`` blocks.
Custom tools are described in the system message (name, description, grammar or regex of the
input) and past custom calls written as ``<custom_tool_call name="...">`` blocks; when the reply
is a custom tool's input, the built-in block says so, whatever the template.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grammarserve.errors import InvalidRequestError
from grammarserve.fsm.tool_formats import calls_text as format_calls_text
from grammarserve.fsm.tool_formats import tool_format as format_of
from grammarserve.fsm.tools import END, TRIGGER
from grammarserve.openai.custom_tools import CustomSyntax, CustomToolSpec
from grammarserve.openai.protocol import ChatMessage, CustomToolCall
from grammarserve.openai.render_tools import adapt_history, format_footer

FUNCTIONS_LISTED = ("You are provided with function signatures within <tools></tools> XML tags:\n"
                    "<tools>\n")
TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                + FUNCTIONS_LISTED)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n"
    f"{TRIGGER}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{END}"
)
JSON_ARRAY_FOOTER = (
    "\n</tools>\n\nReturn the function calls as one JSON array of objects, each with the "
    "function name and its parameters:\n"
    "[{\"name\": <function-name>, \"parameters\": <args-json-object>}]"
)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a ``tools`` argument itself."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def content_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """The text of a message ``content`` (string or list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in ("image_url", "input_audio", "file", "image", "audio"):
            raise InvalidRequestError(f"{where}.content[{j}]: content of type {kind!r} is not "
                                      f"supported by this text-only model",
                                      param=f"{where}.content[{j}].type")
        else:
            raise InvalidRequestError(f"{where}.content[{j}] must be {{'type': 'text', 'text': "
                                      f"...}}, got type {kind!r}", param=f"{where}.content[{j}]")
    return "\n".join(texts)


def tools_system_block(tools: list[dict[str, Any]], tool_choice: Any, parallel: bool,
                       tool_format: str = "hermes", customs: Sequence[CustomToolSpec] = (),
                       custom: CustomToolSpec | None = None) -> str:
    """The built-in (Hermes-style) description of ``tools`` and of the call format, and of the
    custom tools ``customs``; with ``custom``, the reply is that custom tool's input."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    if custom is not None:
        listed = (FUNCTIONS_LISTED + lines + "\n</tools>\n\n") if tools else ""
        return "# Tools\n\n" + listed + custom_tools_text(customs, custom)
    rules = []
    if tool_choice == "required":
        rules.append("You must call at least one of these functions.")
    elif isinstance(tool_choice, dict):
        rules.append(f"You must call the function {tool_choice['function']['name']!r}.")
    if not parallel:
        rules.append("Call at most one function.")
    footer = (JSON_ARRAY_FOOTER if tool_format == "json_array" else TOOLS_FOOTER
              if tool_format == "hermes" else format_footer(format_of(tool_format)))
    described = "\n\n" + custom_tools_text(customs, None) if customs else ""
    return (TOOLS_HEADER + lines + footer + described
            + ("\n\n" + " ".join(rules) if rules else ""))


def custom_tools_text(customs: Sequence[CustomToolSpec], custom: CustomToolSpec | None) -> str:
    """The description of custom tools (name, description, and the grammar or regex of the
    input); with ``custom``, the rule that the whole reply is its input."""
    parts = ["Custom tools take free text as their input, not JSON."]
    for c in customs:
        lines = [f"## Custom tool {c.name!r}"]
        if c.description:
            lines.append(c.description)
        if c.syntax is CustomSyntax.LARK:
            lines.append("Its input must match this Lark grammar (from the rule 'start'):\n"
                         f"```lark\n{c.definition.strip()}\n```")
        elif c.syntax is CustomSyntax.REGEX:
            lines.append(f"Its input must match this regular expression:\n```\n{c.definition}\n```")
        else:
            lines.append("Its input is free text.")
        parts.append("\n".join(lines))
    if custom is not None:
        parts.append(f"Call the custom tool {custom.name!r} now: your whole reply is its input, "
                     "with nothing before or after it.")
    return "\n\n".join(parts)


def custom_call_text(name: str, input_: str) -> str:
    """A past custom tool call as prompt text."""
    return f"<custom_tool_call name={json.dumps(name)}>\n{input_}\n</custom_tool_call>"


def _call_args(call: dict[str, Any]) -> tuple[str, Any]:
    fn = call["function"]
    try:
        args: Any = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError:
        args = fn.get("arguments")
    return fn["name"], args


def calls_text(calls: list[dict[str, Any]], tool_format: str = "hermes") -> str:
    """Past OpenAI ``tool_calls`` as the model writes them in ``tool_format``."""
    return format_calls_text(format_of(tool_format), map(_call_args, calls))


def openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts with text content; ``developer`` becomes ``system``, ``function`` ``tool``."""
    if not messages:
        raise InvalidRequestError("'messages' must contain at least one message", param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        msg: dict[str, Any] = {"role": role, "content": content_text(m.content, where)}
        if m.role == "assistant" and m.tool_calls:
            functions = [c for c in m.tool_calls if not isinstance(c, CustomToolCall)]
            customs = [custom_call_text(c.custom.name, c.custom.input) for c in m.tool_calls
                       if isinstance(c, CustomToolCall)]
            if customs:  # as text: templates and the call formats know function calls only
                msg["content"] = "\n".join([msg["content"], *customs] if msg["content"]
                                           else customs)
            if functions:
                msg["tool_calls"] = [c.model_dump(include={"id", "type", "function"})
                                     for c in functions]
        elif m.role == "assistant" and m.content is None:
            if m.refusal is None:
                raise InvalidRequestError(f"{where}: an assistant message needs 'content' or "
                                          "'tool_calls'", param=f"{where}.content")
            msg["content"] = m.refusal
        thoughts = m.reasoning_content or m.reasoning
        if m.role == "assistant" and thoughts:
            msg["reasoning_content"] = thoughts
        if role == "tool":
            msg["tool_call_id"] = m.tool_call_id or ""
            if m.name:
                msg["name"] = m.name
        out.append(msg)
    return out


def hermes_messages(messages: list[dict[str, Any]], tools_block: str | None,
                    tool_format: str = "hermes") -> list[dict[str, Any]]:
    """Rewrite tool calls and results as text for a template without tool support, and put the
    tools description into the system message."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = calls_text(m["tool_calls"], tool_format)
            text = f"{m['content']}\n{calls}" if m["content"] else calls
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools_block is not None:
        out = with_system(out, tools_block)
    return [{k: v for k, v in m.items() if not k.startswith("_")} for m in out]


def with_system(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """``block`` appended to the system message (one is added first if there is none)."""
    out = list(messages)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def render_chat(tokenizer: Any, messages: list[ChatMessage], *,
                tools: list[dict[str, Any]] | None = None, tool_choice: Any = "auto",
                parallel: bool = True, add_generation_prompt: bool = True,
                tool_format: str = "hermes", customs: Sequence[CustomToolSpec] = (),
                custom: CustomToolSpec | None = None,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """Prompt text for ``messages``; ``tools`` (function tools, OpenAI format) are shown to the
    model unless None, with the call format ``tool_format`` (``"hermes"`` or ``"json_array"``),
    and the custom tools ``customs``; with ``custom``, the reply is that custom tool's input
    (described in the built-in block, as a template's tools block asks for function calls).
    ``template_kwargs`` (``chat_template_kwargs``: ``enable_thinking``, ...) go to the template."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError("this model has no chat template; use /v1/completions with a "
                                  "formatted prompt", param="messages")
    msgs = openai_messages(messages)
    template = str(tokenizer.chat_template)
    own_tools = template_supports_tools(tokenizer) and custom is None and bool(tools)
    extra = dict(template_kwargs or {})
    text = _render(tokenizer, msgs, template, tools, tool_choice, parallel,
                   add_generation_prompt, tool_format, customs, custom, own_tools, extra)
    if text is None:  # NOTE: the template refused the tools: some need a description
        text = _render(tokenizer, msgs, template, [described(t) for t in tools or []],
                       tool_choice, parallel, add_generation_prompt, tool_format, customs,
                       custom, own_tools, extra)
    if text is None:  # NOTE: a template that cannot render the tools at all
        text = _render(tokenizer, msgs, template, tools, tool_choice, parallel,
                       add_generation_prompt, tool_format, customs, custom, False, extra)
    if isinstance(text, Exception) or text is None:
        raise InvalidRequestError(f"the chat template cannot render these messages: {text}",
                                  param="messages")
    return text


def _render(tokenizer: Any, msgs: list[dict[str, Any]], template: str,
            tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool,
            add_generation_prompt: bool, tool_format: str, customs: Sequence[CustomToolSpec],
            custom: CustomToolSpec | None, own_tools: bool,
            template_kwargs: dict[str, Any]) -> str | Exception | None:
    """The prompt, the template describing the tools (``own_tools``) or the built-in block
    doing it, ``template_kwargs`` passed to the template; None when the template failed on its
    tools, the error when it failed else."""
    kwargs: dict[str, Any] = dict(template_kwargs)
    block: str | None = None
    if own_tools:
        kwargs["tools"] = tools
        if customs:
            block = custom_tools_text(customs, None)
    elif tools or customs:
        block = tools_system_block(tools or [], tool_choice, parallel, tool_format, customs,
                                   custom)
    if "tool_calls" in template and custom is None:  # NOTE: the template writes past calls
        msgs = adapt_history(msgs, template)
        if block is not None:
            msgs = with_system(msgs, block)
    else:
        msgs = hermes_messages(msgs, block, tool_format)
    try:
        return str(tokenizer.apply_chat_template(msgs, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt,
                                                 **kwargs))
    except Exception as e:  # noqa: BLE001 - jinja raises for conversations it refuses
        if own_tools and _renders(tokenizer, msgs, add_generation_prompt):
            return None  # NOTE: the conversation renders without the tools: they were refused
        return e


def _renders(tokenizer: Any, msgs: list[dict[str, Any]], add_generation_prompt: bool) -> bool:
    try:
        tokenizer.apply_chat_template(msgs, tokenize=False,
                                      add_generation_prompt=add_generation_prompt)
    except Exception:  # noqa: BLE001 - any template error
        return False
    return True


def described(tool: dict[str, Any]) -> dict[str, Any]:
    """``tool`` with a ``description`` (empty if it has none: some templates need one)."""
    fn = tool.get("function")
    if isinstance(fn, dict) and "description" not in fn:
        return {**tool, "function": {"description": "", **fn}}
    return tool
