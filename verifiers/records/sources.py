"""Read-only access to objects: one interface (``Source``) for a store and a bundle.

Readers hand out bytes as stored, *unverified*: re-hashing is the integrity checker's job
(``closure.py``), so that a corrupt object becomes a finding instead of a crash. The readers,
written from docs/format.md §1, §5 and docs/bundle.md and sharing no code with the store, are
``store.StoreSource``, ``store.TeamStoreSource`` and ``bundle.source.BundleSource``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..core.errors import VerifierError

HEX_PREFIX = re.compile(r"^(?:blake3:)?([0-9a-f]{8,64})$")


class BadTarget(VerifierError):
    """The TARGET argument names nothing usable (exit 2)."""

    def __init__(self, target: str, why: str) -> None:
        super().__init__(f"cannot verify {target!r}: {why}")
        self.target = target
        self.why = why


class SourceError(VerifierError):
    """A store or bundle cannot be opened or read at all (exit 2)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where
        self.why = why


class Unreadable(VerifierError):
    """An object is listed but its bytes cannot be produced (a chunk file is gone, zstd data
    is corrupt). ``missing`` is true when the bytes are simply absent (exit 3)."""

    def __init__(self, object_id: str, why: str, *, missing: bool) -> None:
        super().__init__(f"object {object_id}: {why}")
        self.object_id = object_id
        self.why = why
        self.missing = missing
        self.exit_code = 3 if missing else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectMeta:
    """What a source records about one object, before anything is re-hashed."""

    id: str
    """``blake3:`` ID."""
    size: int
    """Recorded size in bytes."""
    sha256: str | None
    """Recorded SHA-256 hex; None where the store has not computed it yet (a tensor object's
    SHA-256 is computed lazily, docs/format.md §1.2): nothing to compare then."""
    kind: str | None
    """Recorded record kind (``receipt/1``), None for a blob."""
    where: str
    """Where the bytes live, for messages (a store row, a bundle path)."""


class Source(Protocol):
    """Read-only object access shared by the store and bundle readers."""

    label: str
    """What is being read, for messages."""

    def meta(self, oid: str) -> ObjectMeta | None:
        """The recorded facts of ``oid``; None when the source does not hold it."""

    def omitted(self, oid: str) -> str | None:
        """Why ``oid`` was left out on purpose (a bundle without weights), else None."""

    def chunks(self, oid: str) -> Iterator[bytes]:
        """The object's bytes in pieces, unverified; raises ``Unreadable``/``MissingObject``."""

    def file_path(self, oid: str) -> Path | None:
        """A regular file holding exactly the object's bytes, if the source has one."""

    def resolve(self, text: str) -> str:
        """A full ID, ref name or unique hex prefix as a full ID; raises ``BadTarget``."""

    def parents(self, oid: str) -> list[str] | None:
        """IDs of the records that link ``oid``, or None when the source has no link index."""

    def created(self, oid: str) -> float | None:
        """When the source first stored ``oid`` (seconds since the epoch), if it knows."""


def read_all(source: Source, oid: str) -> bytes:
    return b"".join(source.chunks(oid))

