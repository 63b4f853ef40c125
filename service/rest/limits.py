"""Request bodies: size limits (413 naming the limit) checked before and while a body is read,
gzip/deflate bodies inflated as they arrive (the limit applies to the inflated bytes), a time
limit on the whole body (408), and compressed responses for clients that ask for them."""

from __future__ import annotations

import asyncio
import functools
import time

from starlette.types import Message, Receive, Scope, Send

from service.errors import PayloadTooLarge, RequestTimeout, ServiceError
from service.rest import content_coding
from service.rest.errors import error_response

CLOSE = {"Connection": "close"}  # the client may still be sending: don't read on
# Clients send the same few Accept-Encoding values ("gzip, deflate, br" ...) with each request;
# parsing one took 2 µs, a cached answer a tenth of that.
accepted_coding = functools.lru_cache(maxsize=64)(content_coding.accepted_coding)


def too_large(limit: int, setting: str) -> str:
    """The 413 message for a body over `limit` bytes, naming the setting that holds it."""
    return f"request body exceeds the limit of {limit} bytes ({setting})"


def too_slow(seconds: float) -> str:
    """The 408 message for a body that took longer than `seconds` to arrive."""
    return (f"the request body did not arrive within {seconds:g} s (body_timeout); send it "
            "faster or in full")


def declared_over(headers: dict[bytes, bytes], limit: int) -> bool:
    """Whether the request's Content-Length header already says its body exceeds `limit`."""
    length = headers.get(b"content-length")
    return length is not None and length.isdigit() and int(length) > limit


class BodyDeadlines:
    """Time limits on reading request bodies, kept by one watcher task for all requests.

    A timer per request (``asyncio.timeout``) cost a hot route 9 µs a request, eight times
    its whole body read; a dictionary entry while a request waits for body bytes costs a
    fraction of one. The watcher wakes every `period` seconds while any request waits and
    cancels those past their deadline, so a limit is kept within `period`.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.period = min(1.0, timeout_s / 4)
        self._waiting: dict[asyncio.Task[object], float] = {}
        self._expired: set[asyncio.Task[object]] = set()
        self._watcher: asyncio.Task[None] | None = None

    def deadline(self) -> float:
        """The deadline of a body whose reading starts now (`time.monotonic` seconds)."""
        return time.monotonic() + self.timeout_s

    async def receive(self, receive: Receive, deadline: float) -> Message:
        """``receive()``, or 408 when it is still waiting at `deadline`."""
        task = asyncio.current_task()
        assert task is not None  # ASGI apps run in tasks
        self._waiting[task] = deadline
        watcher = self._watcher
        if watcher is None or watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        try:
            return await receive()
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            self._expired.discard(task)
            task.uncancel()
            raise RequestTimeout(too_slow(self.timeout_s), CLOSE) from None
        finally:
            self._waiting.pop(task, None)

    async def _watch(self) -> None:
        while self._waiting:
            await asyncio.sleep(self.period)
            now = time.monotonic()
            for task, deadline in list(self._waiting.items()):
                if deadline <= now:
                    del self._waiting[task]
                    self._expired.add(task)
                    task.cancel()


def without_coding(scope: Scope) -> Scope:
    """`scope` with Content-Encoding and Content-Length dropped: what the app reads is the
    inflated body, whose length no header gives."""
    headers = [(key, value) for key, value in scope["headers"]
               if key not in (b"content-encoding", b"content-length")]
    return {**scope, "headers": headers}


class BodyLimit:
    """Refuse bodies over `max_bytes` (`max_upload_bytes` for model uploads) or slower than
    `body_timeout_s`, inflate compressed ones, compress responses on request.

    Not a layer of its own: `service.rest.gate.Gate`, which every request passes, opens each
    request's body here. Errors met while the app reads the body are answered by the gate with
    this request's reply (FastAPI would turn them into a generic 400 when they happen while it
    parses a form or a JSON body).
    """

    def __init__(self, *, max_bytes: int, max_upload_bytes: int,
                 body_timeout_s: float = 30.0) -> None:
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes
        self.deadlines = BodyDeadlines(body_timeout_s)

    def limit_for(self, scope: Scope) -> tuple[int, str]:
        """The limit for this request and the setting that holds it."""
        path: str = scope["path"]
        if scope["method"] == "POST" and path.startswith("/models/") and path.count("/") == 2:
            return self.max_upload_bytes, "max_upload_bytes"
        return self.max_bytes, "max_request_bytes"

    def open(self, scope: Scope, receive: Receive, send: Send) -> tuple[Scope, Receive, Send]:
        """The scope, receive and send the app gets for this request; raises `ServiceError`
        (413, 415) when its headers already refuse it, before any byte is read."""
        headers = dict(scope["headers"])
        if (scope["method"] == "GET" and headers.get(b"content-length", b"0") == b"0"
                and b"transfer-encoding" not in headers and b"content-encoding" not in headers
                and b"accept-encoding" not in headers):
            # A probe or a metadata read: no body follows (HTTP/1.1 framing) and no reply
            # is to be compressed, so there is nothing to do.
            return scope, receive, send
        limit, setting = self.limit_for(scope)
        if declared_over(headers, limit):
            raise PayloadTooLarge(too_large(limit, setting))
        accept = headers.get(b"accept-encoding")
        body = _BodyExchange(receive, send, limit, setting, self.deadlines,
                             headers.get(b"content-encoding"),
                             None if accept is None else accepted_coding(accept))
        if body.decoder is not None:
            scope = without_coding(scope)
        return scope, body.receive, body.send


class _BodyExchange:
    """One request's receive and send as the app sees them (see `BodyLimit`): its body
    counted against the limit, inflated first when compressed."""

    __slots__ = ("_receive", "_send", "limit", "setting", "decoder", "size", "deadlines",
                 "deadline", "coding", "done", "failure", "start")

    def __init__(self, receive: Receive, send: Send, limit: int, setting: str,
                 deadlines: BodyDeadlines, content_encoding: bytes | None,
                 coding: str | None) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.setting = setting
        self.decoder = None if content_encoding is None else content_coding.body_decoder(
            content_encoding, limit, too_large(limit, setting))
        self.size = 0
        self.deadlines = deadlines
        self.deadline = deadlines.deadline()
        self.coding = coding
        self.done = False
        self.failure: ServiceError | None = None
        self.start: Message | None = None

    def take(self, chunk: bytes, last: bool) -> bytes:
        """The body bytes `chunk` stands for; 413 once they pass the limit."""
        if self.decoder is not None:
            chunk = self.decoder.feed(chunk)
            if last:
                self.decoder.finish()
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(too_large(self.limit, self.setting))
        return chunk

    async def receive(self) -> Message:
        """The next message, its body inflated and counted, within the body's deadline."""
        if self.done:
            return await self._receive()
        try:
            message = await self.deadlines.receive(self._receive, self.deadline)
            if message["type"] == "http.request":
                last = not message.get("more_body", False)
                body = message.get("body", b"")
                taken = self.take(body, last)
                if taken is not body:  # inflated: the app reads what the client compressed
                    message = {**message, "body": taken}
                self.done = last
        except ServiceError as error:
            self.failure = error
            raise
        return message

    async def send(self, message: Message) -> None:
        """The app's response; ours instead when reading the body failed, compressed when
        the client asked and it is one large enough body."""
        if self.failure is not None:
            if message["type"] == "http.response.start":
                await _answer(self._send, self.failure)
            return
        if self.coding is None:
            await self._send(message)
        elif message["type"] == "http.response.start":
            self.start = message
        elif self.start is not None and message["type"] == "http.response.body":
            start, self.start = self.start, None
            await _compressed(self._send, start, message, self.coding)
        else:
            await self._send(message)


async def _answer(send: Send, error: ServiceError) -> None:
    """Send the JSON error reply for `error` (its headers included)."""
    response = error_response(error.status, str(error), error.headers)
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


async def _compressed(send: Send, start: Message, body: Message, coding: str) -> None:
    """Send a response start and its first body message, compressed when that is the whole
    body, at least `MIN_COMPRESS_BYTES` long and not already encoded."""
    headers = list(start.get("headers", ()))
    content, coding_headers = body.get("body", b""), []
    if not body.get("more_body", False) and all(key != b"content-encoding" for key, _ in headers):
        content, coding_headers = compressed_reply(content, coding)
    if not coding_headers:
        await send(start)
        await send(body)
        return
    headers = [(key, value) for key, value in headers if key != b"content-length"]
    headers += [*coding_headers, (b"content-length", str(len(content)).encode())]
    await send({**start, "headers": headers})
    await send({**body, "body": content})


def compressed_reply(body: bytes, coding: str | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """`body` compressed for a client accepting `coding`, and the headers saying so; as it is
    when the client accepts none or the body is small."""
    if coding is None or len(body) < content_coding.MIN_COMPRESS_BYTES:
        return body, []
    return (content_coding.compress(body, coding),
            [(b"content-encoding", coding.encode()), (b"vary", b"Accept-Encoding")])

