"""A chat request's reasoning options: template arguments, the span the engine enforces, and
how the reply is split (``reasoning_split.py``).

Parameters (vLLM's and SGLang's names; every bad value is a 400 naming it):

- ``thinking_token_budget`` (vLLM) / ``thinking_budget`` (SGLang, Qwen; also SGLang's
  ``custom_params.thinking_budget``): reasoning tokens before the span is closed (its end
  marker forced, then the constraint applies);
- ``reasoning_effort`` (and the Responses API's ``reasoning.effort``): a budget from
  :data:`EFFORT_BUDGETS`; ``none`` turns thinking off; an explicit budget wins;
- ``chat_template_kwargs`` (``enable_thinking``, ``thinking``: Qwen3's and DeepSeek-V3.1's
  switches) are passed to the template; a budget or an effort other than ``none`` sets both
  to true unless given, ``none`` to false; ``reasoning_effort`` itself goes to the template
  too (gpt-oss writes it into its system message). A template that cannot turn thinking off
  gets an empty span instead (the budget 0), so the reply still has no reasoning;
- ``strict_thinking``: no stop token and no tool-call marker inside the span;
- ``include_reasoning`` (vLLM): false drops the reasoning from the reply;
  ``separate_reasoning`` (SGLang): false leaves it in the content.

A budget or strict thinking on a model without a reasoning format is a 400 (start the server
with ``--reasoning-parser NAME``); ``reasoning_effort`` alone is ignored there, as by vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarserve.constraints import Constraint, ConstraintKind, ReasoningSpan
from grammarserve.errors import InvalidRequestError
from grammarserve.fsm.reasoning_formats import PromptState, ReasoningFormat
from grammarserve.fsm.tool_formats import CALL_MARKERS
from grammarserve.openai.protocol import ChatCompletionRequest

#: ``reasoning_effort`` -> thinking budget (tokens; None: no budget, 0 for ``none`` means off).
EFFORT_BUDGETS: dict[str, int | None] = {
    "minimal": 128, "low": 512, "medium": 2048, "high": 8192, "xhigh": 32768, "max": None}
#: Template arguments the renderer sets itself.
_RESERVED = ("messages", "tools", "add_generation_prompt", "tokenize", "conversation",
             "continue_final_message", "chat_template", "documents", "return_dict")
#: Markers banned from a strict span: every tool-call format's markers.
STRICT_BANNED: tuple[str, ...] = CALL_MARKERS
_SWITCHES = ("enable_thinking", "thinking")


@dataclass(frozen=True)
class ReasoningAsk:
    """What a request asks of the reasoning span (before the prompt is rendered)."""

    budget: int | None
    budget_param: str | None
    enabled: bool | None  # the switch as the request sets it; None: the template's default
    strict: bool
    include: bool
    separate: bool
    template_kwargs: dict[str, Any]


@dataclass(frozen=True)
class ReasoningPlan:
    """How a reply's reasoning is enforced and split."""

    format: ReasoningFormat
    opened: bool  # the prompt opened the span: the reply starts inside it
    span: ReasoningSpan | None  # what the engine enforces (None: only split)
    include: bool
    hidden: bool  # thinking was off but the template could not say so: the span is empty


def _budget(req: ChatCompletionRequest) -> tuple[int | None, str | None]:
    custom = (req.model_extra or {}).get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise InvalidRequestError("custom_params must be an object", param="custom_params")
    found: list[tuple[int, str]] = []
    if req.thinking_token_budget is not None:
        found.append((req.thinking_token_budget, "thinking_token_budget"))
    if req.thinking_budget is not None:
        found.append((req.thinking_budget, "thinking_budget"))
    sg = (custom or {}).get("thinking_budget")
    if sg is not None:
        if isinstance(sg, bool) or not isinstance(sg, int) or not 0 <= sg <= 2**31 - 1:
            raise InvalidRequestError(f"custom_params.thinking_budget must be an integer >= 0, "
                                      f"got {sg!r}", param="custom_params.thinking_budget")
        found.append((sg, "custom_params.thinking_budget"))
    if len({b for b, _ in found}) > 1:
        raise InvalidRequestError(f"{found[0][1]} and {found[1][1]} disagree; give one thinking "
                                  "budget", param=found[1][1])
    return found[0] if found else (None, None)


def reasoning_ask(req: ChatCompletionRequest, fmt: ReasoningFormat | None,
                  strict_default: bool) -> ReasoningAsk:
    """Read and check the request's reasoning parameters."""
    kwargs = dict(req.chat_template_kwargs or {})
    for key in kwargs:
        if key in _RESERVED:
            raise InvalidRequestError(f"chat_template_kwargs may not set {key!r} (the server "
                                      "sets it)", param=f"chat_template_kwargs.{key}")
    for key in _SWITCHES:
        if key in kwargs and not isinstance(kwargs[key], bool):
            raise InvalidRequestError(f"chat_template_kwargs.{key} must be true or false, got "
                                      f"{kwargs[key]!r}", param=f"chat_template_kwargs.{key}")
    budget, budget_param = _budget(req)
    effort = req.reasoning_effort
    if budget is None and effort not in (None, "none"):
        budget, budget_param = EFFORT_BUDGETS[effort], "reasoning_effort"  # type: ignore[index]
    given = [kwargs[k] for k in _SWITCHES if k in kwargs]
    if len(set(given)) > 1:
        raise InvalidRequestError("chat_template_kwargs.enable_thinking and .thinking disagree",
                                  param="chat_template_kwargs.thinking")
    enabled: bool | None = given[0] if given else None
    if enabled is None and effort == "none":
        enabled = False
    elif enabled is None and (budget is not None or effort is not None):
        enabled = True
    explicit = budget_param not in (None, "reasoning_effort")
    if enabled is False and explicit:
        raise InvalidRequestError(f"{budget_param} is set but thinking is turned off "
                                  "(reasoning_effort 'none' or chat_template_kwargs)",
                                  param=budget_param)
    strict = strict_default if req.strict_thinking is None else req.strict_thinking
    if fmt is None and (explicit or req.strict_thinking):
        param = budget_param if explicit else "strict_thinking"
        raise InvalidRequestError(f"{param}: this model's chat template has no reasoning span; "
                                  "start the server with --reasoning-parser NAME for a "
                                  "reasoning model", param=param)
    if fmt is not None:
        if enabled is not None:
            for key in _SWITCHES:
                kwargs.setdefault(key, enabled)
        if effort in ("low", "medium", "high"):
            kwargs.setdefault("reasoning_effort", effort)
    return ReasoningAsk(budget, budget_param, enabled, strict,
                        req.include_reasoning is not False, req.separate_reasoning is not False,
                        kwargs)


def reasoning_plan(fmt: ReasoningFormat | None, ask: ReasoningAsk, prompt: str,
                   constraint: Constraint | None) -> ReasoningPlan | None:
    """The plan of a reply to the rendered ``prompt``; None: no reasoning span (no format,
    thinking off, or the prompt closed the span) or no split asked."""
    if fmt is None or not ask.separate:
        return None
    state = fmt.prompt_state(prompt)
    if state is PromptState.CLOSED:
        return None
    hidden = ask.enabled is False  # NOTE: the template has no switch: the span is forced empty
    budget = 0 if hidden else ask.budget
    enforce = constraint is not None or budget is not None or ask.strict
    span = None
    if enforce:
        calls = constraint is not None and constraint.kind is ConstraintKind.TOOL_CALLS
        header = "" if calls else fmt.answer_header
        span = ReasoningSpan(end=fmt.end, open=fmt.open_text if state is PromptState.NONE else "",
                             close=fmt.close_text, after=fmt.after_end + header, budget=budget,
                             strict=ask.strict, banned=STRICT_BANNED if ask.strict else ())
    return ReasoningPlan(fmt, state is PromptState.OPEN, span, ask.include and not hidden,
                         hidden)
