"""What every nscas HTTP server bounds (``nscas ui`` and a ``serve-model`` replica), and how
it refuses a client past a bound: one status that says which, one log line, no traceback.

The bounds (docs/serving.md, docs/ui.md): open connections (one more is answered 503 with
``Retry-After`` and closed), the time a connection may take to send its request line and
headers counted from its opening or its last answer (which is also how long an idle
keep-alive connection is kept), the request line's and each header's size (414 and 431) and
the number of headers (431). aiohttp parses HTTP and applies the sizes and the deadline
(``max_line_size``, ``max_field_size``, ``max_headers``, ``keepalive_timeout``,
``lingering_time``); this module only counts connections, which aiohttp does not bound, and
turns its parse errors into those statuses. Request bodies are never decompressed.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from nscas.errors import InvalidInput

log = logging.getLogger("nscas.http")


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    """What one client may hold of a server."""

    max_connections: int = 256
    """Open connections at most; one more gets 503 with ``Retry-After`` and is closed."""
    header_timeout: float = 10.0
    """Seconds a connection may take to send a whole request line and headers, counted from
    its opening or its last answer; then it is closed. An idle keep-alive connection is closed
    after as long."""
    body_timeout: float = 30.0
    """Seconds a request body that the server reads may take to arrive (then 408)."""
    linger_seconds: float = 2.0
    """After an answer sent before its body was read, how long what is left is drained."""
    max_request_line: int = 8192
    """Longest request target in bytes; a longer one gets 414."""
    max_header_field: int = 8190
    """Longest header (name and value) in bytes; a longer one gets 431. It differs from
    ``max_request_line``: aiohttp's parser tells the two apart only by the limit it names."""
    max_headers: int = 100
    """Headers per request at most; more get 431."""
    retry_after: int = 1
    """Seconds a client refused for too many connections is asked to wait."""

    def check(self) -> None:
        """Refuse limits that bound nothing, naming the field."""
        for name in ("max_connections", "max_request_line", "max_header_field", "max_headers",
                     "retry_after"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout", "linger_seconds"):
            seconds = getattr(self, name)
            if not (math.isfinite(seconds) and 0 < seconds <= 86_400):
                raise InvalidInput(f"{name} must be more than 0 and at most 86400 seconds, "
                                   f"got {seconds}")
        if self.max_request_line == self.max_header_field:
            raise InvalidInput("max_request_line and max_header_field must differ")


Refusal = Callable[[int, str], web.Response]
"""(status, one sentence saying what is wrong) -> the server's own refusal (JSON or HTML)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Policy:
    limits: HttpLimits
    refusal: Refusal
    busy: bytes
    """The whole 503 answer of a connection over the bound, written as it is accepted."""


def refusal_status(exc: BaseException | None, limits: HttpLimits) -> tuple[int, str]:
    """The status and sentence for a request aiohttp could not parse."""
    if isinstance(exc, LineTooLong):
        if exc.args[1:2] == (limits.max_request_line,):
            return 414, f"the request line is over the limit of {limits.max_request_line} bytes"
        return 431, f"a header is over the limit of {limits.max_header_field} bytes"
    if isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message:
        return 431, f"the request has more than {limits.max_headers} headers"
    if isinstance(exc, BadHttpMessage):  # aiohttp's message may span lines: one line here
        return 400, f"the request is not valid HTTP/1.1: {' '.join(exc.message.split())}"[:300]
    return 400, "the request is not valid HTTP/1.1"


class _Handler(RequestHandler):
    """aiohttp's connection handler, counted against ``max_connections`` as it is made, with
    parse errors answered by the server's own refusal and logged in one line."""

    def __init__(self, manager: web.Server, *, policy: _Policy, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._policy = policy
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Counted here, not when the protocol is made: a burst of connections gets all its
        # protocols made before the first of them is registered as open.
        assert self._manager is not None
        if len(self._manager.connections) >= self._policy.limits.max_connections:
            self._refused = True
            assert isinstance(transport, asyncio.Transport)
            transport.write(self._policy.busy)
            transport.close()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._refused:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        # A body that breaks its framing (chunks, a length) fails as aiohttp drains what is
        # left of it after the answer: the client's fault, told in one line.
        exc = kwargs.get("exc_info")
        if isinstance(exc, web.RequestPayloadError | HttpProcessingError):
            log.warning("dropped a connection whose request body could not be read: %s",
                        " ".join(str(exc).split())[:300])
            return
        super().log_exception(*args, **kwargs)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status != 400:  # a handler's failure: aiohttp's own answer and log
            return super().handle_error(request, status, exc, message)
        status, sentence = refusal_status(exc, self._policy.limits)
        log.warning("refused a request from %s: %d, %s", request.remote, status, sentence)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer had begun")
        response = self._policy.refusal(status, sentence)
        response.force_close()
        return response


def _busy_answer(refusal: Refusal, limits: HttpLimits) -> bytes:
    response = refusal(503, "the server has too many open connections; try again")
    body = response.body
    assert isinstance(body, bytes)
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Retry-After: %d\r\nConnection: close\r\n\r\n%s"
            % (response.headers["Content-Type"].encode(), len(body), limits.retry_after, body))


@dataclass(slots=True)
class Listening:
    """A server listening on its sockets; ``close`` stops it and runs the app's cleanup."""

    runner: web.AppRunner
    server: asyncio.Server
    url: str
    """``http://HOST:PORT`` of the first socket (the port 0 chose)."""
    addresses: tuple[str, ...]
    """Every address a socket is bound to."""

    async def close(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def listen(app: web.Application, limits: HttpLimits, *, host: str, port: int,
                 refusal: Refusal, cancel_when_client_leaves: bool = False) -> Listening:
    """Serve ``app`` on ``host:port`` within ``limits``. With ``cancel_when_client_leaves`` a
    handler is cancelled when its client closes the connection (aiohttp's
    ``handler_cancellation``): work nobody waits for stops."""
    limits.check()
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           handler_cancellation=cancel_when_client_leaves)
    await runner.setup()
    try:
        http = runner.server
        assert http is not None
        loop = asyncio.get_running_loop()
        policy = _Policy(limits=limits, refusal=refusal, busy=_busy_answer(refusal, limits))
        settings: dict[str, Any] = {
            "keepalive_timeout": limits.header_timeout, "lingering_time": limits.linger_seconds,
            "max_line_size": limits.max_request_line, "max_field_size": limits.max_header_field,
            "max_headers": limits.max_headers, "access_log": None,
            # Bodies are taken as sent: no server here needs a compressed request, and
            # inflating one is work (and memory) that its size does not bound.
            "auto_decompress": False}
        # The backlog holds a burst well past the bound, so that it is answered 503, not
        # left waiting for the kernel to accept it.
        server = await loop.create_server(
            lambda: _Handler(http, policy=policy, loop=loop, **settings), host, port,
            backlog=max(128, 2 * limits.max_connections))
    except BaseException:
        await runner.cleanup()
        raise
    addresses = tuple(dict.fromkeys(s.getsockname()[0] for s in server.sockets))
    bound, bound_port = server.sockets[0].getsockname()[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    return Listening(runner=runner, server=server, url=f"http://{shown}:{bound_port}",
                     addresses=addresses)
