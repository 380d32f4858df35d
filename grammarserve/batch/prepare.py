"""A batch line's ``body`` to engine requests and back to a response body, with the server's own
code (:mod:`grammarserve.server.translate`, :mod:`~grammarserve.server.responses`), so a line is
refused with exactly the 400 the server would give and answered with the same body.

The order of checks follows ``chat.prepare`` / ``completions.prepare`` of the server.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from grammarserve.config import EngineConfig
from grammarserve.engine.request import RequestOutput
from grammarserve.errors import GrammarError, InvalidRequestError
from grammarserve.fsm import CompiledGrammar, GrammarCompiler
from grammarserve.sampling_params import SamplingParams
from grammarserve.server import responses as R
from grammarserve.server.protocol import ChatCompletionRequest, CompletionRequest
from grammarserve.server.render import content_text, render_chat
from grammarserve.server.toolparse import ParsedCall
from grammarserve.server.toolparse_array import parse_calls
from grammarserve.server.translate import (
    ConstraintPlan,
    ToolsPlan,
    check_chat_logprobs,
    check_common,
    check_completion,
    check_json_mode,
    completion_prompts,
    constraint_plan,
    grammar_error,
    max_new_tokens,
    sampling_params,
    tools_plan,
)

log = logging.getLogger(__name__)

#: Engine error texts that mean the request's constraint was at fault (400, not 500).
_CLIENT_ERRORS = ("invalid constraint",)


class LineFailed(Exception):
    """A request line answered with an error: ``status`` and the OpenAI error ``body``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["error"]["message"])
        self.status = status
        self.body = body

    @classmethod
    def bad_request(cls, e: InvalidRequestError) -> LineFailed:
        return cls(400, R.error_body(str(e), param=e.param))

    @classmethod
    def server_error(cls, message: str) -> LineFailed:
        return cls(500, R.error_body(message, type_="server_error"))


@dataclass
class Prepared:
    """The engine requests of one line (``n`` choices per prompt) and how to answer it."""

    chat: bool
    req: ChatCompletionRequest | CompletionRequest
    prompts: list[list[int]]
    params: list[SamplingParams]
    plan: ConstraintPlan | None
    tools: ToolsPlan | None
    echo: list[str]
    compiled: Future[CompiledGrammar] | None  # the constraint compiling (validation)

    @property
    def namespace(self) -> str:
        return self.req.cache_namespace or ""

    @property
    def constraint_param(self) -> str | None:
        return self.plan.param if self.plan is not None else None

    def check_compiled(self) -> None:
        """Raise :class:`LineFailed` (400) if the constraint did not compile; call once
        ``compiled`` is done."""
        if self.compiled is None or self.plan is None:
            return
        try:
            self.compiled.result()
        except GrammarError as e:
            raise LineFailed.bad_request(grammar_error(e, self.plan)) from None

    def check_output(self, out: RequestOutput) -> None:
        """Raise :class:`LineFailed` for an engine-side failure of one choice."""
        if out.finish_reason != "error":
            return
        message = out.error or "generation failed"
        if message.startswith(_CLIENT_ERRORS):
            raise LineFailed.bad_request(InvalidRequestError(message,
                                                             param=self.constraint_param))
        raise LineFailed.server_error(message)


class Translator:
    """Turns line bodies into :class:`Prepared` requests and outputs into response bodies.

    Parameters
    ----------
    tokenizer:
        The model's Hugging Face tokenizer (chat template, prompt encoding).
    compiler:
        Validates constraints up front (the engine's own compiler in-process, so the engine's
        compile is then a cache hit; the server's in the server).
    max_model_len, max_n:
        The context limit and the largest ``n``, as the server enforces them.
    model_name:
        The ``model`` reported in response bodies.
    tool_call_format:
        The engine's format for ``required`` and named tool calls (``EngineConfig``).
    """

    def __init__(self, tokenizer: Any, compiler: GrammarCompiler | None, *, max_model_len: int,
                 max_n: int, model_name: str,
                 tool_call_format: str = EngineConfig.tool_call_format) -> None:
        self.tool_call_format = tool_call_format
        self.tokenizer = tokenizer
        self.compiler = compiler
        self.max_model_len = max_model_len
        self.max_n = max_n
        self.model_name = model_name
        self.token_texts = R.TokenTexts(tokenizer)

    def prepare(self, url: str, body: dict[str, Any]) -> Prepared:
        """Validate and translate a body; raises :class:`LineFailed` (400) like the server."""
        try:
            if url == "/v1/chat/completions":
                return self._chat(ChatCompletionRequest.model_validate(body))
            return self._completion(CompletionRequest.model_validate(body))
        except ValidationError as e:
            raise LineFailed(400, _validation_body(e)) from None
        except InvalidRequestError as e:
            raise LineFailed.bad_request(e) from None
        except Exception as e:  # a bug must fail this line only
            log.exception("batch line translation failed")
            raise LineFailed.server_error(f"internal error: {type(e).__name__}: {e}") from None

    def _chat(self, req: ChatCompletionRequest) -> Prepared:
        check_common(req, max_n=self.max_n)
        check_chat_logprobs(req)
        tools = tools_plan(req, self.tool_call_format)
        plan = constraint_plan(req, tools)
        text = render_chat(self.tokenizer, req.messages, tools=tools.tools if tools else None,
                           tool_choice=tools.choice if tools else "auto",
                           parallel=tools.parallel if tools else True,
                           tool_format=tools.format if tools else "hermes")
        prompt = list(self.tokenizer.encode(text, add_special_tokens=False))
        check_json_mode(req, [content_text(m.content, f"messages[{i}]")
                              for i, m in enumerate(req.messages)])
        requested = req.max_completion_tokens or req.max_tokens
        max_tokens = max_new_tokens(requested, len(prompt), self.max_model_len)
        n = req.n or 1
        params = sampling_params(req, max_tokens=max_tokens, plan=plan, n=n,
                                 vocab_size=len(self.tokenizer))
        return Prepared(True, req, [prompt] * n, params, plan, tools, [], self._compile(plan))

    def _completion(self, req: CompletionRequest) -> Prepared:
        check_common(req, max_n=self.max_n)
        check_completion(req)
        if req.echo and req.logprobs is not None:
            raise InvalidRequestError("echo together with logprobs is not supported",
                                      param="echo")
        plan = constraint_plan(req, None)
        prompts = completion_prompts(req, self.tokenizer)
        n = req.n or 1
        all_prompts: list[list[int]] = []
        params: list[SamplingParams] = []
        for ids in prompts:
            max_tokens = max_new_tokens(req.max_tokens, len(ids), self.max_model_len, "prompt")
            params += sampling_params(req, max_tokens=max_tokens, plan=plan, n=n,
                                      vocab_size=len(self.tokenizer))
            all_prompts += [ids] * n
        echo = [self.tokenizer.decode(ids) for ids in prompts] if req.echo else []
        return Prepared(False, req, all_prompts, params, plan, None, echo, self._compile(plan))

    def _compile(self, plan: ConstraintPlan | None) -> Future[CompiledGrammar] | None:
        if plan is None or self.compiler is None:
            return None
        kind, args, kwargs = plan.constraint.compile_args()
        return self.compiler.compile_async(kind, *args, **kwargs)

    # -- responses ------------------------------------------------------------------------------
    def response(self, prep: Prepared, outs: list[RequestOutput]) -> dict[str, Any]:
        """The response body for the final outputs of every choice (in request order);
        raises :class:`LineFailed` if one of them failed in the engine."""
        for out in outs:
            prep.check_output(out)
        try:
            return self._response(prep, outs)
        except Exception as e:  # a bug must fail this line only
            log.exception("batch response failed")
            raise LineFailed.server_error(f"internal error: {type(e).__name__}: {e}") from None

    def _response(self, prep: Prepared, outs: list[RequestOutput]) -> dict[str, Any]:
        rid = R.new_id("chatcmpl" if prep.chat else "cmpl")
        if prep.chat:
            choices = [self._chat_choice(prep, i, o) for i, o in enumerate(outs)]
            return R.chat_completion(rid, self.model_name, choices, R.final_usage(outs))
        req = prep.req
        n = req.n or 1
        choices = []
        for i, out in enumerate(outs):
            lps = None
            if req.logprobs is not None:
                lps = self.token_texts.completion_logprobs(
                    out.token_ids, out.logprobs, 0, out.top_logprobs if req.logprobs else None)
            choices.append({"index": i, "text": (prep.echo[i // n] if prep.echo else "")
                            + out.text, "finish_reason": R.finish_reason(out.finish_reason, False),
                            "logprobs": lps})
        return R.completion(rid, self.model_name, choices,
                            R.final_usage(outs, num_prompts=len(outs) // n))

    def _chat_choice(self, prep: Prepared, i: int, out: RequestOutput) -> dict[str, Any]:
        content: str | None = out.text
        calls: list[ParsedCall] = []
        if prep.tools is not None:
            content, calls = parse_calls(out.text, prep.tools.format)
        lps = None
        if getattr(prep.req, "logprobs", None):
            lps = self.token_texts.chat_logprobs(out.token_ids, out.logprobs, out.top_logprobs)
        return R.chat_choice(i, content, calls, R.finish_reason(out.finish_reason, bool(calls)),
                             lps)


def _validation_body(e: ValidationError) -> dict[str, Any]:
    """The server's 400 for a body that does not match the request model."""
    from grammarserve.server.app import _validation_response

    resp = _validation_response(RequestValidationError(e.errors()))
    body = json.loads(bytes(resp.body))
    assert isinstance(body, dict)
    return body
