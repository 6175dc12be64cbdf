"""The UI's aiohttp application: read-only routes, security headers, one error page.

Security model (docs/ui.md): the store is opened read-only and no route writes; only GET and
HEAD are served (anything else is 405); every response carries a Content-Security-Policy that
allows scripts only from ``/static`` (no inline script), no plugins, no framing by other sites;
a blob's raw bytes are served with ``nosniff`` and a CSP ``sandbox`` so a hostile HTML or SVG blob
cannot run script even when opened directly; on loopback the Host header must name loopback
(a DNS-rebinding page cannot read the store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from nscas.errors import InvalidInput, NotFound, NscasError
from nscas.redacting import redact
from nscas.ui import render

if TYPE_CHECKING:
    from nscas.reading import StoreReader

STATIC = Path(__file__).with_name("static")
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-src 'self'; connect-src 'self'; font-src 'self'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'")
RAW_CSP = ("sandbox; default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
           "font-src 'self' data:; frame-ancestors 'self'")
"""For a blob's own bytes: no script at all (``sandbox`` without ``allow-scripts``), an opaque
origin, and framed only by the UI's own pages."""
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
ALLOWED_METHODS = frozenset({"GET", "HEAD"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    store: StoreReader
    loopback_only: bool
    """Refuse requests whose Host header does not name loopback."""
    verify_slots: int = 2
    """Verifications that may run at once; one more waits for a slot."""


STORE = web.AppKey("store", object)
SETTINGS = web.AppKey("settings", Settings)
VERIFY_SLOTS = web.AppKey("verify_slots", asyncio.Semaphore)


class BadQuery(InvalidInput):
    """A query parameter the page cannot use (400)."""


def error_page(status: int, message: str) -> web.Response:
    """The one error page: a title and one sentence saying what is wrong."""
    message = redact(message.strip())
    if not message.endswith((".", "?", "!")):
        message += "."
    title = {400: "Bad request", 404: "Not found", 405: "Method not allowed",
             421: "Misdirected request", 500: "The store cannot be read"}.get(status, "Error")
    return web.Response(status=status, content_type="text/html", charset="utf-8",
                        text=render.page("error.jinja", title=title, status=status,
                                         message=message))


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Methods, Host and errors first; the security headers on whatever comes back."""
    settings = request.app[SETTINGS]
    if request.method not in ALLOWED_METHODS:
        response: web.StreamResponse = error_page(
            405, f"The UI is read-only: {request.method} is not served, only GET and HEAD.")
        response.headers["Allow"] = "GET, HEAD"
    elif settings.loopback_only and _host_name(request.host) not in LOOPBACK_NAMES:
        response = error_page(421, "This server answers only requests addressed to "
                                   "127.0.0.1 or localhost.")
    else:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status in (404, 405):
                what = ("No page at this address." if exc.status == 404 else
                        "The UI is read-only: only GET and HEAD are served.")
                response = error_page(exc.status, what)
            else:
                raise
        except NotFound as exc:
            response = error_page(404, f"This store has no {exc.what}.")
        except NscasError as exc:  # bad input is the asker's (400); damage is the store's
            response = error_page(400 if exc.exit_code == 2 else 500, exc.message)
    _secure(response, raw=request.path.startswith("/raw/"))
    return response


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _secure(response: web.StreamResponse, *, raw: bool) -> None:
    if response.prepared:  # a stream: its headers went with its start (see stream_headers)
        return
    response.headers.update(security_headers(raw=raw))


def security_headers(*, raw: bool = False) -> dict[str, str]:
    return {"Content-Security-Policy": RAW_CSP if raw else PAGE_CSP,
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "SAMEORIGIN" if raw else "DENY",
            "Referrer-Policy": "no-referrer",
            "Cross-Origin-Opener-Policy": "same-origin",
            "Cross-Origin-Resource-Policy": "same-origin",
            "Cache-Control": "no-store"}


def make_app(store: StoreReader, *, loopback_only: bool = True) -> web.Application:
    """The application over an open read-only store (the caller closes it)."""
    from nscas.ui import routes

    app = web.Application(middlewares=[guard], client_max_size=1024)
    app[SETTINGS] = Settings(store=store, loopback_only=loopback_only)

    async def slots(app: web.Application) -> None:
        app[VERIFY_SLOTS] = asyncio.Semaphore(app[SETTINGS].verify_slots)

    app.on_startup.append(slots)
    routes.add_routes(app)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    return app


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address or name only this machine reaches."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(store: StoreReader, *, host: str, port: int,
          on_ready: Callable[[str], None]) -> None:
    """Serve the UI until SIGINT or SIGTERM; ``on_ready`` gets the URL once it listens."""
    import signal

    async def main() -> None:
        app = make_app(store, loopback_only=is_loopback(host))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = site._server  # the bound socket gives the port 0 chose
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        shown = f"[{host}]" if ":" in host else host
        on_ready(f"http://{shown}:{bound}/")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
