"""Which run produced an object: the receipts that name it among their outputs.

The one lookup of producers in the product code (``nscas export`` of an output ref uses it);
the verifiers keep their own (they share no code with the store). Among several producers the
earliest succeeded receipt is the one, by ``started`` and then ID, as the cache picks a run
(docs/format.md §6.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nscas.digests import Digest
    from nscas.reading import StoreReader


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
    # Only a receipt's $.outputs links can name it: an object shared as an input (a code tree,
    # an environment) has parents by the hundred thousand, none of which need reading.
    parents = sorted({link.parent for link in store.links_to(oid, path_prefix="$.outputs")
                      if link.path[9:10] in (".", "[")})
    found = []
    for parent, kind in sorted(store.kinds_of(parents).items()):
        if kind != "receipt/1":
            continue
        receipt = store.get_record(parent)
        if receipt["status"] == "succeeded" and str(oid) in receipt["outputs"].values():
            found.append((receipt["started"], parent))
    return Producers(output=oid, receipts=tuple(r for _, r in sorted(found)))
