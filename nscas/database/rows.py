"""What the store's reads return: the typed rows of nscas.database.queries (a column added to a
table is added here and in the query that reads it, next to its migration)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from nscas.objects.digests import Digest


class ObjectInfo(NamedTuple):
    id: Digest
    size: int
    sha256: str | None
    """None while unknown: a tensor object put without it (docs/format.md §1.2); ask
    ``sha256()``, which computes it (and, on a writer, records it)."""
    kind: str | None  # record kind, or None for a blob
    storage: str
    codec: str
    stored_size: int
    created: float
    base: Digest | None = None
    """The base leaf of a delta (codec ``xorW``, docs/format.md §5.5.1); None otherwise."""


class RefEntry(NamedTuple):
    name: str
    old: Digest | None
    new: Digest
    at: float
    message: str


class Link(NamedTuple):
    parent: Digest
    path: str
    child: Digest


LinkWay = Literal["from", "to", "outputs"]
"""Which links of an object: its own (to its children), those to it (from its parents), or those
to it from ``$.outputs`` paths (the receipts of the runs that made it)."""


class Linked(NamedTuple):
    """Links of some IDs with what is at their other ends (``StoreReader.linked``)."""

    links: dict[Digest, list[Link]]
    """Each asked ID's links, in the order its way reads them."""
    kinds: dict[Digest, str | None]
    """The kind (None: a blob) of each stored object at a link's other end."""
    records: dict[Digest, dict[str, Any]]
    """The records among those ends of the kinds asked for."""


class StoredLeaf(NamedTuple):
    """How a stored object's bytes are kept, as a put that would reuse it needs to know."""

    size: int
    sha256: str | None
    storage: str
    codec: str
    stored_size: int
    base: str | None = None


class DeltaRow(NamedTuple):
    """What checking a delta's chain needs of one leaf's row (docs/format.md §5.5.1)."""

    codec: str
    size: int
    storage: str
    base: str | None


Leaf = tuple[Digest, str, bytes | None, int, Digest | None]
"""(ID, codec, inline data or None, recorded size, the base its row names or None) of one leaf
of an object."""
