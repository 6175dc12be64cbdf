"""Which run produced an object: the receipts that name it among their outputs.

The one lookup of producers in the product code (``nscas export`` of an output ref uses it);
the verifiers keep their own (they share no code with the store). Among several producers the
earliest succeeded receipt is the one, by ``started`` and then ID, as the cache picks a run
(docs/format.md §6.5).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from nscas.objects.digests import Digest
    from nscas.store.reading import StoreReader

SIGNATURE = "signature/1"


class Producers(NamedTuple):
    """The succeeded receipts that output one object, earliest first."""

    output: Digest
    receipts: tuple[Digest, ...]

    @property
    def first(self) -> Digest | None:
        """The producing receipt: the earliest by ``started``, then ID; None if no run did."""
        return self.receipts[0] if self.receipts else None


def producers(store: StoreReader, oid: Digest) -> Producers:
    """Every succeeded receipt whose ``outputs`` name ``oid``, earliest (``started``, ID) first."""
    return producers_of(store, [oid])[oid]


def producers_of(store: StoreReader, ids: Iterable[Digest],
                 known: dict[Digest, dict[str, Any]] | None = None) -> dict[Digest, Producers]:
    """:func:`producers` of each ID, in one statement however many IDs (and however many
    records link to them): the ``$.outputs`` links to them (an index of their own: an object
    shared as an input, a code tree or an environment, has parents by the hundred thousand,
    none of which need reading) with the receipts among their parents. ``known``: the receipts
    read are added to it."""
    linked = store.linked(ids, "outputs", ("receipt/1",))
    if known is not None:
        known.update(linked.records)
    out: dict[Digest, Producers] = {}
    for oid, found in linked.links.items():
        named = {lk.parent for lk in found if lk.path[9:10] in (".", "[")}
        runs = sorted((rec["started"], r) for r in named
                      if (rec := linked.records.get(r)) is not None
                      and rec["status"] == "succeeded" and str(oid) in rec["outputs"].values())
        out[oid] = Producers(output=oid, receipts=tuple(r for _, r in runs))
    return out


def signatures_of(store: StoreReader, receipts: Iterable[Digest]) -> list[Digest]:
    """The signature/1 records that sign any of ``receipts``, sorted: they link their receipt
    (``$.receipt``), so no closure of the receipts reaches them. Two statements however many
    receipts: their parents, then those parents' kinds."""
    signing = {link.parent for found in store.links_to_each(receipts).values()
               for link in found if link.path == "$.receipt"}
    return sorted(d for d, kind in store.kinds_of(sorted(signing)).items() if kind == SIGNATURE)
