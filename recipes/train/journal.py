"""Per-rank training journals: hash-chained JSONL, appended and fsync'ed entry by entry.

Each entry carries ``prev`` (the previous entry's ``hash``, null for the first) and ``hash``,
the SHA-256 hex of the RFC 8785 encoding of the entry without ``hash``. A crash therefore
keeps every finished step, and any edit, reordering or deletion breaks the chain.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785

from nscas.errors import RecipeError
from nscas.objects.durable import sync

JOURNAL_FORMAT = "journal/1"


def entry_hash(entry: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of ``entry`` without its ``hash`` member."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    try:
        return hashlib.sha256(rfc8785.dumps(body)).hexdigest()
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise RecipeError(f"journal entry cannot be encoded canonically: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalState:
    """What an existing journal file holds: its checked entries and whether a torn last
    line (a crash in mid-write) was cut off."""

    entries: tuple[dict[str, Any], ...]
    head: str | None
    dropped_partial: bool
    valid_length: int
    """Bytes of the file that hold whole entries."""


def read_journal(path: Path) -> JournalState:
    """Read and check a journal; a final line without its newline is a torn write and is
    dropped, any other damage is an error naming the line."""
    if not path.exists():
        return JournalState(entries=(), head=None, dropped_partial=False, valid_length=0)
    data = path.read_bytes()
    dropped = bool(data) and not data.endswith(b"\n")
    if dropped:
        data = data[: data.rfind(b"\n") + 1]
    entries: list[dict[str, Any]] = []
    prev: str | None = None
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise RecipeError(f"journal {path} line {number} is not JSON: {exc}") from exc
        if not isinstance(entry, dict) or entry.get("prev") != prev:
            raise RecipeError(f"journal {path} line {number} does not continue the hash chain")
        if entry.get("hash") != entry_hash(entry):
            raise RecipeError(f"journal {path} line {number} has a wrong hash")
        prev = entry["hash"]
        entries.append(entry)
    return JournalState(
        entries=tuple(entries), head=prev, dropped_partial=dropped, valid_length=len(data)
    )


class Journal:
    """An open, append-only journal of one rank. Appends are durable when they return."""

    def __init__(self, path: Path) -> None:
        state = read_journal(path)
        if state.dropped_partial:
            # The torn line never completed; cut it so the chain stays readable.
            os.truncate(path, state.valid_length)
        self.path = path
        self.entries: list[dict[str, Any]] = list(state.entries)
        self.head: str | None = state.head
        self.dropped_partial = state.dropped_partial
        self._file = path.open("ab")

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Chain ``entry`` to the head, write it with its newline and fsync; returns it."""
        if "prev" in entry or "hash" in entry:
            raise RecipeError("journal entries get 'prev' and 'hash' from the journal only")
        chained = {**entry, "prev": self.head}
        chained["hash"] = entry_hash(chained)
        # Each line is exactly the entry's RFC 8785 bytes, so a verifier can check lines as stored.
        self._file.write(rfc8785.dumps(chained) + b"\n")
        sync(self._file)
        self.head = chained["hash"]
        self.entries.append(chained)
        return chained

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def effective_steps(entries: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The step entries that led to the final parameters, in step order: a ``resume`` event
    from step k discards the entries after k written before it (that work was redone)."""
    kept: dict[int, dict[str, Any]] = {}
    for entry in entries:
        if entry.get("event") == "resume":
            kept = {s: e for s, e in kept.items() if s <= entry["from_step"]}
        elif "step" in entry and "event" not in entry:
            kept[entry["step"]] = entry
    return [kept[s] for s in sorted(kept)]


def effective_outer_steps(entries: list[dict[str, Any]] | tuple[dict[str, Any], ...]
                          ) -> list[dict[str, Any]]:
    """The ``outer`` events (diloco) that led to the final parameters, in order: a ``resume``
    from step k discards those after k written before it, as ``effective_steps`` does."""
    kept: dict[int, dict[str, Any]] = {}
    for entry in entries:
        if entry.get("event") == "resume":
            kept = {s: e for s, e in kept.items() if s <= entry["from_step"]}
        elif entry.get("event") == "outer":
            kept[entry["step"]] = entry
    return [kept[s] for s in sorted(kept)]


LOSS_CLAIMS = ("first_loss", "last_loss", "mean_loss")
"""The train claims of the training loss (docs/format.md §3.10), in this order."""


def loss_claims(losses: Sequence[float]) -> dict[str, float]:
    """The loss claims of the effective steps' losses, in step order: ``first_loss`` and
    ``last_loss`` the first and last, ``mean_loss`` their ``math.fsum`` (the exact sum,
    rounded once) divided by their number. Empty when there are none."""
    if not losses:
        return {}
    return {"first_loss": float(losses[0]), "last_loss": float(losses[-1]),
            "mean_loss": math.fsum(losses) / len(losses)}
