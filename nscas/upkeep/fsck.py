"""Store checks (``fsck``) and garbage collection (``gc``): every finding, never just the first.

fsck has three depths, each proving more than the one before:

- rows (the default; reads no stored bytes): every inline row holds ``size`` bytes, every chunk
  file exists with its recorded stored size, every parts list tiles its object (no gap, no
  overlap, every part present, sizes summing to the object's), every record is canonical, valid
  for its kind, with its links indexed and present, and every ref names a present object.
  Always also: the schema is the one the migrations create (every table, column, index and
  insert-only trigger, no trigger of anyone else's, no row left in ``gc_session``), and every
  ref agrees with its ref log: it exists exactly when the log says it was set, points where the
  log's last entry does, each entry moves on from the one before, and no tag ever moved. A
  table or trigger dropped by hand, or a ref changed by a direct ``UPDATE``, is a finding.
- deep: also every stored leaf (chunk file, zstd decoded, or inline row) read once and hashed
  with BLAKE3 against its ID, its plain size against the row. Every stored byte belongs to
  exactly one leaf, so any change to what a leaf holds is found, at about one BLAKE3 pass over
  the store. Of a parts row, only that its part exists with the right size. SHA-256 only of
  objects whose SHA-256 was recorded after their put (lazily, docs/format.md §1.2).
- full: instead re-read every top-level object (no part of another) through its parts: each
  leaf against its ID, and the object's BLAKE3 (the ID), SHA-256 and size. This also proves that
  the parts rows assemble the right bytes and that top-level SHA-256 values hold, for a SHA-256
  pass and one read of a shared part per object using it.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import blake3

from nscas.errors import (
    CodecError,
    DamagedStore,
    DecodeBoundExceeded,
    IntegrityError,
    InvalidInput,
    NscasError,
)
from nscas.objects import canonical, kinds
from nscas.objects.digests import Digest, blake3_hex
from nscas.store.locating import is_tag

if TYPE_CHECKING:
    from nscas.store.reading import ObjectInfo, RefEntry, StoreReader
    from nscas.store.workarea import AreaVerdict

Severity = Literal["error", "note"]
Mode = Literal["rows", "deep", "full"]

DEFAULT_MIN_AGE = 3600.0  # seconds; gc keeps anything younger (see gc)
_THREADS = 2  # leaves hashed at once: blake3 and hashlib release the GIL on large inputs
_IN_FLIGHT = 4  # leaves submitted but not yet checked: bounds memory and the --max-seconds overrun
_OBJECT_TABLES = ("objects", "object_sha256", "parts", "links")  # what the object walk reads


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
    mode: Mode
    deep_checked: int  # leaves hashed (deep) or top-level objects re-read (full)
    deep_bytes: int  # plain bytes hashed
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
    min_age: float
    objects: tuple[Digest, ...]
    bytes: int
    temporary_files: tuple[Path, ...]
    orphan_chunks: tuple[Digest, ...] = field(default=())
    young_objects: int = 0  # unreachable, but kept (with all they reach): younger than min_age
    young_files: int = 0  # temporary and orphan chunk files kept: younger than min_age
    work_areas: tuple[AreaVerdict, ...] = ()  # every work area seen, removed or kept, and why


def fsck(store: StoreReader, *, deep: bool = False, full: bool = False, sample: float = 1.0,
         max_seconds: float | None = None, seed: int | None = None,
         on_object: Callable[[int], None] | None = None) -> FsckReport:
    """Check rows, records, links and refs; ``deep``: every stored leaf against its ID once;
    ``full`` (implies deep): every top-level object re-read whole (BLAKE3, SHA-256, size)."""
    t0 = time.monotonic()
    mode: Mode = "full" if full else "deep" if deep else "rows"
    diffs = store.schema_differences()
    findings: list[Finding] = [
        Finding(object=d.name, problem=d.problem, detail=d.detail,
                severity="error" if d.harmful else "note") for d in diffs]
    damaged = {d.name.partition(".")[0] for d in diffs
               if d.problem in ("missing-table", "missing-column")}

    def unusable(what: str, tables: tuple[str, ...]) -> bool:
        gone = sorted(damaged.intersection(tables))
        if gone:
            findings.append(Finding(object=None, problem="check-skipped", severity="note",
                                    detail=f"{what} not checked: table(s) {', '.join(gone)} "
                                           "damaged (reported above)"))
        return bool(gone)

    rng = random.Random(seed)
    infos: dict[str, ObjectInfo] = {}
    file_leaves: set[Digest] = set()
    checked = checked_bytes = 0
    complete = True
    objects_ok = not unusable("objects, records and links", _OBJECT_TABLES)
    for info in store.iter_objects() if objects_ok else ():
        infos[info.id.hex] = info
        if info.storage == "file":
            file_leaves.add(info.id)
        findings.extend(_check_row(store, info))
        if info.kind is not None:
            findings.extend(_check_record(store, info))
        if on_object is not None:
            on_object(1)
    if mode != "rows" and objects_ok:
        if mode == "full":
            targets = _top_level(store, infos)
        else:
            targets = [i for i in infos.values() if i.storage != "parts"]
        if sample < 1.0:
            targets = [t for t in targets if rng.random() < sample]

        def check(info: ObjectInfo) -> list[Finding]:
            return _rehash(store, info) if mode == "full" else _check_leaf(store, info)

        deadline = None if max_seconds is None else t0 + max_seconds
        for info, found in _two_at_a_time(targets, check, deadline):
            findings.extend(found)
            checked += 1
            checked_bytes += info.size
        # A SHA-256 recorded after the put (docs/format.md §1.2) is checked against the bytes
        # too, once: the deep pass hashes leaves with BLAKE3 only, and full mode re-reads
        # top-level objects only.
        rehashed = {t.id for t in targets} if mode == "full" else set()
        lazy = [(oid, sha) for oid, sha in store.lazy_sha256() if oid not in rehashed]
        if sample < 1.0:
            lazy = [x for x in lazy if rng.random() < sample]
        for oid, sha in lazy:
            if deadline is not None and time.monotonic() > deadline:
                break
            findings.extend(_check_lazy_sha256(store, oid, sha))
            checked_bytes += infos[oid.hex].size if oid.hex in infos else 0
        if checked < len(targets):
            complete = False
            findings.append(Finding(object=None, problem="incomplete", severity="note",
                                    detail=f"--max-seconds {max_seconds:g} reached after {checked} "
                                           f"of {len(targets)} objects"))
    if not unusable("refs", ("refs",)):
        current = store.ref_list()
        if objects_ok:
            findings.extend(Finding(object=name, problem="dangling-ref",
                                    detail=f"ref points at absent {target}")
                            for name, target in current if target.hex not in infos)
        if not unusable("refs against the ref log", ("ref_log",)):
            findings.extend(_check_ref_log(dict(current), store.ref_log()))
    for path in store.chunks.temporary_files():
        findings.append(Finding(object=str(path), problem="temporary-file", severity="note",
                                detail="left by a write in progress or one a crash interrupted; "
                                       "'nscas gc' removes it once older than --min-age"))
    orphans = [h for h in store.chunks.iter_ids() if h not in file_leaves] if objects_ok else []
    if orphans:
        findings.append(Finding(object=None, problem="orphan-chunks", severity="note",
                                detail=f"{len(orphans)} chunk file(s) no object uses; 'nscas gc' "
                                       "removes those older than --min-age"))
    return FsckReport(findings=tuple(findings), objects=len(infos), mode=mode, deep_checked=checked,
                      deep_bytes=checked_bytes, complete=complete, seconds=time.monotonic() - t0)


def _check_ref_log(current: dict[str, Digest], log: list[RefEntry]) -> list[Finding]:
    """Every ref against its ref log (given newest first): the log is insert-only, the refs
    table is not, so a ref moved or removed by hand disagrees with its log's last entry."""
    out: list[Finding] = []
    by_name: dict[str, list[RefEntry]] = {}
    for entry in reversed(log):
        by_name.setdefault(entry.name, []).append(entry)
    for name in sorted(current.keys() | by_name.keys()):
        entries = by_name.get(name, [])
        target = current.get(name)
        before: Digest | None = None
        for entry in entries:
            if entry.old != before:
                out.append(Finding(object=name, problem="ref-log-chain",
                                   detail=f"a ref log entry moves it from {entry.old or 'unset'}, "
                                          f"but the entry before left it at {before or 'unset'}"))
            if is_tag(name) and entry.old is not None:
                out.append(Finding(object=name, problem="tag-moved",
                                   detail=f"the ref log moves the tag from {entry.old} to "
                                          f"{entry.new}; tags never move"))
            before = entry.new
        if not entries:
            out.append(Finding(object=name, problem="unlogged-ref",
                               detail=f"ref points at {target}, but the ref log never set it"))
        elif target is None:
            out.append(Finding(object=name, problem="missing-ref",
                               detail=f"the ref log last set it to {before}, but no such ref exists"))
        elif target != before:
            tag = "; tags never move" if is_tag(name) else ""
            out.append(Finding(object=name, problem="ref-log-mismatch",
                               detail=f"ref points at {target}, but its ref log last set it to "
                                      f"{before}{tag}"))
    return out


def _two_at_a_time(targets: Iterable[ObjectInfo], check: Callable[[ObjectInfo], list[Finding]],
                   deadline: float | None) -> Iterable[tuple[ObjectInfo, list[Finding]]]:
    """(object, findings) in the order given, two checked at a time; none begun after ``deadline``."""
    pending: deque[tuple[ObjectInfo, Future[list[Finding]]]] = deque()
    with ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="nscas-fsck") as pool:
        for info in targets:
            if deadline is not None and time.monotonic() > deadline:
                break
            while len(pending) >= _IN_FLIGHT:
                done, fut = pending.popleft()
                yield done, fut.result()
            pending.append((info, pool.submit(check, info)))
        while pending:
            done, fut = pending.popleft()
            yield done, fut.result()


def _check_row(store: StoreReader, info: ObjectInfo) -> list[Finding]:
    oid = str(info.id)
    out: list[Finding] = []
    if info.storage == "inline":
        data = store.inline_data(info.id)
        if data is None or len(data) != info.size:
            out.append(Finding(object=oid, problem="inline-size", detail="inline bytes missing or of the wrong size"))
    elif info.storage == "file":
        held = store.chunks.stored_size(info.id)
        if held is None:
            out.append(Finding(object=oid, problem="missing-chunk",
                               detail=f"{store.chunks.location(info.id)} is missing"))
        elif held != info.stored_size:
            out.append(Finding(object=oid, problem="chunk-size",
                               detail=f"chunk file holds {held} bytes, expected {info.stored_size}"))
        try:  # codec known; a delta's base present, of its size, its chain short and acyclic
            store.leaf_base(info.id, info.codec)
        except CodecError as exc:
            out.append(Finding(object=oid, problem=exc.problem, detail=exc.message))
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


def _check_record(store: StoreReader, info: ObjectInfo) -> list[Finding]:
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
    if kind == "signature/1":  # its statement names its receipt, and its signature verifies
        from nscas.signing.signatures import signature_problem

        receipt = Digest.parse(value["receipt"])
        problem = signature_problem(value, store.get_bytes(receipt)
                                    if store.has(receipt) else None)
        if problem is not None:
            out.append(Finding(object=oid, problem="bad-signature", detail=problem))
    return out


def _top_level(store: StoreReader, infos: dict[str, ObjectInfo]) -> list[ObjectInfo]:
    """Objects that are not a part of another: re-hashing these covers every stored byte."""
    inner: set[str] = set()
    for info in infos.values():
        if info.storage == "parts":
            inner.update(p.hex for _, _, p in store.part_rows(info.id))
    return [i for h, i in infos.items() if h not in inner]


def _check_leaf(store: StoreReader, info: ObjectInfo) -> list[Finding]:
    """A stored leaf's plain bytes: BLAKE3 against its ID, size against its row."""
    oid = str(info.id)
    try:
        if info.storage == "inline":
            data = store.inline_data(info.id)
            if data is None:
                return []  # reported by the row check
            got, size = Digest(blake3_hex(data)), len(data)
        else:
            try:
                base = store.leaf_base(info.id, info.codec)
            except CodecError:
                return []  # reported by the row check
            got, size = store.chunks.verify(info.id, info.codec, info.size, base=base)
    except CodecError as exc:
        return [Finding(object=oid, problem=exc.problem, detail=exc.message)]
    except DecodeBoundExceeded as exc:
        return [Finding(object=oid, problem="size-mismatch", detail=exc.message)]
    except NscasError as exc:
        return [Finding(object=oid, problem="hash-mismatch", detail=exc.message)]
    if got != info.id:
        return [Finding(object=oid, problem="hash-mismatch",
                        detail=IntegrityError(f"object {oid}", oid, str(got)).message)]
    if size != info.size:
        return [Finding(object=oid, problem="size-mismatch",
                        detail=f"recorded {info.size}, bytes give {size}")]
    return []


def _rehash(store: StoreReader, info: ObjectInfo) -> list[Finding]:
    """One read of every leaf: each leaf's BLAKE3, and the whole object's BLAKE3, SHA-256 and size."""
    oid = str(info.id)
    whole = blake3.blake3()
    sha = hashlib.sha256()
    size = 0
    out: list[Finding] = []
    try:
        for leaf in store.leaves(info.id):
            data = store.read_leaf(*leaf)  # checks the leaf's own ID, decodes at most its size
            whole.update(data)
            sha.update(data)
            size += len(data)
    except NscasError as exc:
        return [Finding(object=oid, problem="hash-mismatch", detail=exc.message)]
    if whole.hexdigest() != info.id.hex:
        out.append(Finding(object=oid, problem="hash-mismatch", detail=f"bytes hash to blake3:{whole.hexdigest()}"))
    if info.sha256 is not None and sha.hexdigest() != info.sha256:
        out.append(Finding(object=oid, problem="sha256-mismatch", detail=f"recorded {info.sha256}, bytes give {sha.hexdigest()}"))
    if size != info.size:
        out.append(Finding(object=oid, problem="size-mismatch", detail=f"recorded {info.size}, bytes give {size}"))
    return out


def _check_lazy_sha256(store: StoreReader, oid: Digest, recorded: str) -> list[Finding]:
    """A SHA-256 recorded after the put, against the object's bytes (read checked by ID)."""
    sha = hashlib.sha256()
    try:
        with store.open(oid) as f:
            while block := f.read(1 << 20):
                sha.update(block)
    except NscasError as exc:
        return [Finding(object=str(oid), problem="hash-mismatch", detail=exc.message)]
    if sha.hexdigest() != recorded:
        return [Finding(object=str(oid), problem="sha256-mismatch",
                        detail=f"recorded {recorded}, bytes give {sha.hexdigest()}")]
    return []


def gc(store: StoreReader, *, dry_run: bool = False, min_age: float = DEFAULT_MIN_AGE,
       now: float | None = None) -> GcReport:
    """Remove objects no ref, tag or receipt reaches, plus temporary and orphan chunk files
    (``store`` is a ``Store``; a dry run, which writes nothing, takes a reader too).

    Nothing younger than ``min_age`` seconds goes. A put in another process writes its chunk
    files before it inserts their rows, and names what it stored (a ref, a receipt) only after
    storing it: an object created since the cutoff (with all it reaches), a temporary file or a
    chunk file written since then may belong to such a put. ``min_age`` must therefore exceed the
    longest put; 0 is safe only while no other process writes to the store.

    Work areas go regardless of age once their action has succeeded or their process is gone
    (see ``WorkAreas.collect``). ``now`` (default: the clock) is the time ages are measured
    from: tests pass a later one to age what an S3 service timestamps itself.
    """
    from nscas.store.workarea import WorkAreas

    if min_age < 0:
        raise InvalidInput(f"gc minimum age must be at least 0 seconds, not {min_age:g}")
    # What gc keeps depends on every table and guard being the migrations' own (an index
    # only makes it faster).
    harm = [d for d in store.schema_differences() if d.harmful and d.problem != "missing-index"]
    if harm:
        more = f", and {len(harm) - 1} more difference(s)" if len(harm) > 1 else ""
        raise DamagedStore(str(store.root), harm[0].detail + more)

    def succeeded_since(action: Digest, since: str) -> bool:
        # Through the reader's own API: a dry run stays a read that never loads SQLAlchemy.
        for link in store.links_to(action):
            if link.path != "$.action":
                continue
            receipt = store.get_record(link.parent)
            if (receipt.get("nscas") == "receipt/1" and receipt.get("status") == "succeeded"
                    and receipt.get("finished", "") >= since):
                return True
        return False

    areas = WorkAreas(store.root).collect(succeeded_since, dry_run=dry_run)
    cutoff = (time.time() if now is None else now) - min_age
    infos = list(store.iter_objects())
    roots = [target for _, target in store.ref_list()]
    # Every receipt is kept, and so is every signature of one (it links its receipt, so no
    # receipt reaches it).
    roots += [info.id for info in infos if info.kind in ("receipt/1", "signature/1")]
    named = {d.hex for d in store.closure(roots, with_parts=True)}
    young = [info.id for info in infos if info.created >= cutoff and info.id.hex not in named]
    spared = {d.hex for d in store.closure(young, with_parts=True)} - named
    keep = named | spared
    doomed = {info.id.hex: info for info in infos if info.id.hex not in keep}
    file_ids = {info.id for info in infos if info.storage == "file" and info.id.hex in keep}
    unused = [d for d in store.chunks.iter_ids() if d not in file_ids and d.hex not in doomed]
    orphans = tuple(h for h in unused if store.chunks.chunk_written_before(h, cutoff))
    every_temp = store.chunks.temporary_files()
    temps = tuple(p for p in every_temp if store.chunks.written_before(p, cutoff))
    removed = [info.id for info in doomed.values()]
    if not dry_run:
        from nscas.store.writer import Store  # loaded already: the caller opened a Store

        if not isinstance(store, Store):
            raise TypeError("gc removes objects through a Store; a reader allows a dry run only")
        if removed:
            removed = store.delete_objects(removed, files_before=cutoff)
        for h in orphans:
            store.chunks.remove(h, before=cutoff)
        for p in temps:
            store.chunks.remove_temporary(p, before=cutoff)
    return GcReport(dry_run=dry_run, min_age=min_age, objects=tuple(removed),
                    bytes=sum(doomed[d.hex].stored_size for d in removed), temporary_files=temps,
                    orphan_chunks=orphans, young_objects=len(spared),
                    young_files=len(unused) - len(orphans) + len(every_temp) - len(temps),
                    work_areas=tuple(areas))
