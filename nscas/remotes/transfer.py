"""Remotes: other stores this one pushes to and pulls from (docs/format.md §5.11).

A remote is another store, named by a path: a store directory, a directory holding ``.nscas``,
or a team store's ``store.toml`` (PostgreSQL + object storage). The names live in the store
directory's ``remotes.toml``, this machine's own, as a team store's work areas are.

A transfer sends exactly the objects of the target's closure (its parts, and the signature/1
records of its receipts with what they link), and for a target that a receipt produced that
receipt's closure too (the evidence, as ``export`` takes it: the other side can verify what
it got), that the other side lacks, children before
parents: each one is committed there on its own, so the other store holds a closed set at every
moment, and a transfer killed half-way is resumed by running it again (only what is still
missing goes). Every object is checked on arrival: a leaf's bytes are re-hashed by the store
that writes them (a chunk-file leaf travels in its stored codec, after its delta base, and is
decoded there to check it: docs/format.md §5.5.1), a record's by the put that names it, and an object of parts against the
bytes of its parts in order. Puts are idempotent, so two transfers may run at once. A ref named
as the target moves on the other side by compare-and-swap, and only from a value this side's
ref once held (it moved on from there), never over one it did not.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nscas.errors import (
    ConfigError,
    IntegrityError,
    InvalidInput,
    NotFound,
    NscasError,
    RefConflict,
)
from nscas.objects.digests import Digest, DualHasher
from nscas.store.config import toml_string
from nscas.store.locating import HEXISH, REF_NAME, store_dir_of
from nscas.store.provenance import producers, signatures_of
from nscas.store.reading import StoreReader

if TYPE_CHECKING:
    from nscas.store.writer import Store

REMOTES_NAME = "remotes.toml"
REMOTE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
DEFAULT_REMOTE = "origin"
_RECORD_BATCH = 500  # consecutive records put in one transaction (each links only earlier ones)


@dataclass(frozen=True, slots=True, kw_only=True)
class Remote:
    name: str
    url: str
    """The other store: an absolute path of a store directory or of a team store's store.toml."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferReport:
    """What a push or pull did."""

    target: Digest
    ref: str | None
    """The ref named as the target, if one was."""
    producer: Digest | None
    """The receipt that produced the target (nscas.store.provenance: the earliest), sent with it."""
    objects: int
    """Objects in the closure sent (parts, signatures and the producer's included)."""
    sent: int
    """Objects the other side lacked and now holds."""
    bytes_sent: int
    """Bytes of the leaves sent: a chunk-file leaf's stored bytes (its codec's), an inline
    leaf's plain bytes."""
    ref_moved: bool
    """Whether the ref was set or moved on the receiving side."""


class DivergedRef(NscasError):
    """The receiving side's ref holds a value the sending side's ref never held."""

    def __init__(self, name: str, receiver: str, value: str, sender: str) -> None:
        super().__init__(f"ref {name!r} in {receiver} is {value}, which {name!r} in {sender} "
                         "never held: the two have diverged; bring that value over first (pull "
                         "or push it) or use another ref name")
        self.name = name
        self.receiver = receiver
        self.value = value
        self.sender = sender


# ------------------------------------------------------------------ remotes.toml


def read_remotes(root: Path) -> dict[str, Remote]:
    """The remotes of the store directory ``root``, by name (none: an empty dict)."""
    path = root / REMOTES_NAME
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None
    if set(raw) - {"remote"} or not isinstance(raw.get("remote", {}), dict):
        raise ConfigError(str(path), "expected only [remote.NAME] tables")
    out: dict[str, Remote] = {}
    for name, table in raw.get("remote", {}).items():
        if not REMOTE_NAME.fullmatch(name) or not isinstance(table, dict) \
                or set(table) != {"url"} or not isinstance(table["url"], str):
            raise ConfigError(str(path), f"[remote.{name}] must hold exactly url = \"...\"")
        out[name] = Remote(name=name, url=table["url"])
    return out


def _write_remotes(root: Path, remotes: dict[str, Remote]) -> None:
    lines = ["# Remotes of this store (nscas remote add NAME URL): other stores it syncs with."]
    for r in sorted(remotes.values(), key=lambda r: r.name):
        lines += ["", f"[remote.{r.name}]", f"url = {toml_string(r.url)}"]
    tmp = root / f".{REMOTES_NAME}.tmp"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, root / REMOTES_NAME)


def add_remote(root: Path, name: str, url: str) -> Remote:
    """Name another store (it must be one now); a name already taken is refused."""
    if not REMOTE_NAME.fullmatch(name):
        raise InvalidInput(f"invalid remote name {name!r}: use letters, digits, '.', '_', '-'")
    remotes = read_remotes(root)
    if name in remotes:
        raise InvalidInput(f"remote {name!r} exists already ({remotes[name].url}); "
                           "remove it first")
    path = Path(url).expanduser()
    if "://" in url or not url:
        raise InvalidInput(f"invalid remote URL {url!r}: give the path of a store directory or of "
                           "a team store's store.toml")
    there = store_dir_of(path.absolute())  # StoreError naming the path if it holds no store
    if there.resolve() == root.resolve():
        raise InvalidInput(f"{url} is this store itself")
    remote = Remote(name=name, url=os.path.abspath(path))
    _write_remotes(root, {**remotes, name: remote})
    return remote


def remove_remote(root: Path, name: str) -> Remote:
    remotes = read_remotes(root)
    if name not in remotes:
        raise NotFound(f"remote {name!r}" + _known(remotes))
    gone = remotes.pop(name)
    _write_remotes(root, remotes)
    return gone


def pick_remote(root: Path, name: str | None) -> Remote:
    """The remote called ``name``; without one, the only remote, else ``origin``."""
    remotes = read_remotes(root)
    if name is None:
        if len(remotes) == 1:
            return next(iter(remotes.values()))
        if DEFAULT_REMOTE in remotes:
            return remotes[DEFAULT_REMOTE]
        raise InvalidInput("no remote given and no single or 'origin' remote: name one "
                           "(nscas remote add NAME URL)" + _known(remotes))
    if name not in remotes:
        raise NotFound(f"remote {name!r}" + _known(remotes))
    return remotes[name]


def _known(remotes: dict[str, Remote]) -> str:
    return f" (remotes: {', '.join(sorted(remotes))})" if remotes else " (no remotes)"


# ------------------------------------------------------------------ transfer


def transfer(sender: StoreReader, receiver: Store, target_text: str, *,
             sent_one: Callable[[Digest, int], object] = lambda oid, n: None) -> TransferReport:
    """Bring ``target_text`` (an ID, prefix or ref of ``sender``) and its closure into
    ``receiver``; a ref named so moves there too. ``sent_one(id, bytes)`` after each object."""
    target = sender.resolve(target_text)
    ref = target_text if (REF_NAME.fullmatch(target_text) and not HEXISH.fullmatch(target_text)
                          and sender.ref_get(target_text) == target) else None
    producer = None if sender.info(target).kind == "receipt/1" else producers(sender, target).first
    wanted = _closure(sender, [target] if producer is None else [target, producer])
    present = set(receiver.kinds_of(wanted))
    order = _children_first(sender, wanted - present)
    sent = bytes_sent = 0
    records: list[tuple[Digest, bytes]] = []

    def flush() -> None:
        nonlocal sent
        if records:
            got = receiver.put_records([data for _, data in records])
            for (oid, _), made in zip(records, got, strict=True):
                if made != oid:
                    raise IntegrityError(f"record {oid} sent", str(oid), str(made))
                sent_one(oid, 0)
            sent += len(records)
            records.clear()

    for oid in order:
        info = sender.info(oid)
        if info.kind is not None:
            records.append((oid, sender.get_bytes(oid)))  # checked against its ID as read
            if len(records) >= _RECORD_BATCH:
                flush()
            continue
        flush()  # a record may link this blob only once it is there
        if info.storage == "parts":
            receiver.put_whole(oid, sender.part_ids(oid), sha256=_check_whole(sender, oid))
            n = 0
        elif info.storage == "file":
            stored = sender.chunks.read_stored(oid, info.size)
            receiver.put_stored(oid, info.codec, info.size, stored, base=info.base)
            n = len(stored)
        else:
            data = sender.get_bytes(oid)
            made = receiver.put_bytes(data)  # re-hashed as it is written
            if made != oid:
                raise IntegrityError(f"object {oid} sent", str(oid), str(made))
            n = len(data)
        sent += 1
        bytes_sent += n
        sent_one(oid, n)
    flush()
    moved = _move_ref(sender, receiver, ref, target) if ref is not None else False
    return TransferReport(target=target, ref=ref, producer=producer, objects=len(wanted), sent=sent,
                          bytes_sent=bytes_sent, ref_moved=moved)


def _closure(store: StoreReader, roots: list[Digest]) -> set[Digest]:
    """The roots' closure with parts, and every signature of its receipts with theirs."""
    ids = store.closure(roots, with_parts=True)
    signatures = signatures_of(store, [d for d, k in store.kinds_of(ids).items()
                                       if k == "receipt/1"])
    return ids | store.closure(signatures, with_parts=True) if signatures else ids


def _children_first(store: StoreReader, missing: set[Digest]) -> list[Digest]:
    """``missing`` in an order where each object comes after every child and part it has."""
    order: list[Digest] = []
    done: set[Digest] = set()
    for root in sorted(missing):
        stack: list[tuple[Digest, bool]] = [(root, False)]
        while stack:
            oid, leaving = stack.pop()
            if leaving:
                order.append(oid)
                continue
            if oid in done:
                continue
            done.add(oid)
            stack.append((oid, True))
            below = [link.child for link in store.links_from(oid)]
            below += [part for _, part in store.part_ids(oid)]
            base = store.info(oid).base  # a delta's base goes first
            if base is not None:
                below.append(base)
            stack.extend((d, False) for d in sorted(set(below)) if d in missing and d not in done)
    return order


def _check_whole(store: StoreReader, oid: Digest) -> str:
    """The SHA-256 of an object of parts, from its parts' bytes, which must give its ID."""
    h = DualHasher()
    with store.open(oid) as f:  # every leaf checked as read, the whole against ``oid`` at end
        while block := f.read(8 << 20):
            h.update(block)
    if h.digest() != oid:
        raise IntegrityError(f"object {oid}", str(oid), str(h.digest()))
    return h.sha256()


def _move_ref(sender: StoreReader, receiver: Store, ref: str, target: Digest) -> bool:
    """Compare-and-swap the receiver's ``ref`` to ``target``, from unset or from a value the
    sender's ref held before it moved on (its ref log says). Another transfer that moved it to
    ``target`` meanwhile is no conflict."""
    for _ in range(3):
        there = receiver.ref_get(ref)
        if there == target:
            return False
        if there is not None and there not in {e.new for e in sender.ref_log(ref)}:
            raise DivergedRef(ref, str(receiver.root), str(there), str(sender.root))
        try:
            receiver.ref_set(ref, target, expect=there, message=f"from {sender.root}")
            return True
        except RefConflict:
            continue  # moved meanwhile: judge its new value
    receiver.ref_set(ref, target, expect=there, message=f"from {sender.root}")
    return True
