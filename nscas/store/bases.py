"""Which stored leaf a new piece of a file is tried against as a delta (docs/format.md §5.5.2).

A put that names a base file (the same file of the checkpoint a fine-tune started from, or of
an earlier version of a tree) gives each new piece a :class:`Hint`: the width of its tensor's
dtype, and the base's leaf holding the tensor of the same name, shape and dtype at the same
place within it, or else the base's leaf at the same offset of the same size. A base leaf that
is not in a chunk file, or whose chain is already :data:`codecs.CHAIN_MAX` deltas deep, is no
base.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from nscas.errors import CodecError, InvalidInput
from nscas.objects import codecs
from nscas.objects.codecs import Base
from nscas.objects.digests import Digest
from nscas.objects.segments import Segment, tensor_layout
from nscas.store.putting import NO_HINT, Hint

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

_HEADER_MAX = 100 << 20
Hints = Callable[[Segment, int, int], Hint]


def width_hints(seg: Segment, off: int, length: int) -> Hint:
    """No base: a tensor's pieces are tried as byte planes of its dtype's width."""
    w = codecs.dtype_width(seg.dtype)
    return NO_HINT if w == 1 else Hint(width=w)


def hints_from(store: StoreReader, base: Digest) -> Hints:
    """The hints of a put whose file is to be tried against the stored file ``base``."""
    info = store.info(base)  # NotFound for a base the store lacks
    if info.kind is not None:
        raise InvalidInput(f"{base} is a {info.kind} record; a delta base is a file")
    # (offset -> (leaf ID, codec, size, storage)) of every leaf of the base, in order.
    at: dict[int, tuple[Digest, str, int]] = {}
    offset = 0
    for leaf_id, codec, inline, size, _ in store.leaves(base):
        if inline is None:
            at[offset] = (leaf_id, codec, size)
        offset += size
    layouts: list[tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]] | None] = []

    def layout() -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]] | None:
        if not layouts:  # read once, and only for a put of tensors
            layouts.append(_tensors(store, base, info.size))
        return layouts[0]

    def leaf_at(where: int, length: int) -> Base | None:
        found = at.get(where)
        if found is None or found[2] != length:
            return None
        leaf_id, codec, size = found
        try:
            if store.chain_depth(leaf_id) >= codecs.CHAIN_MAX:
                return None
        except CodecError:  # a broken chain is fsck's to report; never build on it
            return None
        return Base(id=leaf_id, load=lambda: store.read_leaf(leaf_id, codec, None, size))

    def hint(seg: Segment, off: int, length: int) -> Hint:
        w = codecs.dtype_width(seg.dtype)
        where = seg.offset + off
        theirs_at = layout() if seg.tensor is not None else None
        if seg.tensor is not None and theirs_at is not None:
            theirs = theirs_at[1].get(seg.tensor)
            if theirs is not None and theirs[0] == seg.dtype and theirs[1] == seg.shape:
                where = theirs_at[0] + theirs[2] + off
        found = leaf_at(where, length)
        return Hint(width=w, base=found) if found is not None or w > 1 else NO_HINT

    return hint


def _tensors(store: StoreReader, oid: Digest, size: int
             ) -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]] | None:
    """(data section offset, tensor layout) of a stored file if it is a safetensors file."""
    if size < 8:
        return None
    with store.open(oid) as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > min(_HEADER_MAX, size - 8):
            return None
        layout = tensor_layout(f.read(hlen))
    return None if layout is None else (8 + hlen, layout)
