"""The closure of a target and its integrity (docs/format.md §1, 2 and 7), with verified object access.

``Objects`` wraps a ``Source``: it re-hashes each object once (BLAKE3 must equal its ID,
SHA-256 and size must equal what the source records), parses records strictly, and hands
the later checkers only bytes that passed. ``walk`` follows record links from the target and
turns every problem into a check; it never stops at the first.

What an object is comes from its bytes, never from a label (docs/format.md §7): an object is a record
when its bytes parse as a JSON object with a string ``nscas`` member, and it is then held to
every rule of records (canonical, known kind, schema) and its links are followed, whatever the
source's manifest or table says. The member that links an object also says what it must be
(``EXPECTED``: a receipt's ``action`` is an ``action/1``, a journal's ``entries`` a blob, ...).

Check names (all of them always present, so a report reads the same every time):
``integrity.missing`` (linked objects the source lacks: docs/format.md §7 "cannot verify", exit 3),
``integrity.hashes``, ``integrity.records``, ``integrity.labels`` (the source's recorded kind
is the one the bytes declare), ``integrity.kinds`` (each object is what the member linking it
requires), ``integrity.trees`` (tree entries agree with the objects they name),
``integrity.omitted`` (objects a bundle left out: skipped, needing weights, when every one of
them is linked only as weights; failed otherwise).
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from ..core.errors import MissingObject, RecordParseError, VerifierError
from ..core.results import Check, Needs
from .reading import (
    MAX_RECORD_BYTES,
    Link,
    check_record,
    parse_json,
    parse_record,
    read_lines,
)
from .sources import Source, Unreadable

CACHE_LIMIT = 64 << 20
"""Verified objects up to this size stay in memory; larger ones are re-read when needed."""
_SHOWN = 8
MISSING_CHECK = "integrity.missing"


class Unusable(VerifierError):
    """An object a checker needs did not pass integrity, is missing, or was omitted. Checkers
    turn this into a failed check, except when ``needs`` says the object is a weight that the
    bundle omitted on purpose (then the check is skipped as not rechecked)."""

    def __init__(self, object_id: str, why: str, *, needs: Needs | None = None) -> None:
        super().__init__(f"{object_id} is unusable: {why}")
        self.object_id = object_id
        self.why = why
        self.needs = needs


BLOB = "blob"
"""What ``EXPECTED`` says of a member that must link a blob (bytes that are no record)."""
EXPECTED: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (parent, re.compile(pointer), kind) for parent, pointer, kind in (
        ("receipt/1", r"/action", "action/1"),
        ("receipt/1", r"/environment", "environment/1"),
        ("receipt/1", r"/journals/[^/]+", "journal/1"),
        ("action/1", r"/code", "tree/1"),
        ("checkpoint/1", r"/files", "tree/1"),
        ("checkpoint/1", r"/params", "params/1"),
        ("checkpoint/1", r"/parent", "checkpoint/1"),
        ("checkpoint/1", r"/gguf", BLOB),
        ("checkpoint/1", r"/state", "tree/1"),
        ("params/1", r"/tensors/[^/]+/data", BLOB),
        ("tasks/1", r"/records", BLOB),
        ("journal/1", r"/entries", BLOB),
        ("commitment/1", r"/previous", "commitment/1"),
        ("signature/1", r"/receipt", "receipt/1"),
    ))
"""(parent kind, JSON Pointer of the link, what the linked object must be). Links anywhere
else (outputs, inputs, subjects, tree entries, claim values) may name any object."""


def expected_kind(parent_kind: str, pointer: str) -> str | None:
    """What a link at ``pointer`` of a ``parent_kind`` record must name (``BLOB`` or a kind),
    or None when any object is allowed there."""
    for parent, pattern, kind in EXPECTED:
        if parent == parent_kind and pattern.fullmatch(pointer):
            return kind
    return None


def declared_kind(data: bytes) -> str | None:
    """The kind bytes declare: the ``nscas`` member of a JSON object, else None (a blob). Only
    the bytes decide; whether they are then a valid record is checked separately."""
    if len(data) > MAX_RECORD_BYTES or not data.startswith(b"{") or b'"nscas"' not in data:
        return None  # canonical records start with "{" and are at most 16 MiB
    try:
        value = parse_json(data, what="object")
    except VerifierError:
        return None
    tag = value.get("nscas") if isinstance(value, dict) else None
    return tag if isinstance(tag, str) else None


@dataclass(slots=True)
class _State:
    """What re-hashing one object found."""

    problem: str | None = None
    missing: bool = False
    omitted: str | None = None
    size: int = 0
    sha256: str = ""
    data: bytes | None = None


@dataclass(slots=True)
class Objects:
    """Verified, cached access to the objects of one source."""

    source: Source
    memo: dict[tuple[str, str], Any] = field(default_factory=dict)
    """Results of expensive recomputations (a model's parameter digests), by (what, ID)."""
    weights: frozenset[str] = frozenset()
    """Omitted objects that the closure links only as weights (set by ``walk``): using one
    needs weights, so a check that does is skipped, not failed."""
    _states: dict[str, _State] = field(default_factory=dict)
    _records: dict[str, dict[str, Any]] = field(default_factory=dict)
    _links: dict[str, tuple[Link, ...]] = field(default_factory=dict)
    _lines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _kinds: dict[str, str | None] = field(default_factory=dict)

    def state(self, oid: str) -> _State:
        known = self._states.get(oid)
        if known is None:
            known = self._states[oid] = self._check(oid)
        return known

    def _check(self, oid: str) -> _State:
        meta = self.source.meta(oid)
        if meta is None:
            reason = self.source.omitted(oid)
            if reason is not None:
                return _State(omitted=reason, problem=f"omitted ({reason})")
            return _State(missing=True, problem="not present")
        b3, sha, size = blake3.blake3(), hashlib.sha256(), 0
        keep: list[bytes] | None = [] if meta.size <= CACHE_LIMIT else None
        try:
            for piece in self.source.chunks(oid):
                b3.update(piece)
                sha.update(piece)
                size += len(piece)
                if keep is not None:
                    keep.append(piece)
                    if size > CACHE_LIMIT:
                        keep = None
        except MissingObject as exc:
            return _State(missing=True, problem=f"a part is not present ({exc.object_id})")
        except Unreadable as exc:  # of one of its parts: name the part
            return _State(missing=exc.missing,
                          problem=exc.why if exc.object_id == oid else exc.message)
        got = "blake3:" + b3.hexdigest()
        problems = []
        if got != oid:
            problems.append(f"bytes hash to {got}")
        if meta.sha256 is not None and sha.hexdigest() != meta.sha256:
            problems.append(f"SHA-256 is {sha.hexdigest()}, recorded {meta.sha256}")
        if size != meta.size:
            problems.append(f"size is {size}, recorded {meta.size}")
        return _State(problem="; ".join(problems) or None, size=size, sha256=sha.hexdigest(),
                      data=b"".join(keep) if keep is not None and not problems else None)

    def kind(self, oid: str) -> str | None:
        """The kind the object's verified bytes declare (``declared_kind``); None for a blob
        and for an object whose bytes are missing or do not match its ID."""
        if oid not in self._kinds:
            state = self.state(oid)
            self._kinds[oid] = (None if state.problem is not None or state.size > MAX_RECORD_BYTES
                                else declared_kind(self.bytes(oid)))
        return self._kinds[oid]

    def label(self, oid: str) -> str | None:
        """The kind the source's manifest or table records: a label, checked, never trusted."""
        meta = self.source.meta(oid)
        return meta.kind if meta is not None else None

    def _unusable(self, oid: str, why: str) -> Unusable:
        return Unusable(oid, why, needs="weights" if oid in self.weights else None)

    def bytes(self, oid: str) -> bytes:
        """The object's bytes, only if they passed integrity; raises ``Unusable``."""
        state = self.state(oid)
        if state.problem is not None:
            raise self._unusable(oid, state.problem)
        if state.data is not None:
            return state.data
        data = b"".join(self.source.chunks(oid))
        if "blake3:" + blake3.blake3(data).hexdigest() != oid:
            raise Unusable(oid, "bytes changed while being verified")
        return data

    def record(self, oid: str) -> dict[str, Any]:
        """The parsed record ``oid`` (strict: canonical, known kind, schema-valid)."""
        cached = self._records.get(oid)
        if cached is None:
            try:
                parsed = parse_record(self.bytes(oid))
            except RecordParseError as exc:
                raise Unusable(oid, exc.message) from None
            cached = self._records[oid] = parsed.value
            self._links[oid] = parsed.links
        return cached

    def links(self, oid: str) -> tuple[Link, ...]:
        """Every link of record ``oid`` (``extract_links`` of ``record``), in document order;
        raises ``Unusable``."""
        if oid not in self._links:
            self.record(oid)
        return self._links[oid]

    def lines(self, oid: str, what: str) -> list[dict[str, Any]]:
        """The verified JSONL blob ``oid`` parsed (``read_lines``: strict JSON, an object per
        line), parsed once however many checkers read it: callers must not change what it
        returns. Raises ``Unusable``, or ``RecordParseError`` naming ``what``."""
        cached = self._lines.get(oid)
        if cached is None:
            cached = self._lines[oid] = read_lines(self.bytes(oid), what)
        return cached

    def record_of(self, oid: str, kind: str) -> dict[str, Any]:
        """``record`` that must be of ``kind``; raises ``Unusable`` otherwise."""
        value = self.record(oid)
        if value.get("nscas") != kind:
            raise Unusable(oid, f"is a {value.get('nscas')}, not a {kind}")
        return value

    @contextmanager
    def as_file(self, oid: str, name: str = "object") -> Iterator[Path]:
        """The verified bytes of ``oid`` as a file (for safetensors readers), in bounded
        memory: a bundle's own file where it has one, else a temporary copy."""
        state = self.state(oid)
        if state.problem is not None:
            raise self._unusable(oid, state.problem)
        direct = self.source.file_path(oid)
        if direct is not None:
            yield direct
            return
        with tempfile.TemporaryDirectory(prefix="nscas-verify-") as tmp:
            path = Path(tmp) / name
            hasher = blake3.blake3()
            with path.open("wb") as out:
                for piece in self.source.chunks(oid):
                    hasher.update(piece)
                    out.write(piece)
            if "blake3:" + hasher.hexdigest() != oid:
                raise Unusable(oid, "bytes changed while being verified")
            yield path


def weights_omitted(objects: Objects, checkpoint: str) -> bool:
    """Whether rebuilding ``checkpoint``'s parameters needs weights the bundle omitted (its
    ``*.safetensors`` files, or its params' tensor data, are among ``objects.weights``)."""
    try:
        record = objects.record_of(checkpoint, "checkpoint/1")
        entries = objects.record_of(record["files"], "tree/1")["entries"]
    except Unusable:
        return False
    if any(e["id"] in objects.weights for rel, e in entries.items()
           if rel.endswith(".safetensors")):
        return True
    if state_omitted(objects, checkpoint):
        return True
    try:
        tensors = objects.record_of(record["params"], "params/1")["tensors"]
    except Unusable:
        return False
    return any(t["data"] in objects.weights for t in tensors.values())


def state_omitted(objects: Objects, checkpoint: str) -> bool:
    """Whether ``checkpoint``'s published optimizer state (its ``state`` tree's
    ``*.safetensors`` files) is among the weights the bundle omitted."""
    try:
        state = objects.record_of(checkpoint, "checkpoint/1").get("state")
        if not isinstance(state, str):
            return False
        entries = objects.record_of(state, "tree/1")["entries"]
    except Unusable:
        return False
    return any(e["id"] in objects.weights for rel, e in entries.items()
               if rel.endswith(".safetensors"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Closure:
    """Everything reachable from a target through record links, in breadth-first order."""

    target: str
    order: tuple[str, ...]
    """Every object reached, the target first."""
    records: dict[str, str]
    """Kind of each object that parsed as a record (the ones whose links were followed)."""
    missing: tuple[str, ...]
    omitted: tuple[str, ...]

    def of_kind(self, kind: str) -> list[str]:
        return [oid for oid in self.order if self.records.get(oid) == kind]


@dataclass(slots=True)
class _Walk:
    """What the breadth-first walk has found so far."""

    order: list[str] = field(default_factory=list)
    visited: set[str] = field(default_factory=set)
    records: dict[str, str] = field(default_factory=dict)
    linked: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    """Child -> every (parent, parent kind, JSON Pointer) that links it."""
    missing: list[str] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    bad_records: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    total: int = 0


def walk(objects: Objects, target: str) -> tuple[Closure, list[Check]]:
    """Follow links from ``target``, re-hashing and parsing everything; all findings as checks.
    Sets ``objects.weights`` to the omitted objects that are linked only as weights."""
    found = _Walk()
    seen = {target}
    queue = deque([target])
    while queue:
        oid = queue.popleft()
        found.order.append(oid)
        found.visited.add(oid)
        state = objects.state(oid)
        if state.missing:
            found.missing.append(oid)
            continue
        if state.omitted is not None:
            found.omitted.append(oid)
            continue
        if state.problem is not None:
            found.hashes.append(f"{oid}: {state.problem}")
            continue
        found.total += state.size
        kind, label = objects.kind(oid), objects.label(oid)
        if label != kind:
            found.labels.append(f"{oid} is labelled {label or 'a blob'} but its bytes are "
                                f"{kind or 'a blob'}")
        for parent, parent_kind, pointer in found.linked.get(oid, []):
            wanted = expected_kind(parent_kind, pointer)
            if wanted is not None and wanted != (kind or BLOB):
                found.kinds.append(f"{parent} {pointer} must link {_article(wanted)}, but "
                                   f"{oid} is {_article(kind or BLOB)}")
        if kind is None:
            continue
        try:  # the strict parse, which the checks below only repeat to list every problem
            value = objects.record(oid)
        except Unusable as exc:
            failed = [c for c in check_record(objects.bytes(oid), name="record")
                      if c.status != "passed"]
            found.bad_records.append(f"{oid}: " + ("; ".join(
                f"{c.name.split('.')[-1]}: {c.message}" for c in failed) or exc.why))
            continue
        found.records[oid] = value["nscas"]
        for link in objects.links(oid):
            found.linked.setdefault(link.target, []).append((oid, value["nscas"], link.path))
            if link.target not in seen:
                seen.add(link.target)
                queue.append(link.target)
            elif link.target in found.visited:
                _recheck_kind(objects, found, link.target, oid, value["nscas"], link.path)
    closure = Closure(target=target, order=tuple(found.order), records=found.records,
                      missing=tuple(found.missing), omitted=tuple(found.omitted))
    weights, not_weights = _omitted_weights(found)
    objects.weights = frozenset(weights)
    checks = [
        _listing(MISSING_CHECK, found.missing, "linked object(s) not available, cannot verify "
                 "them", recomputed=len(found.missing)),
        _listing("integrity.hashes", found.hashes, "object(s) do not match their ID, SHA-256 "
                 "or size", recomputed=f"{len(found.order) - len(found.missing) - len(found.omitted)}"
                                       f" objects, {found.total} bytes re-hashed"),
        _listing("integrity.records", found.bad_records, "object(s) declare a kind in their "
                 "bytes but are not canonical, schema-valid records of it",
                 recomputed=len(found.records)),
        _listing("integrity.labels", found.labels, "object(s) labelled otherwise than their "
                 "bytes declare", recomputed=len(found.order)),
        _listing("integrity.kinds", found.kinds, "link(s) name an object other than the "
                 "member requires", recomputed=sum(map(len, found.linked.values()))),
        _tree_check(objects, closure),
    ]
    if not_weights:
        checks.append(Check.failed("integrity.omitted", f"{len(not_weights)} omitted object(s) "
                                   "are not only weights, and only weights may be omitted: "
                                   + _show(not_weights), claimed=len(found.omitted)))
    elif weights:
        checks.append(Check.skipped("integrity.omitted", f"{len(weights)} weight object(s) "
                                    "omitted from the bundle: not re-hashed", needs="weights",
                                    claimed=len(weights)))
    else:
        checks.append(Check.passed("integrity.omitted", recomputed=0))
    return closure, checks


def _recheck_kind(objects: Objects, found: _Walk, child: str, parent: str, parent_kind: str,
                  pointer: str) -> None:
    """The kind rule for a link to an object the walk already visited (a second parent)."""
    wanted = expected_kind(parent_kind, pointer)
    if wanted is None or objects.state(child).problem is not None:
        return
    kind = objects.kind(child) or BLOB
    if wanted != kind:
        found.kinds.append(f"{parent} {pointer} must link {_article(wanted)}, but {child} is "
                           f"{_article(kind)}")


def _article(kind: str) -> str:
    return "a blob" if kind == BLOB else f"a {kind}"


_WEIGHT_ENTRY = re.compile(r"/entries/[^/]+\.safetensors/id")
_WEIGHT_TENSOR = re.compile(r"/tensors/[^/]+/data")


def _omitted_weights(found: _Walk) -> tuple[list[str], list[str]]:
    """Omitted objects split into those linked only as weights (a ``*.safetensors`` entry of a
    checkpoint's ``files`` or ``state`` tree, or a ``params/1`` tensor's data) and the rest."""
    files_trees = {child for child, links in found.linked.items()
                   if any(kind == "checkpoint/1" and path in ("/files", "/state")
                          for _, kind, path in links)}
    weights: list[str] = []
    other: list[str] = []
    for oid in found.omitted:
        links = found.linked.get(oid, [])
        only_weights = bool(links) and all(
            (kind == "params/1" and _WEIGHT_TENSOR.fullmatch(path))
            or (kind == "tree/1" and parent in files_trees and _WEIGHT_ENTRY.fullmatch(path))
            for parent, kind, path in links)
        (weights if only_weights else other).append(oid)
    return weights, other


def _tree_check(objects: Objects, closure: Closure) -> Check:
    """A tree entry's ``size`` and ``sha256`` must be those of the object its ``id`` names."""
    problems = []
    for oid in closure.of_kind("tree/1"):
        for rel, entry in objects.record(oid)["entries"].items():
            state = objects.state(entry["id"])
            if state.problem is not None:
                continue  # reported by the hash check (or missing/omitted)
            if state.size != entry["size"] or state.sha256 != entry["sha256"]:
                problems.append(f"{oid} entry {rel!r}: size/SHA-256 differ from {entry['id']}")
    return _listing("integrity.trees", problems, "tree entries disagree with their objects",
                    recomputed=len(closure.of_kind("tree/1")))


def _show(items: list[str]) -> str:
    more = f", and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return "; ".join(items[:_SHOWN]) + more


def _listing(name: str, problems: list[str], what: str, *, recomputed: Any) -> Check:
    if not problems:
        return Check.passed(name, recomputed=recomputed)
    return Check.failed(name, f"{len(problems)} {what}: {_show(problems)}", recomputed=recomputed)
