"""How a request reaches `mtrain serve`'s routes (`serve.app`), and why no client can hold the
server: the connection and the body, below the routes.

uvicorn's HTTP/1.1 protocol waits for a request's head without end and accepts connections
without bound, so a client sending slowly (slow loris) keeps connections, and file
descriptors, for as long as it likes. `GuardedProtocol` closes a connection whose request head
has not arrived within `read_timeout_s` (with a 408 if part of it came), and answers a
connection beyond `max_connections` with a 503 at once.

`RequestBody` (ASGI middleware) reads each request's body before the routes see it: at most
`max_request_bytes` (else 413) within `read_timeout_s` (else 408). A server that answers while
the client is still sending, and closes, resets the connection, and a client busy sending
(Python's urllib and http.client) loses the answer; so a body over the limit is read to its
end and dropped (up to DISCARD_LIMIT_BYTES) before the 413 goes out, and a client that asks
first (`Expect: 100-continue`, as curl does for large bodies) is answered before it sends.

`RequestLog` (ASGI middleware): one log line per request, `POST /translate 200, 3 sentences,
41 ms`; a route reports its sentence count in `scope["state"]["sentences"]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("mtrain.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# A body over max_request_bytes is read and dropped up to this size before the 413 (a larger
# one is answered at once, and the connection closed): reading is cheaper than a client that
# cannot tell why its request failed, up to a point.
DISCARD_LIMIT_BYTES = 64 * 2**20


def error_json(message: str) -> bytes:
    """`{"error": message}`; non-ASCII escaped, so any string (a lone surrogate too) encodes."""
    return json.dumps({"error": message}).encode("ascii")


def printable(text: str, limit: int = 80) -> str:
    """`text` fit for one log or error line: unprintable characters escaped, at most `limit` long."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def raw_response(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written past h11 (which has no request to answer)."""
    body = error_json(message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class NowAndThen:
    """A warning logged at most once per `interval_s` seconds, with how many were held back:
    a flood of refused connections is a few lines, not one each."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.last = -interval_s
        self.held_back = 0

    def warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.held_back += 1
            return
        more = f" (and {self.held_back} more like it since the last such line)" if self.held_back else ""
        log.warning("%s%s", message, more)
        self.last, self.held_back = now, 0


refusals, timeouts = NowAndThen(), NowAndThen()


class GuardedProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on each request's head and a cap on open
    connections (`guarded_protocol` sets both)."""

    read_timeout_s: float = 20.0
    max_connections: int = 512

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.head_deadline: asyncio.TimerHandle | None = None
        self.refused = False
        if len(self.connections) > self.max_connections:
            self.refuse()
        else:
            self.expect_head()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # read and dropped, so that closing does not reset the connection
        if self.between_requests():
            self.expect_head()  # a new request: its head has read_timeout_s from its first byte
        super().data_received(data)
        if not self.between_requests():
            self.cancel_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_head_deadline()
        super().connection_lost(exc)

    def between_requests(self) -> bool:
        """No request's head is in yet, or the last one is answered: waiting for a head."""
        return self.cycle is None or self.cycle.response_complete

    def expect_head(self) -> None:
        if self.head_deadline is None:
            self.head_deadline = self.loop.call_later(self.read_timeout_s, self.head_timed_out)

    def cancel_head_deadline(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def head_timed_out(self) -> None:
        self.head_deadline = None
        handed_on = self.transport.get_protocol() is not self  # upgraded (a WebSocket): no longer ours
        if handed_on or self.transport.is_closing() or not self.between_requests():
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of a head came
            message = f"read_timeout_s: the request's head did not arrive within {self.read_timeout_s:g} s"
            self.transport.write(raw_response(408, "Request Timeout", message))
            timeouts.warn(f"a connection closed: {message}")
        self.transport.close()

    def refuse(self) -> None:
        """A 503 at once, then what the client sends is read and dropped until it closes (for a
        second at most), so that closing does not reset the connection before it reads the 503."""
        self.refused = True
        self.connections.discard(self)  # the cap counts the connections served
        message = f"max_connections: {self.max_connections} connections are open, the limit; retry later"
        self.transport.write(raw_response(503, "Service Unavailable", message))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(1.0, self.transport.close)
        refusals.warn(f"a connection refused: {message}")


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type[GuardedProtocol]:
    """uvicorn's `http=` protocol class with these limits."""

    class Configured(GuardedProtocol):
        pass

    Configured.read_timeout_s = read_timeout_s
    Configured.max_connections = max_connections
    return Configured


# ------------------------------------------------------------------ the body
class BodyOverLimit(Exception):
    pass


class BodyTimedOut(Exception):
    pass


class ClientGone(Exception):
    pass


class BodyReader:
    """Reads a request's body from ASGI `receive`, all of it before `deadline` (the loop's clock)."""

    def __init__(self, receive: Receive, deadline: float) -> None:
        self.receive = receive
        self.deadline = deadline
        self.finished = False  # the last part has come

    async def chunk(self) -> bytes:
        left = self.deadline - asyncio.get_running_loop().time()
        try:
            message = await asyncio.wait_for(self.receive(), max(left, 0.0))
        except asyncio.TimeoutError:
            raise BodyTimedOut from None
        if message["type"] == "http.disconnect":
            raise ClientGone
        self.finished = not message.get("more_body", False)
        return bytes(message.get("body", b""))

    async def read(self, max_bytes: int) -> bytes:
        """The whole body; BodyOverLimit once more than `max_bytes` have come."""
        parts, size = [], 0
        while not self.finished:
            parts.append(await self.chunk())
            size += len(parts[-1])
            if size > max_bytes:
                raise BodyOverLimit
        return b"".join(parts)

    async def discard(self, max_bytes: int) -> bool:
        """Read and drop the rest of the body, up to `max_bytes` more; whether it all came."""
        size = 0
        try:
            while not self.finished and size <= max_bytes:
                size += len(await self.chunk())
        except (BodyTimedOut, ClientGone):
            return False
        return self.finished


async def send_error(send: Send, status: int, message: str, close: bool = False) -> None:
    """A JSON error answer; `close`: the connection closes after it (the body was not all read)."""
    body = error_json(message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return None


class RequestBody:
    """ASGI middleware: the routes get a request's whole body, read within `read_timeout_s` and
    at most `max_bytes` long; see the module docstring for what happens to one that is not."""

    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"max_request_bytes: the body is over the limit of {self.max_bytes} bytes"
        declared = header(scope, b"content-length")
        declared_size = int(declared) if declared is not None and declared.strip().isdigit() else None
        if declared_size is not None and declared_size > self.max_bytes:
            asks_first = (header(scope, b"expect") or b"").lower() == b"100-continue"
            if asks_first or declared_size > DISCARD_LIMIT_BYTES:
                # Not read: a client waiting for "100 Continue" (which only reading sends) has sent nothing yet.
                await send_error(send, 413, too_large, close=True)
                return
        reader = BodyReader(receive, asyncio.get_running_loop().time() + self.read_timeout_s)
        try:
            if declared_size is not None and declared_size > self.max_bytes:
                raise BodyOverLimit
            body = await reader.read(self.max_bytes)
        except BodyOverLimit:
            all_read = await reader.discard(DISCARD_LIMIT_BYTES)
            await send_error(send, 413, too_large, close=not all_read)
            return
        except BodyTimedOut:
            message = f"read_timeout_s: the request's body did not arrive within {self.read_timeout_s:g} s"
            await send_error(send, 408, message, close=True)
            return
        except ClientGone:
            return
        await self.app(scope, replay(body, receive), send)


def replay(body: bytes, receive: Receive) -> Receive:
    """An ASGI `receive` that gives `body` whole, then what `receive` gives (a disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


class RequestLog:
    """ASGI middleware: one INFO line per request once it is answered (or its client is gone)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            sentences = scope.get("state", {}).get("sentences")
            log.info(
                "%s %s %s%s, %.0f ms",
                scope["method"],
                printable(scope["path"]),
                status if status is not None else "not answered (the client left)",
                "" if sentences is None else f", {sentences} sentence{'' if sentences == 1 else 's'}",
                (time.perf_counter() - start) * 1000,
            )
