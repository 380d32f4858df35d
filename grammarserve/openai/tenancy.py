"""Tenants: with API keys, a key's tenant is the prefix-cache namespace of its requests (the
engine shares cached prefixes only within one namespace), for the HTTP routes and the batch
worker alike.

A tenant's namespace is ``tenant + NUL + cache_namespace``, so a request may still split its own
tenant's cache with ``cache_namespace`` but never reach another's; without a tenant (no keys, or
a key without one) the namespace is ``cache_namespace`` as sent, which then may not hold a NUL.
"""

from __future__ import annotations

from grammarserve.engine.streams import AsyncRequestStream
from grammarserve.errors import InvalidRequestError
from grammarserve.openai.generation import EngineClient
from grammarserve.sampling_params import SamplingParams

_SEP = "\x00"


def tenant_namespace(tenant: str, requested: str) -> str:
    """The engine namespace of a request with ``cache_namespace`` ``requested`` from
    ``tenant`` (``""``: none)."""
    if tenant:
        return f"{tenant}{_SEP}{requested}"
    if _SEP in requested:
        raise InvalidRequestError("cache_namespace must not contain NUL", param="cache_namespace")
    return requested


class TenantClient:
    """An :class:`~grammarserve.openai.generation.EngineClient` whose requests run in
    ``tenant``'s namespace."""

    def __init__(self, client: EngineClient, tenant: str) -> None:
        self.client = client
        self.tenant = tenant

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams,
               namespace: str) -> AsyncRequestStream:
        return self.client.submit(request_id, prompt, params,
                                  tenant_namespace(self.tenant, namespace))

    def abort(self, request_id: str) -> None:
        self.client.abort(request_id)
