"""A completion streamed as server-sent events while it is generated (docs/serving.md): each
piece of text as the generation thread decodes it; a failure after the stream began is one
last event holding the error object."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .answers import FAILED, SSE_DONE, AnswerHead, finish_chunk, piece_chunk, sse, usage_chunk
from .decoding import Completion, NonFiniteLogits, RowControl
from .protocol import error_body

log = logging.getLogger("nscas.serve")


async def stream_answer(request: web.Request, head: AnswerHead, events: asyncio.Queue[str],
                        task: asyncio.Future[tuple[Completion, bool]], control: RowControl, *,
                        request_id: str | None, include_usage: bool) -> web.StreamResponse:
    """Server-sent events: a chunk per piece of text as it is generated, then the finish
    reason, the usage if asked, ``[DONE]``. Nothing is sent before the first piece (or the
    answer), so that a refusal still gets its own status."""
    pieces = _live_pieces(events, task)
    first = await anext(pieces, None)
    if first is None:
        completion, cached = await task  # a refusal or a failure raises here: its own status
        replay: tuple[str, ...] = completion.pieces  # a retry's cached answer, or no text
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        if first is not None:
            await response.write(sse(piece_chunk(head, first, first=True)))
            async for piece in pieces:
                await response.write(sse(piece_chunk(head, piece)))
            try:
                completion, cached = await task
            except NonFiniteLogits as exc:  # the status is sent: the last event says so
                log.warning("request %s %s failed while streaming: %s", request.method,
                            request.path, exc.message)
                await response.write(sse(error_body(500, exc.message, code="non_finite_logits")))
                await response.write_eof()
                return response
            except Exception:  # the status is sent: the stream's last event says what failed
                log.exception("request %s %s failed while streaming", request.method,
                              request.path)
                await response.write(sse(error_body(500, FAILED, code="internal_error")))
                await response.write_eof()
                return response
        else:
            if head.kind == "chat" and not replay:
                replay = ("",)  # a chat stream names the role even for an empty answer
            for index, piece in enumerate(replay):
                await response.write(sse(piece_chunk(head, piece, first=index == 0)))
        await response.write(sse(finish_chunk(head, completion, request_id=request_id,
                                              cached=cached)))
        if include_usage:
            await response.write(sse(usage_chunk(head, completion)))
        await response.write(SSE_DONE)
        await response.write_eof()
    except ConnectionResetError:  # the client left: stop its row unless a retry may want it
        if request_id is None:
            control.cancel()
    return response


async def _live_pieces(events: asyncio.Queue[str], task: asyncio.Future[Any]
                       ) -> AsyncIterator[str]:
    """The pieces queued for a stream until its work is done (every piece is queued before
    the work's result is set, so none is lost)."""
    while True:
        if not events.empty():
            yield events.get_nowait()
            continue
        if task.done():
            return
        getter = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait((getter, task), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            yield getter.result()


def retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a request's outcome as seen: a client that left must not leave a loose error."""
    if not task.cancelled():
        task.exception()
