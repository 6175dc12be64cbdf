"""What an object costs a store: the plain and the stored bytes of the leaves it reaches, and of
the delta bases those leaves need besides (docs/format.md §5.5.1): ``nscas du`` and ``show``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """The leaves an object reaches (through links and parts), each counted once."""

    leaves: int
    raw: int
    """Their plain bytes: what ``get`` writes out for each once."""
    stored: int
    """Their stored bytes (codec applied; inline leaves as they are)."""
    bases: int
    """Stored bytes of the delta bases they need that are not among them (another
    checkpoint's tensors, shared with it)."""

    @property
    def ratio(self) -> float:
        """Stored / raw (1.0 for an object of no bytes)."""
        return self.stored / self.raw if self.raw else 1.0


def usage(store: StoreReader, oid: Digest) -> Usage:
    """The :class:`Usage` of ``oid``."""
    own = store.closure([oid], with_parts=True, with_bases=False)
    needed = store.closure([oid], with_parts=True) - own
    raw = stored = leaves = 0
    for info in (store.info(d) for d in sorted(own)):
        if info.storage == "parts":
            continue
        leaves += 1
        raw += info.size
        stored += info.stored_size
    bases = sum(store.info(d).stored_size for d in sorted(needed))
    return Usage(leaves=leaves, raw=raw, stored=stored, bases=bases)
