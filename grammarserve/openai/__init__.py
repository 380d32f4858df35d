"""The OpenAI protocol layer, shared by the HTTP server, the ``/v1/batches`` worker and the offline
``grammarserve batch`` runner (it imports no FastAPI app and no server state).

- :mod:`~grammarserve.openai.protocol`, :mod:`~grammarserve.openai.responses_request`: request
  bodies (chat, completions, responses).
- :mod:`~grammarserve.openai.prepare`: a request to engine requests (:func:`prepare_chat`,
  :func:`prepare_completion`), the constraint check and the one output check; built on
  :mod:`~grammarserve.openai.translate` and :mod:`~grammarserve.openai.render`.
- :mod:`~grammarserve.openai.generation`: runs the engine requests of one API request through an
  :class:`EngineClient` (submit / abort).
- :mod:`~grammarserve.openai.replies`, :mod:`~grammarserve.openai.responses_reply`: outputs to
  bodies and stream events (tool calls parsed by :mod:`~grammarserve.openai.toolparse`; custom
  tools, whose call is the whole reply, checked and parsed by
  :mod:`~grammarserve.openai.custom_tools`).
- :mod:`~grammarserve.openai.endpoints`: a raw body for an endpoint URL (a batch line) to a
  :class:`Prepared` and back to its reply.
- :mod:`~grammarserve.openai.errors`: every failure as a status and an OpenAI error body, from one
  table keyed by :class:`~grammarserve.errors.ErrorKind`.

A subpackage named ``openai`` does not shadow the SDK: imports are absolute, so ``import openai``
anywhere (this package included) is the SDK.
"""

from grammarserve.openai.context import ModelContext
from grammarserve.openai.endpoints import ENDPOINTS, prepare_body, reply_body
from grammarserve.openai.errors import error_response
from grammarserve.openai.generation import EngineClient, Generation
from grammarserve.openai.prepare import Prepared, prepare_chat, prepare_completion
from grammarserve.openai.replies import completion_body, stream_chunks

__all__ = ["ENDPOINTS", "EngineClient", "Generation", "ModelContext", "Prepared",
           "completion_body", "error_response", "prepare_body", "prepare_chat",
           "prepare_completion", "reply_body", "stream_chunks"]
