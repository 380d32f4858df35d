"""A raw request body for an endpoint URL (a batch line's) to engine requests and back to the
reply: the three generating endpoints behind one pair of functions, for the ``/v1/batches`` worker
and the offline ``grammarserve batch`` runner."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import InvalidRequestError
from grammarserve.openai.context import ModelContext
from grammarserve.openai.errors import validation_error
from grammarserve.openai.prepare import Prepared, prepare_chat, prepare_completion
from grammarserve.openai.protocol import ChatCompletionRequest, CompletionRequest
from grammarserve.openai.replies import completion_body
from grammarserve.openai.responses_reply import response_body
from grammarserve.openai.responses_request import ResponsesRequest, prepare_response

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
RESPONSES_URL = "/v1/responses"
#: The endpoints a body may be prepared for.
ENDPOINTS = (CHAT_URL, COMPLETIONS_URL, RESPONSES_URL)


def prepare_body(ctx: ModelContext, url: str, body: dict[str, Any]) -> Prepared:
    """Validate and translate ``body`` for ``url`` (one of :data:`ENDPOINTS`); a body that does
    not match the request model is the 400 the server gives for it."""
    try:
        if url == CHAT_URL:
            return prepare_chat(ctx, ChatCompletionRequest.model_validate(body))
        if url == COMPLETIONS_URL:
            return prepare_completion(ctx, CompletionRequest.model_validate(body))
        if url == RESPONSES_URL:
            return prepare_response(ctx, ResponsesRequest.model_validate(body))
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    raise InvalidRequestError(f"url must be one of {', '.join(ENDPOINTS)}, got {url!r}",
                              param="url")


def reply_body(ctx: ModelContext, prep: Prepared, outs: list[RequestOutput]) -> dict[str, Any]:
    """The reply to a finished request prepared by :func:`prepare_body` (``outs``: the final
    output of every choice, in request order); raises the typed error of a failed choice."""
    if isinstance(prep.source, ResponsesRequest):
        return response_body(ctx, prep.source, prep, outs[0], int(time.time()))
    return completion_body(ctx, prep, outs)
