"""A delta leaf's chain of bases, checked on the database rows before any byte is decoded
(docs/format.md §5.5.1): each base present, in a chunk file, of the delta's size, the chain
at most ``codecs.CHAIN_MAX`` deep and never a cycle; and the base a decoder is handed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nscas.database import queries as q
from nscas.database.connections import Connection
from nscas.errors import CodecError, NotFound
from nscas.objects import codecs
from nscas.objects.codecs import Base
from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader


def base_of(store: StoreReader, oid: Digest, codec: str, size: int) -> Base:
    """The base leaf ``oid`` (in ``codec``, of ``size`` plain bytes) of a delta whose chain
    passed :func:`delta_chain`: its plain bytes checked against its ID, and, unchecked (their
    user checks the bytes made of them, docs/format.md §5.5.1), its plane stream of a width
    and its plain bytes. Nothing is read until the decoder asks."""
    from nscas.objects.decoding import decode, plane_stream

    def inner() -> Base | None:
        return store.leaf_base(oid, codec) if codecs.is_delta(codec) else None

    def stream(w: int) -> memoryview | None:
        if codecs.width(codec) != w or codecs.is_sub(codec):
            return None  # no plane stream of its plain bytes of that width
        return plane_stream(store.chunks.read_stored(oid, size), codec, oid, size, w,
                            where=store.chunks.location(oid), base=inner())

    def plain() -> bytes:
        return decode(store.chunks.read_stored(oid, size), codec, oid, size,
                      where=store.chunks.location(oid), base=inner())

    return Base(id=oid, load=lambda: store.read_leaf(oid, codec, None, size), stream=stream,
                plain=plain)


def delta_chain(c: Connection, oid: Digest, size: int, named: str | None
           ) -> tuple[Digest, str, int, int]:
    """(base ID, its codec, its size, chain depth) of a delta of ``size`` plain bytes whose
    row names ``named``: every base present, stored in a chunk file, of the same size, at most
    :data:`codecs.CHAIN_MAX` deltas deep and never a cycle, or a :class:`CodecError` saying
    which (``bad-base`` or ``bad-chain``)."""
    if named is None:
        raise CodecError(oid, "the base of a delta named by its row", "none", problem="bad-base")
    seen = {oid.hex}
    depth = 1
    first: tuple[str, int] | None = None
    at = named
    while True:
        if at in seen:
            raise CodecError(oid, "a chain of deltas without a cycle",
                             f"blake3:{at} twice in its chain", problem="bad-chain")
        row = q.delta_row(c, at)
        if row is None:
            raise CodecError(oid, f"its base blake3:{at} in the store", "none",
                             problem="bad-base")
        if row.storage != "file" or row.size != size:
            raise CodecError(oid, f"a base of {size} bytes in a chunk file",
                             f"blake3:{at} of {row.size} bytes, storage {row.storage}",
                             problem="bad-base")
        if first is None:
            first = (row.codec, row.size)
        if not codecs.is_delta(row.codec):
            return Digest(named), first[0], first[1], depth
        if row.base is None:
            raise CodecError(oid, f"a base for blake3:{at} in its chain", "none",
                             problem="bad-base")
        depth += 1
        if depth > codecs.CHAIN_MAX:
            raise CodecError(oid, f"a chain at most {codecs.CHAIN_MAX} deltas deep",
                             "a longer one", problem="bad-chain")
        seen.add(at)
        at = row.base


def stored_chain(c: Connection, oid: Digest, arriving: tuple[Digest | None, int] | None
                 ) -> tuple[Digest, str, int, int]:
    """:func:`delta_chain` of a stored delta leaf, its size and base from its row; or, for a
    leaf not stored yet (a transfer brings it), ``arriving`` = (the base it names, its size)."""
    if arriving is None:
        row = q.delta_row(c, oid.hex)
        if row is None:
            raise NotFound(str(oid))
        return delta_chain(c, oid, row.size, row.base)
    return delta_chain(c, oid, arriving[1], arriving[0].hex if arriving[0] is not None else None)


def chain_depth(c: Connection, oid: Digest) -> int:
    """How many deltas deep a stored leaf is (0: not a delta); a broken chain is a
    :class:`CodecError`."""
    row = q.delta_row(c, oid.hex)
    if row is None:
        raise NotFound(str(oid))
    if not codecs.is_delta(row.codec):
        return 0
    return delta_chain(c, oid, row.size, row.base)[3]
