"""An API key, as vLLM's ``--api-key`` takes one: every request to the API (``/v1/...`` and the tokenizer endpoints)
carries ``Authorization: Bearer <key>`` or is answered 401 in OpenAI's error object; ``/health`` and ``/metrics``
stay open (a load balancer's probe, a Prometheus scrape). A pure ASGI layer: it reads the request's headers once and
passes every message through untouched, so a stream's chunks cost nothing more."""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse

from models.server.protocol import error_body

OPEN_PATHS = ("/health", "/metrics")


class KeyCheck:
    """The ASGI app ``app``, its API behind ``key`` (module doc)."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            body = error_body("a valid API key is required (Authorization: Bearer <key>)", code=401,
                              kind="authentication_error")  # fmt: skip
            await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope) -> bool:
        got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(got, self.expected)
