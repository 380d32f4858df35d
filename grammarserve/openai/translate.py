"""OpenAI request bodies to engine requests: prompt, :class:`SamplingParams` and
:class:`Constraint`. Every client mistake raises :class:`InvalidRequestError` naming the param."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grammarserve.constraints import Constraint, ConstraintKind, GrammarSyntax
from grammarserve.engine.validate import check_token_ids
from grammarserve.errors import GrammarError, InvalidRequestError
from grammarserve.openai.custom_tools import (
    CustomInputParser,
    CustomSyntax,
    CustomToolSpec,
    custom_specs,
)
from grammarserve.openai.protocol import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    CompletionRequest,
    NamedCustomToolChoice,
    NamedToolChoice,
    Tool,
    _Generation,
)
from grammarserve.openai.structured_outputs import FIELD as SO_FIELD
from grammarserve.openai.structured_outputs import structured_outputs_constraint
from grammarserve.openai.toolparse import CallParser, ParsedCall
from grammarserve.openai.toolparse_array import make_parser, parse_with

#: Fields other servers use for constraints; refused with a pointer instead of ignored.
_FOREIGN_CONSTRAINTS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                        "guided_decoding_backend", "ebnf", "json_schema",
                        "functions", "function_call")
_MAX_STOP = 16


@dataclass(frozen=True)
class ToolsPlan:
    """Tools shown to the model and how their calls are constrained and parsed."""

    tools: list[dict[str, Any]]  # the function tools (OpenAI format)
    choice: Any  # "auto" | "required" | {"type": "function" | "custom", ...}
    parallel: bool
    format: str = "hermes"  # how function calls are written (a name of the formats table)
    customs: tuple[CustomToolSpec, ...] = ()  # the custom tools (shown to the model)
    #: The custom tool the whole reply is the input of (``tool_choice`` names it), else None.
    custom: CustomToolSpec | None = None

    def parser(self) -> CallParser:
        """A new incremental parser of a reply into content and calls."""
        if self.custom is not None:
            return CustomInputParser(self.custom.name)
        return make_parser(self.format, {t["function"]["name"]: t["function"].get("parameters")
                                         or {} for t in self.tools})

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """``(content or None, calls)`` of a complete reply."""
        return parse_with(self.parser(), text)


@dataclass(frozen=True)
class ConstraintPlan:
    """The request's constraint and where it came from (``param`` of errors)."""

    constraint: Constraint
    param: str
    label: str = ""  # response_format name, for OpenAI-style schema messages


def check_common(req: _Generation, *, max_n: int) -> None:
    """Refusals shared by chat and completions."""
    extra = req.model_extra or {}
    for key in _FOREIGN_CONSTRAINTS:
        if key in extra and extra[key] is not None:
            hint = ("use 'tools' / 'tool_choice'" if key.startswith("function") else
                    "use response_format, or the 'regex', 'grammar' (Lark) or 'choice' fields")
            raise InvalidRequestError(f"'{key}' is not supported by grammarserve; {hint}",
                                      param=key)
    if req.n is not None and req.n > max_n:
        raise InvalidRequestError(f"n must be <= {max_n} on this server, got {req.n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequestError("stream_options is only allowed when 'stream' is true",
                                  param="stream_options")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > _MAX_STOP or any(not s for s in stops):
        raise InvalidRequestError(f"stop must be at most {_MAX_STOP} non-empty strings",
                                  param="stop")


def _format_constraint(req: _Generation) -> ConstraintPlan | None:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "structural_tag":
        # NOTE: as sent (no dump: that would drop the nulls inside schemas); other fields,
        # ``json_schema`` or a misspelt one, are refused by the grammar layer, naming them
        tag: dict[str, Any] = {"type": rf.type, **{k: v for k, v in (
            ("format", rf.format), ("structures", rf.structures), ("triggers", rf.triggers),
            ("json_schema", rf.json_schema and rf.json_schema.model_dump(by_alias=True)),
            ("schema", rf.schema_)) if v is not None},
            **(rf.model_extra or {})}
        return ConstraintPlan(Constraint.structural_tag(tag), "response_format")
    if rf.type == "json_object":
        if rf.schema_ is not None:  # older instructor / llama.cpp shape
            return ConstraintPlan(Constraint.json_schema(rf.schema_), "response_format.schema")
        return ConstraintPlan(Constraint.json_object(), "response_format")
    js = rf.json_schema
    if js is None:
        raise InvalidRequestError("response_format of type 'json_schema' needs a 'json_schema' "
                                  "object", param="response_format.json_schema")
    if not js.name or len(js.name) > 64 or not all(c.isalnum() or c in "_-" for c in js.name):
        raise InvalidRequestError("response_format.json_schema.name must match "
                                  "^[a-zA-Z0-9_-]{1,64}$", param="response_format.json_schema.name")
    schema: dict[str, Any] = js.schema_ if js.schema_ is not None else {"type": "object"}
    return ConstraintPlan(Constraint.json_schema(schema, strict=bool(js.strict)),
                          "response_format", js.name)


def constraint_plan(req: _Generation, tools: ToolsPlan | None) -> ConstraintPlan | None:
    """The one constraint of a request (response_format, regex, grammar, choice or tools)."""
    found: list[ConstraintPlan] = []
    fmt = _format_constraint(req)
    if fmt is not None:
        found.append(fmt)
    if req.regex is not None:
        found.append(ConstraintPlan(Constraint.regex(req.regex), "regex"))
    if req.grammar is not None:
        found.append(ConstraintPlan(Constraint.grammar(req.grammar), "grammar"))
    if req.choice is not None:
        found.append(ConstraintPlan(Constraint.choice(req.choice), "choice"))
    if req.structural_tag is not None:
        found.append(ConstraintPlan(Constraint.structural_tag(req.structural_tag),
                                    "structural_tag"))
    vllm = structured_outputs_constraint((req.model_extra or {}).get(SO_FIELD))
    if vllm is not None:
        found.append(ConstraintPlan(*vllm))
    if len(found) > 1:
        raise InvalidRequestError("use only one of response_format (json or structural_tag), "
                                  "'regex', 'grammar', 'choice', 'structural_tag' and "
                                  "'structured_outputs'",
                                  param=found[1].param)
    if tools is None:
        return found[0] if found else None
    if tools.custom is not None:
        if found:
            raise InvalidRequestError(f"'{found[0].param}' cannot be combined with a call of the "
                                      f"custom tool {tools.custom.name!r}: the reply is its input, "
                                      "constrained by its format", param=found[0].param)
        return custom_constraint(tools.custom)
    if found and tools.choice == "auto":
        raise InvalidRequestError(f"'{found[0].param}' cannot be combined with tools and "
                                  "tool_choice 'auto'; use tool_choice 'required' or 'none'",
                                  param=found[0].param)
    return ConstraintPlan(Constraint.tool_calls(tools.tools, tools.choice, parallel=tools.parallel,
                                                tool_format=tools.format), "tools")


def custom_constraint(tool: CustomToolSpec) -> ConstraintPlan | None:
    """The constraint of a custom tool's input (None for free text); ``label``: its name."""
    if tool.syntax is CustomSyntax.LARK:
        return ConstraintPlan(Constraint.grammar(tool.definition, GrammarSyntax.LARK), tool.param,
                              tool.name)
    if tool.syntax is CustomSyntax.REGEX:
        return ConstraintPlan(Constraint.regex(tool.definition), tool.param, tool.name)
    return None


def tools_plan(req: ChatCompletionRequest, tool_format: str = "hermes",
               family: str | None = None) -> ToolsPlan | None:
    """None when no tool may be called (no tools, or tool_choice 'none'). ``family`` is the
    model family's format, for every mode (``ModelContext.tool_call_parser``); without it
    ``tool_format`` is the server's format for ``required`` and named calls, and ``auto``
    uses ``hermes``."""
    auto_format = family or "hermes"
    tool_format = family or tool_format
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise InvalidRequestError("tool_choice is only allowed when 'tools' are given",
                                      param="tool_choice")
        return None
    tools = [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools
             if isinstance(t, Tool)]
    names = [t["function"]["name"] for t in tools]
    customs = custom_specs(req.tools, names)
    if choice == "none":
        return None
    parallel = req.parallel_tool_calls is not False
    if choice is None:
        choice = "auto"
    if isinstance(choice, NamedCustomToolChoice):
        return _custom_plan(tools, customs, choice.custom.name, "tool_choice")
    if isinstance(choice, AllowedToolsChoice):
        mode = choice.allowed_tools.mode
        wanted = [c.custom.name if isinstance(c, NamedCustomToolChoice) else c.function.name
                  for c in choice.allowed_tools.tools]
        param = "tool_choice.allowed_tools.tools"
        _check_names(wanted, names + [c.name for c in customs], param, "tool")
        allowed = [c for c in customs if c.name in wanted]
        if allowed and mode == "required" and len(wanted) == 1:
            return _custom_plan(tools, customs, allowed[0].name, param)
        if allowed:
            _refuse_custom(allowed, f"allowed_tools in mode {mode!r} with {len(wanted)} tools")
        tools = [t for t in tools if t["function"]["name"] in wanted]
        return ToolsPlan(tools, mode, parallel, auto_format if mode == "auto" else tool_format)
    if isinstance(choice, NamedToolChoice):
        _check_names([choice.function.name], names, "tool_choice")
        return ToolsPlan(tools, {"type": "function", "function": {"name": choice.function.name}},
                         False, tool_format, customs)
    if customs:
        if choice == "required" and not tools and len(customs) == 1:
            return _custom_plan(tools, customs, customs[0].name, "tool_choice")
        _refuse_custom(customs, "'required' with several tools" if choice == "required" else
                       "'auto'" + (" (the default)" if req.tool_choice is None else ""))
    return ToolsPlan(tools, choice, parallel, auto_format if choice == "auto" else tool_format)


def _custom_plan(tools: list[dict[str, Any]], customs: tuple[CustomToolSpec, ...], name: str,
                 param: str) -> ToolsPlan:
    """The plan of a reply that is the input of the custom tool ``name``."""
    tool = next((c for c in customs if c.name == name), None)
    if tool is None:
        listed = ", ".join(c.name for c in customs) or "none"
        raise InvalidRequestError(f"tool_choice names the custom tool {name!r}, which is not a "
                                  f"custom tool in 'tools' (custom tools: {listed})", param=param)
    return ToolsPlan(tools, {"type": "custom", "custom": {"name": name}}, False, "hermes",
                     customs, tool)


def _refuse_custom(customs: Sequence[CustomToolSpec], what: str) -> None:
    """A custom tool the model would have to choose among others: refused, not dropped."""
    names = ", ".join(repr(c.name) for c in customs)
    raise InvalidRequestError(
        f"tool_choice {what} is not supported with custom tools ({names}): grammarserve writes "
        "a custom tool call only as the whole reply; name the custom tool in tool_choice "
        f"(type 'custom', name {customs[0].name!r}), or make it the only tool with tool_choice "
        "'required'", param="tool_choice")


def _check_names(wanted: list[str], names: list[str], param: str, what: str = "function"
                 ) -> None:
    for name in wanted:
        if name not in names:
            raise InvalidRequestError(f"tool_choice names the {what} {name!r}, which is not "
                                      f"in 'tools' ({', '.join(names)})", param=param)


def check_json_mode(req: ChatCompletionRequest, texts: list[str]) -> None:
    """OpenAI's rule for ``json_object``: the conversation must mention JSON."""
    rf = req.response_format
    if rf is not None and rf.type == "json_object" and rf.schema_ is None and not any(
            "json" in t.lower() for t in texts):
        raise InvalidRequestError("'messages' must contain the word 'json' in some form, to use "
                                  "'response_format' of type 'json_object'.", param="messages")


def grammar_error(e: GrammarError, plan: ConstraintPlan) -> InvalidRequestError:
    """A compile error as a 400 naming the field (and, in the message, the keyword path)."""
    message = str(e)
    param = plan.param
    if plan.constraint.kind is ConstraintKind.STRUCTURAL_TAG:
        return _structural_error(e, plan.param)
    if plan.param.startswith("response_format"):
        detail = message.removeprefix("Invalid schema: ")
        message = f"Invalid schema for response_format '{plan.label or 'response'}': {detail}"
    elif plan.param.startswith("tools[") and plan.label:  # a custom tool's grammar
        message = (f"{plan.param.split('.', 1)[0]}: invalid grammar for the custom tool "
                   f"{plan.label!r}: {message}")
    elif plan.param == "tools" and e.path and e.path.startswith("$."):
        param = e.path[2:]
        for cut in (".function.parameters", ".function.name"):
            if cut in param:
                param = param[:param.index(cut) + len(cut)]
    return InvalidRequestError(message, param=param)


def _structural_error(e: GrammarError, base: str) -> InvalidRequestError:
    """A structural tag's refusal: its paths (``$`` the tag object) written from ``base``, the
    param named down to the format object or schema that holds the problem."""
    message, path = str(e), e.path or "$"
    if message.startswith("$"):  # NOTE: the grammar layer's messages lead with their path
        message = base + message[1:]
    param = base + path[1:] if path.startswith("$") else base
    for cut in (".json_schema", ".schema"):
        if cut in param:
            param = param[:param.index(cut) + len(cut)]
            break
    return InvalidRequestError(f"Invalid structural_tag: {message}", param=param)


def completion_prompts(req: CompletionRequest, tokenizer: Any, vocab_size: int | None = None
                       ) -> list[list[int]]:
    """``prompt`` (string, strings, token ids or lists of token ids) as token-id lists, ids below
    ``vocab_size`` (not checked when None)."""
    p = req.prompt
    if isinstance(p, str):
        items: list[str | list[int]] = [p]
    elif p and all(isinstance(x, int) for x in p):
        items = [list(p)]  # type: ignore[arg-type]
    else:
        items = list(p)  # type: ignore[arg-type]
    if not items:
        raise InvalidRequestError("'prompt' must not be empty", param="prompt")
    out = []
    for i, item in enumerate(items):
        ids = tokenizer.encode(item, add_special_tokens=False) if isinstance(item, str) else item
        if not ids:
            raise InvalidRequestError(f"prompt {i} is empty", param="prompt")
        if vocab_size is not None:
            check_token_ids(ids, vocab_size=vocab_size, param="prompt")
        out.append(list(ids))
    return out


def check_completion(req: CompletionRequest) -> None:
    if req.suffix:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise InvalidRequestError("best_of must equal n (no server-side ranking)",
                                  param="best_of")


def check_chat_logprobs(req: ChatCompletionRequest) -> None:
    """``top_logprobs`` (0..20, checked by the protocol model) needs ``logprobs: true``."""
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs=true", param="top_logprobs")

