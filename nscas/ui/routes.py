"""The UI's routes: each parses its query (an unknown or malformed parameter is a 400), reads
through ``nscas.ui.views`` in a worker thread (the store is synchronous) and renders a template.

Pages: ``/`` experiments, ``/receipt/ID``, ``/object/ID``, ``/lineage/ID``, ``/compare?run=..``;
data: ``/raw/ID`` (a blob's bytes, streamed), ``/files/ID`` (a checkpoint's or tree's files as
one tar, or ``?path=P`` one of them, streamed), ``/dot/ID`` (the lineage as Graphviz dot),
``/verify/ID`` (the independent verification as server-sent events). ``ID`` is anything
``nscas show`` accepts: a full ID, a ref name or a unique prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.helpers import content_disposition_header

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest
from nscas.runs.run_state import runs_in_progress
from nscas.store.lineage import HIDE_CLASSES, MAX_NODES, lineage, parse_hide, to_dot
from nscas.ui import comparison, views
from nscas.ui.files import END, FOLDER_KINDS, folder, padding
from nscas.ui.graph import BOX_W, drawn_edges
from nscas.ui.headers import security_headers
from nscas.ui.preview import PageOutOfRange, sniff
from nscas.ui.render import page
from nscas.ui.settings import SETTINGS, VERIFY_SLOTS

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader
    from nscas.store.reading import StoreReader

CHUNK = 1 << 20
MAX_PAGE = 1_000_000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@/+-]{0,199}")
_PATH = re.compile(r"[^\x00-\x1f\x7f]{1,4096}")
"""A file's path in a tree: only looked up among the tree's entries, never opened."""


class BadQuery(InvalidInput):
    """A query parameter the page cannot use (400)."""


class Query:
    """A request's query: each name given at most once unless ``many``, none unknown."""

    def __init__(self, request: web.Request, known: Sequence[str], many: Sequence[str] = ()) -> None:
        self._q = request.query
        unknown = sorted(set(self._q) - set(known) - set(many))
        if unknown:
            raise BadQuery(f"unknown query parameter {unknown[0]!r}; this page takes "
                           + (", ".join(sorted({*known, *many})) or "none"))
        for name in known:
            if len(self._q.getall(name, [])) > 1:
                raise BadQuery(f"query parameter {name!r} is given more than once")

    def text(self, name: str, *, pattern: re.Pattern[str] = _NAME) -> str | None:
        value = self._q.get(name)
        if value is None or value == "":
            return None
        if not pattern.fullmatch(value):
            raise BadQuery(f"{name}={value[:60]!r} is not a usable value")
        return value

    def choice(self, name: str, choices: Sequence[str]) -> str | None:
        value = self._q.get(name) or None
        if value is not None and value not in choices:
            raise BadQuery(f"{name}={value[:60]!r}: expected one of {', '.join(choices)}")
        return value

    def integer(self, name: str, *, default: int | None, low: int, high: int) -> int | None:
        value = self._q.get(name)
        if value is None or value == "":
            return default
        if not re.fullmatch(r"[0-9]{1,9}", value) or not low <= int(value) <= high:
            raise BadQuery(f"{name}={value[:60]!r}: expected a whole number from {low} to {high}")
        return int(value)

    def all(self, name: str) -> list[str]:
        return [v for v in self._q.getall(name, []) if v != ""]


def html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def _store(request: web.Request) -> StoreReader:
    return request.app[SETTINGS].store


def _resolve(request: web.Request) -> Digest:
    return _store(request).resolve(request.match_info["target"])


# ------------------------------------------------------------------ pages


async def experiments(request: web.Request) -> web.Response:
    q = Query(request, ("recipe", "ref", "status", "limit"))
    f = views.ExperimentFilter(recipe=q.text("recipe"), ref=q.text("ref"),
                               status=q.choice("status", ("succeeded", "failed")),
                               limit=q.integer("limit", default=50, low=1, high=1000) or 50)
    view = await asyncio.to_thread(views.experiments, _store(request), f)
    return html(page("experiments.jinja", view=view, f=f, nav="experiments",
                     store=str(_store(request).root)))


async def running(request: web.Request) -> web.Response:
    Query(request, ())
    store = _store(request)
    runs = await asyncio.to_thread(runs_in_progress, store.root)
    return html(page("running.jinja", runs=runs, nav="running", store=str(store.root)))


async def receipt(request: web.Request) -> web.StreamResponse:
    Query(request, ())
    store = _store(request)
    oid = await asyncio.to_thread(store.resolve, request.match_info["target"])
    view = await asyncio.to_thread(views.receipt, store, oid)
    return html(page("receipt.jinja", view=view, nav="experiments", store=str(store.root)))


async def object_page(request: web.Request) -> web.StreamResponse:
    q = Query(request, ("page",))
    store = _store(request)
    oid = await asyncio.to_thread(_resolve, request)
    number = q.integer("page", default=1, low=1, high=MAX_PAGE) or 1
    try:
        view = await asyncio.to_thread(views.object_view, store, oid, page=number)
    except PageOutOfRange as exc:
        raise BadQuery(f"page={exc.page}: {exc.why}") from None
    return html(page("object.jinja", view=view, nav="objects", store=str(store.root)))


def collapsed_depth(kind: str | None, direction: str) -> int:
    """How far the lineage page walks when no depth is asked for: up, the target and what it
    was made from one link away (for a receipt two: its inputs are its action's); down, two,
    the runs that read it (through their actions)."""
    return 2 if kind == "receipt/1" or direction == "down" else 1


def _lineage_args(request: web.Request, *, default_depth: int | None) -> dict[str, Any]:
    """The lineage options of a query; ``depth=all`` walks as far as the links go, no
    depth walks ``default_depth``."""
    q = Query(request, ("direction", "depth", "hide", "max_nodes"), many=("expand",))
    hide_text = request.query.get("hide", "")
    if len(hide_text) > 200:
        raise BadQuery("hide is too long")
    store = _store(request)
    expand = [store.resolve(e) for e in q.all("expand")[:50]]
    everything = request.query.get("depth") == "all"
    return {"direction": q.choice("direction", ("up", "down")) or "up",
            "depth": None if everything else q.integer("depth", default=default_depth, low=0,
                                                       high=1000),
            "hide": parse_hide(hide_text),
            "max_nodes": q.integer("max_nodes", default=MAX_NODES, low=1, high=2000) or MAX_NODES,
            "expand": expand}


async def lineage_page(request: web.Request) -> web.StreamResponse:
    store = _store(request)
    oid = await asyncio.to_thread(_resolve, request)
    kind = (await asyncio.to_thread(store.info, oid)).kind
    collapsed = collapsed_depth(kind, request.query.get("direction") or "up")
    args = await asyncio.to_thread(_lineage_args, request, default_depth=collapsed)
    view = await asyncio.to_thread(views.lineage_view, store, oid, **args)
    return html(page("lineage.jinja", view=view, args=args, hide_classes=HIDE_CLASSES,
                     depth="all" if args["depth"] is None else (
                         args["depth"] if request.query.get("depth") else None),
                     collapsed=collapsed, edges=drawn_edges(view.graph),
                     box_w=BOX_W, nav="lineage", store=str(store.root)))


async def dot(request: web.Request) -> web.StreamResponse:
    store = _store(request)
    oid = await asyncio.to_thread(_resolve, request)
    args = await asyncio.to_thread(_lineage_args, request, default_depth=None)
    del args["expand"]

    def text() -> str:
        root = lineage(store, oid, **args)
        return to_dot(root, direction=args["direction"])

    return web.Response(text=await asyncio.to_thread(text), content_type="text/vnd.graphviz",
                        charset="utf-8")


async def compare_page(request: web.Request) -> web.StreamResponse:
    q = Query(request, ("family", "variant", "verdict", "page"), many=("run",))
    runs = q.all("run")
    if not runs:  # nothing picked yet: the evaluate runs, to tick
        raise web.HTTPFound("/?recipe=evaluate")
    if len(runs) > 12:
        raise BadQuery("compare shows at most 12 runs")
    f = comparison.CompareFilter(family=q.text("family"), variant=q.text("variant"),
                            verdict=q.choice("verdict", comparison.VERDICTS),
                            page=q.integer("page", default=1, low=1, high=MAX_PAGE) or 1)
    store = _store(request)
    view = await asyncio.to_thread(comparison.compare_view, store, runs, f)
    return html(page("compare.jinja", view=view, f=f, verdicts=comparison.VERDICTS, nav="compare",
                     store=str(store.root)))


# ------------------------------------------------------------------ bytes


async def _send_object(response: web.StreamResponse, store: ObjectReader, oid: Digest,
                       size: int | None = None) -> None:
    """An object's bytes, a block at a time; with ``size``, exactly that many or the
    connection is broken off (a tar entry whose object changed length must not shift the
    rest of the archive)."""
    f = await asyncio.to_thread(store.open, oid)
    sent = 0
    try:
        while block := await asyncio.to_thread(f.read, CHUNK):
            sent += len(block)
            if size is not None and sent > size:
                break
            await response.write(block)
    finally:
        f.close()
    if size is not None and sent != size:
        raise ConnectionAbortedError(f"{oid} is {sent} bytes, not the {size} announced")


async def files(request: web.Request) -> web.StreamResponse:
    """A checkpoint's (or a tree's) files: the folder as one tar archive, or with ``?path=`` the
    one file of that path, each downloaded under its own name and streamed."""
    q = Query(request, ("path",))
    path = q.text("path", pattern=_PATH)
    store = _store(request)
    oid = await asyncio.to_thread(_resolve, request)
    found = await asyncio.to_thread(folder, store, oid)
    if path is not None:
        entry = found.entry(path)
        response = web.StreamResponse(headers={
            **security_headers(raw=True), "Content-Type": "application/octet-stream",
            "Content-Length": str(entry.size),
            "Content-Disposition": content_disposition_header(
                "attachment", filename=path.rpartition("/")[2])})
        await response.prepare(request)
        if request.method != "HEAD":
            await _send_object(response, store, entry.id, entry.size)
            await response.write_eof()
        return response
    size = await asyncio.to_thread(found.tar_size)
    response = web.StreamResponse(headers={
        **security_headers(raw=True), "Content-Type": "application/x-tar",
        "Content-Length": str(size),
        "Content-Disposition": content_disposition_header("attachment",
                                                          filename=found.name + ".tar")})
    await response.prepare(request)
    if request.method == "HEAD":
        return response
    for header, entry in found.headers():
        await response.write(header)
        await _send_object(response, store, entry.id, entry.size)
        await response.write(padding(entry.size))
    await response.write(END)
    await response.write_eof()
    return response


async def raw(request: web.Request) -> web.StreamResponse:
    q = Query(request, ("download",))
    download = q.choice("download", ("1",)) == "1"
    store = _store(request)
    oid = await asyncio.to_thread(_resolve, request)
    info = await asyncio.to_thread(store.info, oid)
    if download and info.kind in FOLDER_KINDS:  # a folder downloads as its files
        raise web.HTTPFound(f"/files/{oid}")
    if download:
        media = "application/octet-stream"
    elif info.kind is not None:
        media = "application/json"
    else:
        media = (await asyncio.to_thread(sniff, store, oid)).media_type
    response = web.StreamResponse(headers={
        **security_headers(raw=True), "Content-Type": media,
        "Content-Length": str(info.size),
        "Content-Disposition": ("attachment" if download else "inline")
        + f'; filename="{oid.hex[:16]}"'})
    await response.prepare(request)
    if request.method == "HEAD":
        return response
    await _send_object(response, store, oid)
    await response.write_eof()
    return response


# ------------------------------------------------------------------ verification


async def verify_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one ``message`` per check as the verifiers make it, then ``done``
    (or ``error``). The verification runs in its own process group (``nscas verify
    --stream``: the server imports no verifier), ended when the page closes; at most
    ``Settings.verify_slots`` run at once."""
    Query(request, ())
    store = _store(request)
    oid = await asyncio.to_thread(_resolve, request)
    response = web.StreamResponse(headers={
        **security_headers(), "Content-Type": "text/event-stream; charset=utf-8",
        "X-Accel-Buffering": "no"})
    await response.prepare(request)
    if request.method == "HEAD":
        return response

    async def send(value: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(value, ensure_ascii=False)}\n\n".encode())

    async with request.app[VERIFY_SLOTS]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nscas.cli", "--store", str(store.root), "verify",
            str(oid), "--stream",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=1 << 24,
            start_new_session=True)  # its own process group: ended with whatever it starts
        finished = False
        try:
            assert proc.stdout is not None and proc.stderr is not None
            while line := await proc.stdout.readline():
                value = json.loads(line)
                await send(value)
                finished = finished or "done" in value or "error" in value
            err = (await proc.stderr.read()).decode("utf-8", "replace").strip()
            await proc.wait()
            if not finished:
                last = err.splitlines()[-1] if err else f"exit code {proc.returncode}"
                await send({"error": {"message": f"the verifier stopped: {last}",
                                      "exit_code": proc.returncode}})
        finally:
            # Reached too when the page closes: the server cancels the handler of a client
            # that left (nscas.ui.app.serve), so the verification stops with it.
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", experiments)
    app.router.add_get("/receipt/{target:.+}", receipt)
    app.router.add_get("/object/{target:.+}", object_page)
    app.router.add_get("/lineage/{target:.+}", lineage_page)
    app.router.add_get("/dot/{target:.+}", dot)
    app.router.add_get("/compare", compare_page)
    app.router.add_get("/running", running)
    app.router.add_get("/raw/{target:.+}", raw)
    app.router.add_get("/files/{target:.+}", files)
    app.router.add_get("/verify/{target:.+}", verify_stream)
