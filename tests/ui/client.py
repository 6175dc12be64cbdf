"""Requests to the UI's application through aiohttp's test client (no subprocess)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDictProxy

from nscas.store.opening import open_store
from nscas.ui.app import make_app


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


def fetch(store_dir: Path, *paths: str, method: str = "GET",
          headers: dict[str, str] | None = None) -> list[Reply]:
    """Each path's reply from one app over the store (opened read-only, as ``nscas ui`` does)."""

    async def run() -> list[Reply]:
        store = open_store(store_dir, readonly=True)
        try:
            async with TestClient(TestServer(make_app(store))) as client:
                out = []
                for path in paths:
                    resp = await client.request(method, path, headers=headers,
                                                allow_redirects=False)
                    out.append(Reply(resp.status, resp.headers, await resp.read()))
                return out
        finally:
            store.close()

    return asyncio.run(run())


def get(store_dir: Path, path: str, **kwargs: object) -> Reply:
    return fetch(store_dir, path, **kwargs)[0]  # type: ignore[arg-type]
