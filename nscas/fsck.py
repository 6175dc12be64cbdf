"""Store checks (``fsck``) and garbage collection (``gc``): every finding, never just the first."""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import blake3

from nscas import canonical, kinds
from nscas.digests import Digest
from nscas.errors import NscasError

if TYPE_CHECKING:
    from nscas.store import ObjectInfo, Store

Severity = Literal["error", "note"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    object: str | None  # the object ID (or ref name, or file) the finding is about
    problem: str  # a short stable name, e.g. "hash-mismatch", "missing-chunk"
    detail: str
    severity: Severity = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class FsckReport:
    findings: tuple[Finding, ...]
    objects: int
    deep_checked: int
    deep_bytes: int
    complete: bool  # False when --max-seconds stopped the deep pass early
    seconds: float

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True, kw_only=True)
class GcReport:
    dry_run: bool
    objects: tuple[Digest, ...]
    bytes: int
    temporary_files: tuple[Path, ...]
    orphan_chunks: tuple[str, ...] = field(default=())


def fsck(store: Store, *, deep: bool = False, sample: float = 1.0, max_seconds: float | None = None,
         seed: int | None = None, on_object: Callable[[int], None] | None = None) -> FsckReport:
    """Check rows, records, links, refs and (``deep``) every stored byte against its ID."""
    t0 = time.monotonic()
    findings: list[Finding] = []
    rng = random.Random(seed)
    infos: dict[str, ObjectInfo] = {}
    file_leaves: set[str] = set()
    deep_checked = deep_bytes = 0
    complete = True
    for info in store.iter_objects():
        infos[info.id.hex] = info
        if info.storage == "file":
            file_leaves.add(info.id.hex)
        findings.extend(_check_row(store, info))
        if info.kind is not None:
            findings.extend(_check_record(store, info))
        if on_object is not None:
            on_object(1)
    if deep:
        tops = _top_level(store, infos)
        if sample < 1.0:
            tops = [t for t in tops if rng.random() < sample]
        verified: set[str] = set()
        for info in tops:
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                complete = False
                findings.append(Finding(object=None, problem="incomplete", severity="note",
                                        detail=f"--max-seconds {max_seconds:g} reached after {deep_checked} objects"))
                break
            findings.extend(_rehash(store, info, verified))
            deep_checked += 1
            deep_bytes += info.size
    for name, target in store.ref_list():
        if target.hex not in infos:
            findings.append(Finding(object=name, problem="dangling-ref", detail=f"ref points at absent {target}"))
    for path in store.chunks.temporary_files():
        findings.append(Finding(object=str(path), problem="temporary-file", severity="note",
                                detail="left by an interrupted write; 'nscas gc' removes it"))
    orphans = [h for h in store.chunks.iter_ids() if h not in file_leaves]
    if orphans:
        findings.append(Finding(object=None, problem="orphan-chunks", severity="note",
                                detail=f"{len(orphans)} chunk file(s) no object uses; 'nscas gc' removes them"))
    return FsckReport(findings=tuple(findings), objects=len(infos), deep_checked=deep_checked,
                      deep_bytes=deep_bytes, complete=complete, seconds=time.monotonic() - t0)


def _check_row(store: Store, info: ObjectInfo) -> list[Finding]:
    oid = str(info.id)
    out: list[Finding] = []
    if info.storage == "inline":
        data = store.inline_data(info.id)
        if data is None or len(data) != info.size:
            out.append(Finding(object=oid, problem="inline-size", detail="inline bytes missing or of the wrong size"))
    elif info.storage == "file":
        path = store.chunks.path(info.id.hex)
        if not path.is_file():
            out.append(Finding(object=oid, problem="missing-chunk", detail=f"chunk file {path} is missing"))
        elif path.stat().st_size != info.stored_size:
            out.append(Finding(object=oid, problem="chunk-size",
                               detail=f"chunk file holds {path.stat().st_size} bytes, expected {info.stored_size}"))
    elif info.storage == "parts":
        rows = store.part_rows(info.id)
        offset = 0
        for idx, off, part in rows:
            if off != offset:
                out.append(Finding(object=oid, problem="parts-layout", detail=f"part {idx} starts at {off}, expected {offset}"))
                break
            try:
                offset += store.info(part).size
            except NscasError:
                out.append(Finding(object=oid, problem="missing-part", detail=f"part {idx} {part} is absent"))
                break
        else:
            if offset != info.size:
                out.append(Finding(object=oid, problem="parts-layout", detail=f"parts cover {offset} bytes, expected {info.size}"))
    else:
        out.append(Finding(object=oid, problem="unknown-storage", detail=f"storage {info.storage!r}"))
    return out


def _check_record(store: Store, info: ObjectInfo) -> list[Finding]:
    oid = str(info.id)
    data = store.inline_data(info.id)
    if data is None:
        return [Finding(object=oid, problem="record-storage", detail="records are stored inline")]
    try:
        value = canonical.decode(data)
        kind = kinds.validate(value)
    except NscasError as exc:
        return [Finding(object=oid, problem="invalid-record", detail=exc.message)]
    out: list[Finding] = []
    if kind != info.kind:
        out.append(Finding(object=oid, problem="record-kind", detail=f"row says {info.kind}, bytes say {kind}"))
    want = {(p, d) for p, d in canonical.iter_links(value)}
    have = {(lk.path, lk.child) for lk in store.links_from(info.id)}
    for path, child in sorted(want - have):
        out.append(Finding(object=oid, problem="unindexed-link", detail=f"link {path} -> {child} is not indexed"))
    for path, child in sorted(have - want):
        out.append(Finding(object=oid, problem="stray-link", detail=f"indexed link {path} -> {child} is not in the record"))
    absent = [d for _, d in want if not store.has(d)]
    for d in absent:
        out.append(Finding(object=oid, problem="broken-closure", detail=f"links to absent {d}"))
    return out


def _top_level(store: Store, infos: dict[str, ObjectInfo]) -> list[ObjectInfo]:
    """Objects that are not a part of another: re-hashing these covers every stored byte."""
    inner: set[str] = set()
    for info in infos.values():
        if info.storage == "parts":
            inner.update(p.hex for _, _, p in store.part_rows(info.id))
    return [i for h, i in infos.items() if h not in inner]


def _rehash(store: Store, info: ObjectInfo, verified: set[str]) -> list[Finding]:
    """One read of every leaf: each leaf's BLAKE3, and the whole object's BLAKE3, SHA-256 and size."""
    oid = str(info.id)
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    sha = hashlib.sha256()
    size = 0
    out: list[Finding] = []
    try:
        for hex_id, codec, inline in store.leaves(info.id):
            data = store.read_leaf(hex_id, codec, inline)  # checks the leaf's own ID
            verified.add(hex_id)
            whole.update(data)
            sha.update(data)
            size += len(data)
    except NscasError as exc:
        return [Finding(object=oid, problem="hash-mismatch", detail=exc.message)]
    if whole.hexdigest() != info.id.hex:
        out.append(Finding(object=oid, problem="hash-mismatch", detail=f"bytes hash to blake3:{whole.hexdigest()}"))
    if sha.hexdigest() != info.sha256:
        out.append(Finding(object=oid, problem="sha256-mismatch", detail=f"recorded {info.sha256}, bytes give {sha.hexdigest()}"))
    if size != info.size:
        out.append(Finding(object=oid, problem="size-mismatch", detail=f"recorded {info.size}, bytes give {size}"))
    return out


def gc(store: Store, *, dry_run: bool = False) -> GcReport:
    """Remove objects no ref, tag or receipt reaches, plus temporary and orphan chunk files."""
    roots = [target for _, target in store.ref_list()]
    roots += [info.id for info in store.iter_objects() if info.kind == "receipt/1"]
    keep = {d.hex for d in store.closure(roots, with_parts=True)}
    doomed = [info for info in store.iter_objects() if info.id.hex not in keep]
    file_ids = {info.id.hex for info in store.iter_objects() if info.storage == "file" and info.id.hex in keep}
    orphans = tuple(h for h in store.chunks.iter_ids() if h not in file_ids and h not in {d.id.hex for d in doomed})
    temps = tuple(store.chunks.temporary_files())
    report = GcReport(dry_run=dry_run, objects=tuple(i.id for i in doomed),
                      bytes=sum(i.stored_size for i in doomed), temporary_files=temps, orphan_chunks=orphans)
    if not dry_run:
        if doomed:
            store.delete_objects([i.id for i in doomed])
        for h in orphans:
            store.chunks.remove(h)
        for p in temps:
            p.unlink(missing_ok=True)
    return report
