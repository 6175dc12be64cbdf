"""Which run produced an object: the receipts that name it among their outputs.

The one lookup of producers in the product code (``nscas export`` of an output ref uses it);
the verifiers keep their own (they share no code with the store). Among several producers the
earliest succeeded receipt is the one, by ``started`` and then ID, as the cache picks a run
(docs/format.md §6.5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nscas.digests import Digest
    from nscas.reading import StoreReader

SIGNATURE = "signature/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Producers:
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
    """:func:`producers` of each ID, in two statements however many IDs (and however many
    records link to them): the ``$.outputs`` links to them (an index of their own: an object
    shared as an input, a code tree or an environment, has parents by the hundred thousand,
    none of which need reading), then the kinds of their parents with the receipts among them.
    ``known``: records already read (the parents found there are not read again); the
    receipts read are added to it."""
    links = store.output_links_to(ids)
    named: dict[Digest, set[Digest]] = {
        oid: {lk.parent for lk in found if lk.path[9:10] in (".", "[")}
        for oid, found in links.items()}
    records = {} if known is None else known
    parents = sorted(set().union(*named.values()) - records.keys())
    records.update(store.kinds_and_records(parents, ("receipt/1",))[1])
    out: dict[Digest, Producers] = {}
    for oid, found in named.items():
        runs = sorted((records[r]["started"], r) for r in found
                      if r in records and records[r].get("nscas") == "receipt/1"
                      and records[r]["status"] == "succeeded"
                      and str(oid) in records[r]["outputs"].values())
        out[oid] = Producers(output=oid, receipts=tuple(r for _, r in runs))
    return out


def signatures_of(store: StoreReader, receipts: Iterable[Digest]) -> list[Digest]:
    """The signature/1 records that sign any of ``receipts``, sorted: they link their receipt
    (``$.receipt``), so no closure of the receipts reaches them. Two statements however many
    receipts: their parents, then those parents' kinds."""
    signing = {link.parent for found in store.links_to_each(receipts).values()
               for link in found if link.path == "$.receipt"}
    return sorted(d for d, kind in store.kinds_of(sorted(signing)).items() if kind == SIGNATURE)
