"""An API request to engine requests: the one pipeline behind the HTTP routes, the ``/v1/batches``
worker and the offline ``grammarserve batch`` runner.

:func:`prepare_chat` / :func:`prepare_completion` validate and translate a request into a
:class:`Prepared` (prompts, one :class:`SamplingParams` per choice, the constraint compiling);
:meth:`Prepared.check_constraint` and :meth:`Prepared.check_output` turn a bad constraint and an
engine-side failure into typed errors, which :func:`grammarserve.openai.errors.error_response`
maps to a status and a body. Every client mistake raises :class:`InvalidRequestError` naming the
param.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import ErrorKind, GrammarError, InvalidRequestError, RequestFailedError
from grammarserve.openai.bodies import new_id
from grammarserve.openai.context import ModelContext
from grammarserve.openai.limits import check_choices, check_prompt_chars, prompt_texts, text_chars
from grammarserve.openai.protocol import ChatCompletionRequest, CompletionRequest, RequestBody
from grammarserve.openai.reasoning import ReasoningPlan, reasoning_ask, reasoning_plan
from grammarserve.openai.render import content_text, render_chat
from grammarserve.openai.sampling import max_new_tokens, sampling_params
from grammarserve.openai.translate import (
    ConstraintPlan,
    ToolsPlan,
    check_chat_logprobs,
    check_common,
    check_completion,
    check_json_mode,
    completion_prompts,
    constraint_plan,
    grammar_error,
    tools_plan,
)
from grammarserve.sampling_params import SamplingParams

#: Engine error kinds caused by the request's constraint (their error names its param).
_CONSTRAINT_KINDS = (ErrorKind.CONSTRAINT_INVALID, ErrorKind.CONSTRAINT_DEAD_END)


@dataclass
class Prepared:
    """The engine requests of one API request (``n`` choices per prompt, in prompt order) and
    what answering it needs."""

    id: str  # the reply's id (chatcmpl-..., cmpl-...)
    req: ChatCompletionRequest | CompletionRequest
    prompts: list[list[int]]
    params: list[SamplingParams]
    plan: ConstraintPlan | None
    tools: ToolsPlan | None
    echo: list[str]  # completions with echo: the text of each prompt
    #: The front end's refusal of the constraint, else None: the engine compiles it, and what
    #: the backends refuse comes back through ``check_output``
    refusal: GrammarError | None
    #: Renames the params errors name (the Responses API names ``text.format``, not
    #: ``response_format``); None: the request's own names.
    rename: Callable[[str | None], str | None] | None = None
    #: The request as the client sent it, when it was translated (a Responses request).
    source: RequestBody | None = None
    #: How the replies' reasoning span is enforced and split (None: no span).
    reasoning: ReasoningPlan | None = None

    @property
    def chat(self) -> bool:
        return isinstance(self.req, ChatCompletionRequest)

    @property
    def n(self) -> int:
        """Choices per prompt."""
        return self.req.n or 1

    @property
    def namespace(self) -> str:
        return self.req.cache_namespace or ""

    @property
    def constraint_param(self) -> str | None:
        return self.plan.param if self.plan is not None else None

    def check_constraint(self) -> None:
        """Raise the 400 of a constraint the front end refused (before anything is queued)."""
        if self.refusal is not None and self.plan is not None:
            raise self._invalid(self.refusal)

    def _invalid(self, e: GrammarError) -> InvalidRequestError:
        """A grammar-layer refusal as the 400 naming the constraint's param."""
        assert self.plan is not None
        err = grammar_error(e, self.plan)
        if self.rename is not None:
            err.param = self.rename(err.param)
        return err

    def check_output(self, out: RequestOutput) -> None:
        """Raise :class:`RequestFailedError` (with the engine's error kind) if a choice ended
        with an error; the one output check of every path."""
        if out.finish_reason != "error":
            return
        if out.constraint_error is not None and self.plan is not None:
            # NOTE: the engine's compile refused it: the same 400 as the front end's refusals
            message, path = out.constraint_error
            raise self._invalid(GrammarError(message, path=path))
        kind = out.error_kind or ErrorKind.ENGINE_FAILURE
        param = self.constraint_param if kind in _CONSTRAINT_KINDS else None
        if self.rename is not None:
            param = self.rename(param)
        raise RequestFailedError(out.error or "generation failed", kind=kind, param=param)


def _front_end(ctx: ModelContext, plan: ConstraintPlan | None
               ) -> tuple[ConstraintPlan | None, GrammarError | None]:
    """The plan with its constraint's validated spec attached (so the engine, maybe in another
    process, does not run the front end again), or the front end's refusal. The backend
    compile is the engine's alone: what it refuses comes back as the same 400 through
    :meth:`Prepared.check_output`, before any output (a stream's status line waits for it)."""
    if plan is None or ctx.compiler is None:
        return plan, None
    kind, args, kwargs = plan.constraint.compile_args()
    try:
        spec = ctx.compiler.spec(kind, *args, **kwargs)
    except GrammarError as e:
        return plan, e
    return replace(plan, constraint=replace(plan.constraint, prepared=spec)), None


def chat_prompt(ctx: ModelContext, req: ChatCompletionRequest, tools: ToolsPlan | None,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """The text of a chat request's prompt (messages and tools through the template, with
    ``template_kwargs``)."""
    return render_chat(ctx.tokenizer, req.messages,
                       tools=tools.tools if tools else None,
                       tool_choice=tools.choice if tools else "auto",
                       parallel=tools.parallel if tools else True,
                       tool_format=tools.format if tools else "hermes",
                       customs=tools.customs if tools else (),
                       custom=tools.custom if tools else None,
                       template_kwargs=template_kwargs)


def prepare_chat(ctx: ModelContext, req: ChatCompletionRequest) -> Prepared:
    """Validate and translate a chat request; its constraint starts compiling."""
    check_common(req, max_n=ctx.max_n)
    check_choices(1, req.n or 1, ctx.max_choices)
    check_prompt_chars(text_chars(req.messages) + text_chars(req.tools), ctx.max_prompt_chars,
                       "messages")
    check_chat_logprobs(req)
    tools = tools_plan(req, ctx.tool_call_format, ctx.tool_call_parser)
    plan, refusal = _front_end(ctx, constraint_plan(req, tools))
    ask = reasoning_ask(req, ctx.reasoning_format, ctx.strict_thinking)
    text = chat_prompt(ctx, req, tools, ask.template_kwargs)
    prompt = ctx.encode(text)  # the tool block's ids from a cache
    check_json_mode(req, [content_text(m.content, f"messages[{i}]")
                          for i, m in enumerate(req.messages)])
    requested = req.max_completion_tokens or req.max_tokens
    max_tokens = max_new_tokens(requested, len(prompt), ctx.max_model_len)
    n = req.n or 1
    params = sampling_params(req, max_tokens=max_tokens, plan=plan, n=n,
                             vocab_size=ctx.vocab_size)
    reasoning = reasoning_plan(ctx.reasoning_format, ask, text,
                               plan.constraint if plan is not None else None)
    if reasoning is not None:
        keep = reasoning.format.special_markers  # NOTE: else decoding drops the markers
        params = [replace(p, reasoning=reasoning.span,
                          skip_special_tokens=p.skip_special_tokens and not keep)
                  for p in params]
    return Prepared(new_id("chatcmpl"), req, [prompt] * n, params, plan, tools, [], refusal,
                    reasoning=reasoning)


def prepare_completion(ctx: ModelContext, req: CompletionRequest) -> Prepared:
    """Validate and translate a text completion request (``n`` engine requests per prompt)."""
    check_common(req, max_n=ctx.max_n)
    count, texts = prompt_texts(req.prompt)
    check_choices(count, req.n or 1, ctx.max_choices)
    for text in texts:
        check_prompt_chars(len(text), ctx.max_prompt_chars, "prompt")
    check_completion(req)
    if req.echo and req.logprobs is not None:
        raise InvalidRequestError("echo together with logprobs is not supported", param="echo")
    plan, refusal = _front_end(ctx, constraint_plan(req, None))
    prompts = completion_prompts(req, ctx.tokenizer, ctx.vocab_size)
    n = req.n or 1
    all_prompts: list[list[int]] = []
    params: list[SamplingParams] = []
    for ids in prompts:
        max_tokens = max_new_tokens(req.max_tokens, len(ids), ctx.max_model_len, "prompt")
        params += sampling_params(req, max_tokens=max_tokens, plan=plan, n=n,
                                  vocab_size=ctx.vocab_size)
        all_prompts += [ids] * n
    echo = [ctx.tokenizer.decode(ids) for ids in prompts] if req.echo else []
    return Prepared(new_id("cmpl"), req, all_prompts, params, plan, None, echo, refusal)

