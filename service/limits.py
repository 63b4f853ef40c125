"""Body size limits, enforced before and while a body is read (413 naming the limit)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge, error_response


def too_large(limit: int, setting: str) -> str:
    """The 413 message for a body over `limit` bytes, naming the setting that holds it."""
    return f"request body exceeds the limit of {limit} bytes ({setting})"


def declared_over(scope: Scope, limit: int) -> bool:
    """Whether the request's Content-Length header already says its body exceeds `limit`."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


class BodyLimit:
    """ASGI middleware: refuse bodies over `max_bytes` (`max_upload_bytes` for model uploads)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes

    def limit_for(self, scope: Scope) -> tuple[int, str]:
        """The limit for this request and the setting that holds it."""
        path: str = scope["path"]
        if scope["method"] == "POST" and path.startswith("/models/") and path.count("/") == 2:
            return self.max_upload_bytes, "max_upload_bytes"
        return self.max_bytes, "max_request_bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check Content-Length up front, and count the bytes as they arrive."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.limit_for(scope)
        message = too_large(limit, setting)
        if declared_over(scope, limit):
            await error_response(413, message)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            incoming = await receive()
            if incoming["type"] == "http.request":
                received += len(incoming.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(message)
            return incoming

        await self.app(scope, counting_receive, send)
