"""API keys: ``Authorization: Bearer <key>`` on every route but ``/health`` and ``/metrics``
(probes and scrapers carry no key), compared in constant time; 401 with the OpenAI envelope.

Each key may name a tenant; the tenant travels in the ASGI scope (:func:`tenant_of`) to the
routes, where it is the cache namespace of the key's requests and owns its files and batches.
Without keys every request is tenant ``""`` (today's open server).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.openai.errors import kind_response
from grammarserve.server.respond import send_json

#: Routes that stay open with keys configured (liveness probes and Prometheus scrapers).
OPEN_PATHS = frozenset({"/health", "/metrics"})
_TENANT = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_SCOPE_KEY = "grammarserve.tenant"
_MISSING = ("You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")


def parse_key(text: str, where: str) -> tuple[str, str] | None:
    """``key`` or ``key tenant`` (a keys-file line or an ``--api-key`` value); None for a blank
    line or a ``#`` comment. ``where`` names the source in errors."""
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return None
    if len(fields) > 2:
        raise InvalidRequestError(f"{where}: expected 'KEY' or 'KEY TENANT', got {len(fields)} "
                                  "fields", param="api_keys")
    key, tenant = fields[0], (fields[1] if len(fields) == 2 else "")
    if tenant and not _TENANT.fullmatch(tenant):
        raise InvalidRequestError(f"{where}: tenant {tenant!r} must match "
                                  f"{_TENANT.pattern}", param="api_keys")
    return key, tenant


def load_api_keys(keys: Iterable[str], keys_file: Path | None = None) -> dict[str, str]:
    """``key -> tenant`` from ``--api-key`` values and a keys file (one ``key [tenant]`` per
    line; blank lines and ``#`` comments skipped). A key given twice must name one tenant."""
    entries: list[tuple[str, str]] = []
    for i, text in enumerate(keys):
        parsed = parse_key(text, f"--api-key #{i + 1}")
        if parsed is None:
            raise InvalidRequestError(f"--api-key #{i + 1} is empty", param="api_keys")
        entries.append(parsed)
    if keys_file is not None:
        before = len(entries)
        try:
            lines = keys_file.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise InvalidRequestError(f"cannot read the API keys file: {e}",
                                      param="api_keys_file") from None
        for n, line in enumerate(lines, 1):
            parsed = parse_key(line, f"{keys_file}:{n}")
            if parsed is not None:
                entries.append(parsed)
        if len(entries) == before:
            raise InvalidRequestError(f"{keys_file} holds no API key", param="api_keys_file")
    out: dict[str, str] = {}
    for key, tenant in entries:
        if out.setdefault(key, tenant) != tenant:
            raise InvalidRequestError("one API key is given twice with different tenants",
                                      param="api_keys")
    return out


def tenant_of(conn: HTTPConnection) -> str:
    """The tenant of an authenticated request (``""``: none)."""
    return str(conn.scope.get(_SCOPE_KEY, ""))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def _masked(key: str) -> str:
    return f"{key[:3]}{'*' * max(0, len(key) - 7)}{key[-4:]}" if len(key) > 8 else "***"


class ApiKeyAuth:
    """Pure ASGI middleware: refuses requests without a known key (401), tags the others'
    scope with their tenant."""

    def __init__(self, app: ASGIApp, keys: Mapping[str, str]) -> None:
        self.app = app
        # NOTE: every known key is compared with every presented one, digests of equal length,
        # so the time taken says neither which key matched nor how much of one did.
        self._keys = [(_digest(k), t) for k, t in keys.items()]

    def tenant(self, presented: str) -> str | None:
        """The tenant of ``presented``, or None if no key matches."""
        got = _digest(presented)
        found: str | None = None
        for digest, tenant in self._keys:
            if hmac.compare_digest(digest, got) and found is None:
                found = tenant
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, presented = Headers(scope=scope).get("authorization", "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            await _unauthorized(send, _MISSING, None)
            return
        tenant = self.tenant(presented)
        if tenant is None:
            await _unauthorized(send, f"Incorrect API key provided: {_masked(presented)}.",
                                "invalid_api_key")
            return
        scope[_SCOPE_KEY] = tenant
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, message: str, code: str | None) -> None:
    status, body = kind_response(ErrorKind.UNAUTHORIZED, message, code=code)
    await send_json(send, status, body, [(b"www-authenticate", b'Bearer realm="grammarserve"')])
