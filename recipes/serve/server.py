"""The replica's HTTP server (aiohttp): health, ``/infer``, OpenAI-compatible chat, shutdown.

Routes: ``GET /health``, ``GET /stats``, ``POST /infer``, ``POST /v1/chat/completions``.
Every refusal is a JSON ``{"error": "..."}`` with a 4xx status (413 for oversized bodies,
409 for a request id reused for another request, 404 and 405 for unknown routes and
methods); an unexpected failure is a 500 of the same shape, and the server serves on.
On SIGTERM (or SIGINT) the replica stops taking work (503), lets every accepted request
finish, then returns, so the process exits 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from jinja2 import TemplateError

from .batching import Batcher, RequestConflict, RetryCache
from .protocol import (
    RequestRejected,
    chat_answer,
    chat_chunks,
    check_request_id,
    infer_answer,
    parse_chat,
    parse_infer,
    parse_json_body,
)
from .replica import MAX_TOKENS_LIMIT, Replica

log = logging.getLogger("nscas.serve")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """How a replica serves; the model it serves comes separately, already checked."""

    host: str = "127.0.0.1"
    """Address to listen on; loopback unless the operator says otherwise."""
    port: int = 0
    """TCP port; 0 picks a free one (the ready line names it)."""
    max_batch: int = 8
    """Most requests generated as one batch (1 turns dynamic batching off)."""
    max_wait_ms: float = 5.0
    """How long an open batch waits for its next request before it is generated."""
    max_new_tokens: int = 96
    """New tokens per ``/infer`` answer, and the default ``max_tokens`` of a chat completion."""
    cache_size: int = 1024
    """Answers the retry cache keeps (least recently used first out)."""
    max_body_bytes: int = 4096
    """Largest ``/infer`` body; larger ones get 413."""
    max_chat_body_bytes: int = 1 << 20
    """Largest chat completion body; larger ones get 413."""
    drain_seconds: float = 300.0
    """After SIGTERM, how long accepted requests may take to finish before the replica exits."""
    header_timeout: float = 10.0
    """Seconds a connection may take to send a whole request line and headers, counted from
    its opening or its last answer; then it is closed (a stalled client holds nothing)."""
    body_timeout: float = 30.0
    """Seconds a request's body may take to arrive; then it gets 408 and the connection closes."""
    max_connections: int = 256
    """Open connections at most; one more is answered 503 and closed at once."""


@dataclass(slots=True)
class _State:
    """What the request handlers share (one per app, used only on the event loop)."""

    replica: Replica
    config: ServerConfig
    batcher: Batcher
    cache: RetryCache
    in_flight: int = 0
    draining: bool = False
    idle: asyncio.Event | None = None


STATE = web.AppKey("nscas_state", _State)
LINGER_SECONDS = 2.0


def build_app(replica: Replica, config: ServerConfig) -> web.Application:
    """The aiohttp application of one replica (the batcher starts with the app)."""
    batcher = Batcher(replica.generate, max_batch=config.max_batch,
                      max_wait_s=config.max_wait_ms / 1000)
    app = web.Application(middlewares=[_guard])
    app[STATE] = _State(replica=replica, config=config, batcher=batcher,
                        cache=RetryCache(config.cache_size))
    app.router.add_get("/health", _health, allow_head=False)
    app.router.add_get("/stats", _stats, allow_head=False)
    app.router.add_post("/infer", _infer)
    app.router.add_post("/v1/chat/completions", _chat)
    app.cleanup_ctx.append(_batcher_context)
    return app


async def _batcher_context(app: web.Application) -> Any:
    state = app[STATE]
    state.idle = asyncio.Event()
    state.idle.set()
    state.batcher.start()
    yield
    await state.batcher.close()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Any]) -> Any:
    state = request.app[STATE]
    if state.draining:
        return _error(503, "the replica is shutting down")
    state.in_flight += 1
    assert state.idle is not None
    state.idle.clear()
    try:
        return await handler(request)
    except RequestRejected as exc:
        response = _error(exc.status, exc.message)
        if exc.status == 408:  # what is left of the body is not worth reading: close after this
            response.force_close()
        return response
    except RequestConflict as exc:
        return _error(409, exc.message)
    except web.HTTPException as exc:  # the router's 404 and 405, as JSON like every refusal
        if exc.status < 400:
            raise
        return _error(exc.status, f"{exc.reason}: {request.method} {request.path}")
    except Exception:
        # The boundary of a long-lived server: one failed request must not take it down.
        log.exception("request %s %s failed", request.method, request.path)
        return _error(500, "the replica failed to answer this request")
    finally:
        state.in_flight -= 1
        if state.in_flight == 0:
            state.idle.set()


async def _health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"ready": True, "model_digest": state.replica.model_digest})


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"model_digest": state.replica.model_digest,
                              "cache_entries": len(state.cache), "cache_hits": state.cache.hits,
                              "decoding": state.replica.decoding,
                              **state.batcher.stats.to_json()})


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refusing anything over ``limit`` bytes (413) before reading it all, and one
    that takes longer than the body timeout to arrive (408, and the connection is closed)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise RequestRejected(413, f"the body has {declared} bytes; the limit is {limit}")
    seconds = request.app[STATE].config.body_timeout
    data = bytearray()
    try:
        async with asyncio.timeout(seconds):
            while True:
                chunk = await request.content.read(limit + 1 - len(data))
                if not chunk:
                    return bytes(data)
                data += chunk
                if len(data) > limit:
                    raise RequestRejected(413, f"the body is over the limit of {limit} bytes")
    except TimeoutError:
        raise RequestRejected(408, f"the body did not arrive within {seconds:g} s") from None


async def _infer(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = parse_infer(parse_json_body(await _read_body(request, state.config.max_body_bytes)))
    prompt = state.replica.prompts.get(body.task_id)
    if prompt is None:
        shown = body.task_id if len(body.task_id) <= 80 else body.task_id[:77] + "..."
        raise RequestRejected(400, f"unknown task id {shown!r}: not in this replica's task set")
    limit = state.config.max_new_tokens
    generation, cached = await state.cache.run(
        body.request_id, ("infer", body.task_id), lambda: state.batcher.submit(prompt, limit))
    return web.json_response(infer_answer(
        request_id=body.request_id, task_id=body.task_id,
        model_digest=state.replica.model_digest, generation=generation, cached=cached))


async def _chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    replica = state.replica
    body = parse_chat(parse_json_body(await _read_body(request, state.config.max_chat_body_bytes)),
                      default_max_tokens=state.config.max_new_tokens, limit=MAX_TOKENS_LIMIT)
    key = request.headers.get("Idempotency-Key")
    if key is not None:
        check_request_id(key, "the Idempotency-Key header")
    try:
        prompt = replica.encode_messages(body.message_dicts())
    except TemplateError as exc:  # the chat template refuses what it cannot render
        raise RequestRejected(400, f"the chat template cannot render these messages: {exc}"
                              ) from None
    problem = replica.positions_needed(len(prompt), body.max_tokens)
    if problem is not None:
        raise RequestRejected(400, problem)

    def compute() -> Any:
        return state.batcher.submit(prompt, body.max_tokens)

    if key is None:  # without a key nothing can be a retry, so nothing is kept
        generation, cached = await compute(), False
    else:
        fingerprint = ("chat", hashlib.sha256(json.dumps([prompt, body.max_tokens]).encode())
                       .hexdigest())
        generation, cached = await state.cache.run(key, fingerprint, compute)
    completion_id = f"chatcmpl-{key or uuid.uuid4().hex}"
    if not body.stream:
        return web.json_response(chat_answer(
            completion_id=completion_id, request_id=key, model_digest=replica.model_digest,
            generation=generation, cached=cached))
    # Decoding every prefix costs time; do it off the loop before the stream starts.
    chunks = await asyncio.to_thread(lambda: list(chat_chunks(
        completion_id=completion_id, model_digest=replica.model_digest, generation=generation,
        tokenizer=replica.tokenizer, include_usage=body.include_usage)))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def serve(replica: Replica, config: ServerConfig, *,
                on_ready: Callable[[str], None]) -> None:
    """Serve until SIGTERM or SIGINT, then drain and return.

    ``on_ready`` gets the base URL once the socket listens (the model is loaded and checked
    before this is called). After the signal, new requests get 503 while accepted ones
    finish (for at most ``drain_seconds``).
    """
    app = build_app(replica, config)
    # aiohttp closes a connection that is idle, or part-way through its headers, once the
    # keep-alive timeout passes: that timer is the header timeout. After an answer sent before
    # its body was read (413, 408), the rest is drained for LINGER_SECONDS at most, not 10.
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           keepalive_timeout=config.header_timeout, lingering_time=LINGER_SECONDS)
    await runner.setup()
    listener: asyncio.Server | None = None
    try:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        http = runner.server
        assert http is not None
        listener = await loop.create_server(
            lambda: http() if len(http.connections) < config.max_connections else _Busy(),
            config.host, config.port)
        host, port = listener.sockets[0].getsockname()[:2]
        on_ready(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        await stop.wait()
        state = app[STATE]
        state.draining = True
        assert state.idle is not None
        try:
            await asyncio.wait_for(state.idle.wait(), config.drain_seconds)
        except TimeoutError:
            log.warning("%d request(s) still running after %.0f s; stopping anyway",
                        state.in_flight, config.drain_seconds)
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()


class _Busy(asyncio.Protocol):
    """A connection over ``max_connections``: one 503 in the JSON shape of every refusal."""

    BODY = json.dumps({"error": "the replica has too many open connections; try again"}).encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                        % (len(self.BODY), self.BODY))
        transport.close()
