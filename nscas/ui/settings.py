"""What every page handler reads of the UI's application: its settings (the store, the Host
names it answers, the verify slots) under typed application keys."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
VERIFY_SLOTS_DEFAULT = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    store: StoreReader
    loopback_only: bool
    """Refuse requests whose Host header names none of ``host_names``."""
    host_names: frozenset[str] = LOOPBACK_NAMES
    """What a Host header may name on loopback: the loopback names, the address the server is
    bound to, and that address's names (lower case, IPv6 in brackets)."""
    verify_slots: int = VERIFY_SLOTS_DEFAULT
    """Verifications that may run at once (one UI serves one store); one more waits for a slot,
    and one whose page closes stops waiting or is ended."""


STORE = web.AppKey("store", object)
SETTINGS = web.AppKey("settings", Settings)
VERIFY_SLOTS = web.AppKey("verify_slots", asyncio.Semaphore)
