"""OpenAI-compatible HTTP server (FastAPI + uvicorn) over an engine in its own process.

HTTP only: requests are validated, translated and answered by the protocol layer
(:mod:`grammarserve.openai`), which the batch paths share.

``grammarserve serve --model default`` runs it; :func:`create_app` builds the ASGI app.
"""

from grammarserve.server.app import create_app
from grammarserve.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
