"""The replica's HTTP server (aiohttp): health, ``/infer``, OpenAI-compatible routes, shutdown.

Routes: ``GET /health``, ``GET /stats``, ``POST /infer``, ``GET /v1/models`` (and
``/v1/models/NAME``), ``POST /v1/chat/completions``, ``POST /v1/completions``.
Every refusal is OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``
with a 4xx status (400 for bad bodies, 404 for another model or an unknown route, 405 for
another method, 408 for a stalled body, 409 for a request id reused for another request, 413
for oversized bodies, 414 and 431 for an oversized request line or headers) or 503 (shutting
down, too many connections, with ``Retry-After``); an unexpected failure is a 500 of the same
shape, and the server serves on. A request whose row of a batch has logits that are not
finite gets a 500 (``non_finite_logits``) alone; the rest of its batch is answered. A stream sends each piece of text as soon
as the generation thread has decoded it; a failure after the stream began is one last event
holding the error object.
On SIGTERM (or SIGINT) the replica stops taking work (503), lets every accepted request
finish, then returns, so the process exits 0.

A replica may hold several model instances, each with its own batcher and generation thread:
each request that generates goes to the instance with the fewest requests in flight (the
lowest index among equals); a retry answered from the cache generates nothing. ``/stats``
gives the counters of all instances together and of each, whether the replica is draining,
and how many requests it has accepted and not yet answered (``in_flight``); it is answered
while the replica drains, so that the drain can be watched.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from jinja2 import TemplateError

from nscas.httpserver import HttpLimits, listen

from .answers import (
    FAILED,
    Served,
    completion_answer,
    infer_answer,
    model_entry,
    models_list,
    new_head,
)
from .batching import Batcher, BatchStats, RequestConflict, RetryCache
from .decoding import Completion, NonFiniteLogits, RowControl
from .protocol import (
    ChatRequest,
    RequestRejected,
    TextRequest,
    check_request_id,
    error_body,
    parse_chat,
    parse_infer,
    parse_json_body,
    parse_text_completion,
)
from .replica import MAX_TOKENS_LIMIT, Replica
from .streaming import retrieved, stream_answer

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
    """New tokens per ``/infer`` answer, and the default ``max_tokens`` of a completion."""
    served_name: str | None = None
    """The model's name in OpenAI answers and ``/v1/models``; None: the checkpoint's ID."""
    cache_size: int = 1024
    """Answers the retry cache keeps (least recently used first out)."""
    max_body_bytes: int = 4096
    """Largest ``/infer`` body; larger ones get 413."""
    max_chat_body_bytes: int = 1 << 20
    """Largest chat or text completion body; larger ones get 413."""
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
class _Instance:
    """One model instance of the replica and the batcher that feeds its generation thread."""

    index: int
    replica: Replica
    batcher: Batcher
    in_flight: int = 0
    """Requests handed to this instance and not yet generated."""

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "in_flight": self.in_flight, **self.batcher.stats.to_json()}


@dataclass(slots=True)
class _State:
    """What the request handlers share (one per app, used only on the event loop)."""

    instances: tuple[_Instance, ...]
    config: ServerConfig
    cache: RetryCache
    served: Served
    in_flight: int = 0
    draining: bool = False
    idle: asyncio.Event | None = None

    @property
    def replica(self) -> Replica:
        """The first instance: what all instances share (tokenizer, prompts, digest)."""
        return self.instances[0].replica

    async def generate(self, prompt: Sequence[int], max_new_tokens: int,
                       control: RowControl | None) -> Any:
        """``prompt``'s generation by the instance with the fewest requests in flight."""
        instance = min(self.instances, key=lambda i: i.in_flight)  # the first of equals
        instance.in_flight += 1
        try:
            return await instance.batcher.submit(prompt, max_new_tokens, control)
        finally:
            instance.in_flight -= 1


STATE = web.AppKey("nscas_state", _State)
LINGER_SECONDS = 2.0


def build_app(instances: Sequence[Replica], config: ServerConfig) -> web.Application:
    """The aiohttp application of one replica serving ``instances`` (model instances of one
    checkpoint; the batchers start with the app)."""
    replica = instances[0]
    app = web.Application(middlewares=[_guard])
    served = Served(name=config.served_name or replica.checkpoint, checkpoint=replica.checkpoint,
                    model_digest=replica.model_digest, created=int(time.time()))
    app[STATE] = _State(
        instances=tuple(
            _Instance(index=k, replica=r,
                      batcher=Batcher(r.generate, max_batch=config.max_batch,
                                      max_wait_s=config.max_wait_ms / 1000,
                                      name=f"nscas-generate-{k}"))
            for k, r in enumerate(instances)),
        config=config, cache=RetryCache(config.cache_size), served=served)
    app.router.add_get("/health", _health, allow_head=False)
    app.router.add_get("/stats", _stats, allow_head=False)
    app.router.add_post("/infer", _infer)
    app.router.add_get("/v1/models", _models, allow_head=False)
    app.router.add_get("/v1/models/{name:.+}", _model, allow_head=False)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _text)
    app.cleanup_ctx.append(_batcher_context)
    return app


async def _batcher_context(app: web.Application) -> Any:
    state = app[STATE]
    state.idle = asyncio.Event()
    state.idle.set()
    for instance in state.instances:
        instance.batcher.start()
    yield
    for instance in state.instances:
        await instance.batcher.close()


def _error(status: int, message: str, code: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, code=code, param=param), status=status)


_ROUTE_CODES = {404: "unknown_route", 405: "method_not_allowed"}


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Any]) -> Any:
    state = request.app[STATE]
    # A read of the counters takes no work and waits on nothing: it is answered while the
    # replica drains (that is how an operator watches the drain) and is not itself counted.
    counted = not (request.method == "GET" and request.path == "/stats")
    if counted:
        if state.draining:
            return _error(503, "the replica is shutting down", "shutting_down")
        state.in_flight += 1
        assert state.idle is not None
        state.idle.clear()
    try:
        return await handler(request)
    except RequestRejected as exc:
        response = _error(exc.status, exc.message, exc.code, exc.param)
        if exc.status == 408:  # what is left of the body is not worth reading: close after this
            response.force_close()
        return response
    except RequestConflict as exc:
        return _error(409, exc.message, "request_id_conflict")
    except NonFiniteLogits as exc:  # this request's row alone; its batch was answered
        log.warning("request %s %s failed: %s", request.method, request.path, exc.message)
        return _error(500, exc.message, "non_finite_logits")
    except web.HTTPException as exc:  # the router's 404 and 405, as JSON like every refusal
        if exc.status < 400:
            raise
        return _error(exc.status, f"{exc.reason}: {request.method} {request.path}",
                      _ROUTE_CODES.get(exc.status, "http_error"))
    except Exception:
        # The boundary of a long-lived server: one failed request must not take it down.
        log.exception("request %s %s failed", request.method, request.path)
        return _error(500, FAILED, "internal_error")
    finally:
        if counted:
            state.in_flight -= 1
            if state.in_flight == 0:
                assert state.idle is not None
                state.idle.set()


async def _health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"ready": True, "model_digest": state.replica.model_digest})


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    total = BatchStats.total([i.batcher.stats for i in state.instances])
    return web.json_response({"model_digest": state.replica.model_digest,
                              "draining": state.draining, "in_flight": state.in_flight,
                              "cache_entries": len(state.cache), "cache_hits": state.cache.hits,
                              "decoding": state.replica.decoding, **total.to_json(),
                              "instances": [i.to_json() for i in state.instances]})


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
    except web.RequestPayloadError as exc:  # its chunks or length do not frame it
        raise RequestRejected(400, f"the body cannot be read: {' '.join(str(exc).split())}"
                              [:300], code="invalid_body") from None


async def _infer(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = parse_infer(parse_json_body(await _read_body(request, state.config.max_body_bytes)))
    prompt = state.replica.prompts.get(body.task_id)
    if prompt is None:
        shown = body.task_id if len(body.task_id) <= 80 else body.task_id[:77] + "..."
        raise RequestRejected(400, f"unknown task id {shown!r}: not in this replica's task set",
                              code="unknown_task", param="task_id")
    limit = state.config.max_new_tokens
    generation, cached = await state.cache.run(
        body.request_id, ("infer", body.task_id),
        lambda: state.generate(prompt, limit, None))
    return web.json_response(infer_answer(
        request_id=body.request_id, task_id=body.task_id,
        model_digest=state.replica.model_digest, generation=generation, cached=cached))


async def _models(request: web.Request) -> web.Response:
    return web.json_response(models_list(request.app[STATE].served))


async def _model(request: web.Request) -> web.Response:
    served = request.app[STATE].served
    name = request.match_info["name"]
    if not served.answers_to(name):
        raise _not_served(name, served)
    return web.json_response(model_entry(served))


def _not_served(name: str, served: Served) -> RequestRejected:
    shown = name if len(name) <= 80 else name[:77] + "..."
    return RequestRejected(404, f"the model {shown!r} is not served here; this replica serves "
                                f"{served.name!r}", code="model_not_found", param="model")


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _complete(request, "chat")


async def _text(request: web.Request) -> web.StreamResponse:
    return await _complete(request, "text")


async def _complete(request: web.Request, kind: str) -> web.StreamResponse:
    """A chat (``kind`` "chat") or text completion, whole or streamed as it is generated."""
    state = request.app[STATE]
    replica = state.replica
    value = parse_json_body(await _read_body(request, state.config.max_chat_body_bytes))
    parse = parse_chat if kind == "chat" else parse_text_completion
    body = parse(value, default_max_tokens=state.config.max_new_tokens, limit=MAX_TOKENS_LIMIT)
    params = body.params
    if not state.served.answers_to(params.model):
        raise _not_served(params.model or "", state.served)
    key = request.headers.get("Idempotency-Key")
    if key is not None:
        check_request_id(key, "the Idempotency-Key header")
    prompt = _encode(replica, body)
    problem = replica.positions_needed(len(prompt), params.max_tokens)
    if problem is not None:
        raise RequestRejected(400, problem, code="context_length_exceeded", param="max_tokens")
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[str] = asyncio.Queue()
    control = RowControl(
        tokenizer=replica.tokenizer, eos=replica.eos_ids, prompt_tokens=len(prompt),
        stop=params.stop, sampling=params.sampling,
        # Called from the generation thread as each piece decodes: the loop queues it.
        emit=(lambda piece: loop.call_soon_threadsafe(events.put_nowait, piece))
        if params.stream else None)

    async def compute() -> Completion:
        await state.generate(prompt, params.max_tokens, control)
        assert control.result is not None
        return control.result

    async def outcome() -> tuple[Completion, bool]:
        if key is None:  # without a key nothing can be a retry, so nothing is kept
            return await compute(), False
        fingerprint = (kind, hashlib.sha256(json.dumps([prompt, params.fingerprint()])
                                            .encode()).hexdigest())
        return await state.cache.run(key, fingerprint, compute)

    task = asyncio.ensure_future(outcome())
    task.add_done_callback(retrieved)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    head = new_head(kind, f"{prefix}-{key or uuid.uuid4().hex}", state.served)
    if not params.stream:
        completion, cached = await task
        return web.json_response(completion_answer(head, completion, request_id=key,
                                                   cached=cached))
    return await stream_answer(request, head, events, task, control, request_id=key,
                               include_usage=params.include_usage)


def _encode(replica: Replica, body: ChatRequest | TextRequest) -> list[int]:
    if isinstance(body, TextRequest):
        prompt = replica.encode_text(body.prompt)
        if not prompt:
            raise RequestRejected(400, "the prompt encodes to no tokens", code="invalid_value",
                                  param="prompt")
        return prompt
    try:
        return replica.encode_messages(body.message_dicts())
    except TemplateError as exc:  # the chat template refuses what it cannot render
        raise RequestRejected(400, f"the chat template cannot render these messages: {exc}",
                              code="invalid_value", param="messages") from None


_HTTP_CODES = {414: "request_line_too_long", 431: "headers_too_large",
               503: "too_many_connections"}


def _refusal(status: int, message: str) -> web.Response:
    """What the replica answers a request that aiohttp could not parse, or a connection over
    the bound: the JSON error object of every refusal."""
    return _error(status, message, _HTTP_CODES.get(status, "invalid_http"))


def http_limits(config: ServerConfig) -> HttpLimits:
    return HttpLimits(max_connections=config.max_connections,
                      header_timeout=config.header_timeout, body_timeout=config.body_timeout,
                      linger_seconds=LINGER_SECONDS)


async def serve(instances: Sequence[Replica], config: ServerConfig, *,
                on_ready: Callable[[str], None]) -> None:
    """Serve ``instances`` (one replica's model instances) until SIGTERM or SIGINT, then
    drain and return.

    ``on_ready`` gets the base URL once the socket listens (the model is loaded and checked
    before this is called). After the signal, new requests get 503 while accepted ones
    finish (for at most ``drain_seconds``). The connection, header and size bounds are
    ``nscas.httpserver``'s, the same as the UI's.
    """
    app = build_app(instances, config)
    listening = await listen(app, http_limits(config), host=config.host, port=config.port,
                             refusal=_refusal)
    try:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        on_ready(listening.url)
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
        await listening.close()
