"""Claims on actions: one process at a time runs an action, so that two runs of the same action
started at once (two ``nscas run`` processes, two jobs of one) execute it once, the later one
waiting and then reusing the receipt.

A local (SQLite) store lives on one host: the claim is a POSIX record lock on one byte of
``claims.lock`` in the store's directory, at an offset given by the action's digest, held by the claiming process and
dropped by the kernel if it dies. A team (PostgreSQL) store may be shared by many hosts: the
claim is a session advisory lock on the action, held on a connection of its own, which the
server drops with the connection.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from nscas.database import writes
from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.database.postgres import PgConnection
    from nscas.store.writer import Store

CLAIMS_FILE = "claims.lock"
CLAIM_CLASS = 0x6E736372  # PostgreSQL advisory lock class of action claims ("nscr")
CLAIM_SESSION = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5",
                 "tcp_keepalives_count": "3", "tcp_user_timeout": "30000"}
"""The server's TCP settings for a claim's session. A holder that dies on a live host loses
its claim at once (its host closes the connection); one whose host died or was cut off sends
nothing more, and the server ends its session, and the claim, once about 25 s of probes go
unanswered (30 s for data it sent), not after the system's default of over two hours: so a
step Ray retries on another node waits that long, not hours."""
_OFFSET_BYTES = 7  # offsets below 2^56: far inside off_t, and collisions need 2^28 actions


@contextmanager
def claim_action(store: Store, action: Digest) -> Iterator[None]:
    """Hold the claim on ``action`` for this process while the block runs (waiting while
    another process holds it)."""
    if store.config is not None:
        with _pg_claim(store, action):
            yield
        return
    fd = os.open(store.root / CLAIMS_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    offset = int(action.hex[:2 * _OFFSET_BYTES], 16)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, offset)
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextmanager
def _pg_claim(store: Store, action: Digest) -> Iterator[None]:
    assert store.config is not None
    key = int.from_bytes(bytes.fromhex(action.hex[:8]), "big", signed=True)
    c = claim_session(store.config.database)  # its own: the lock lives as long as it
    try:
        writes.hold_session_lock(c, CLAIM_CLASS, key)
        try:
            yield
        finally:
            writes.release_session_lock(c, CLAIM_CLASS, key)
    finally:
        c.close()


def claim_session(database: str) -> PgConnection:
    """A session of its own for one claim, which the server ends soon after its host dies."""
    from nscas.database.postgres import PgConnection

    return PgConnection(database, settings=CLAIM_SESSION)
