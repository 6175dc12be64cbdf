"""The UI's aiohttp application: read-only routes, security headers, one error page.

Security model (docs/ui.md): the store is opened read-only and no route writes; only GET and
HEAD are served (anything else is 405); every response carries a Content-Security-Policy that
allows scripts only from ``/static`` (no inline script), no plugins, no framing by other sites;
a blob's raw bytes are served with ``nosniff`` and a CSP ``sandbox`` so a hostile HTML or SVG blob
cannot run script even when opened directly; on loopback the Host header must name loopback
or the bound address (a DNS-rebinding page cannot read the store). Faults say whose they are:
400 and 404 the asker's, 503 a store that cannot be reached now, 500 damage. Connections,
header deadlines and sizes are bounded as a replica's are (``nscas.httpserver``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from nscas.errors import DamagedStore, NotFound, NscasError, StoreError
from nscas.httpserver import HttpLimits, listen
from nscas.redacting import redact
from nscas.ui import render, routes
from nscas.ui.headers import security_headers
from nscas.ui.settings import LOOPBACK_NAMES, SETTINGS, VERIFY_SLOTS, VERIFY_SLOTS_DEFAULT, Settings

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

STATIC = Path(__file__).with_name("static")
ALLOWED_METHODS = frozenset({"GET", "HEAD"})
LIMITS = HttpLimits(max_connections=128, header_timeout=10.0, body_timeout=10.0)
"""What one client may hold of the UI (docs/ui.md); the same bounds as a replica's."""
RETRY_AFTER = 5
"""Seconds a page refused because the store cannot be reached asks the browser to wait."""
log = logging.getLogger("nscas.ui")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_page(status: int, message: str) -> web.Response:
    """The one error page: a title and one sentence saying what is wrong."""
    message = redact(message.strip())
    if not message.endswith((".", "?", "!")):
        message += "."
    title = {400: "Bad request", 404: "Not found", 405: "Method not allowed",
             414: "Request line too long", 421: "Misdirected request",
             431: "Request headers too large", 500: "The store cannot be read",
             503: "Unavailable"}.get(status, "Error")
    return web.Response(status=status, content_type="text/html", charset="utf-8",
                        text=render.page("error.jinja", title=title, status=status,
                                         message=message))


def fault_status(exc: NscasError) -> int:
    """Whose fault, as a status: the asker's (400, 404), a store that cannot be reached or
    read now (503: its database or object storage is down), or damage (500)."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, StoreError) and not isinstance(exc, DamagedStore):
        return 503
    return 400 if exc.exit_code == 2 else 500


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Methods, Host and errors first; the security headers on whatever comes back."""
    settings = request.app[SETTINGS]
    if request.method not in ALLOWED_METHODS:
        response: web.StreamResponse = error_page(
            405, f"The UI is read-only: {request.method} is not served, only GET and HEAD.")
        response.headers["Allow"] = "GET, HEAD"
    elif settings.loopback_only and _host_name(request.host) not in settings.host_names:
        response = error_page(421, "This server answers only requests addressed to "
                                   + " or ".join(sorted(settings.host_names - {"[::1]"})))
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
        except NscasError as exc:
            status = fault_status(exc)
            if status >= 500:
                log.warning("%s %s: %d, %s", request.method, request.path, status, exc.message)
            response = error_page(status, exc.message)
            if status == 503:
                response.headers["Retry-After"] = str(RETRY_AFTER)
    _secure(response, raw=request.path.startswith("/raw/"))
    return response


def _host_name(host: str) -> str:
    host = host.lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_names(host: str, addresses: tuple[str, ...]) -> frozenset[str]:
    """The names a Host header may give a server started with ``--host host`` and bound to
    ``addresses``: the loopback names, ``host`` itself, each address and its names in the
    hosts database (``/etc/hosts`` first)."""
    names = set(LOOPBACK_NAMES)
    for value in (host, *addresses):
        names.add(_bracketed(value.lower()))
    for address in addresses:
        try:
            name, aliases, _ = socket.gethostbyaddr(address)
        except OSError:  # no name: the address alone
            continue
        names.update(n.lower() for n in (name, *aliases))
    return frozenset(names)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _secure(response: web.StreamResponse, *, raw: bool) -> None:
    if response.prepared:  # a stream: its headers went with its start (see stream_headers)
        return
    response.headers.update(security_headers(raw=raw))


def make_app(store: StoreReader, *, loopback_only: bool = True,
             host_names: frozenset[str] = LOOPBACK_NAMES,
             verify_slots: int = VERIFY_SLOTS_DEFAULT) -> web.Application:
    """The application over an open read-only store (the caller closes it)."""
    app = web.Application(middlewares=[guard], client_max_size=1024)
    app[SETTINGS] = Settings(store=store, loopback_only=loopback_only, host_names=host_names,
                             verify_slots=verify_slots)

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
          on_ready: Callable[[str], None], limits: HttpLimits = LIMITS) -> None:
    """Serve the UI until SIGINT or SIGTERM; ``on_ready`` gets the URL once it listens.

    A page's handler is cancelled when its client leaves, so a closed verify page ends its
    verification process."""
    import signal

    async def main() -> None:
        # The addresses the listener binds: getaddrinfo's, as create_server takes them.
        found = await asyncio.get_running_loop().getaddrinfo(host, None,
                                                             type=socket.SOCK_STREAM)
        names = await asyncio.to_thread(
            host_names, host, tuple(dict.fromkeys(str(info[4][0]) for info in found)))
        app = make_app(store, loopback_only=is_loopback(host), host_names=names)
        listening = await listen(app, limits, host=host, port=port, refusal=error_page,
                                 cancel_when_client_leaves=True)
        try:
            on_ready(listening.url + "/")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await listening.close()

    asyncio.run(main())
