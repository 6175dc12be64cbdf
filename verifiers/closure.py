"""The closure of a target and its integrity (SPEC 1, 2 and 7), with verified object access.

``Objects`` wraps a ``Source``: it re-hashes each object once (BLAKE3 must equal its ID,
SHA-256 and size must equal what the source records), parses records strictly, and hands
the later checkers only bytes that passed. ``walk`` follows record links from the target and
turns every problem into a check; it never stops at the first.

Check names (all of them always present, so a report reads the same every time):
``integrity.missing`` (linked objects the source lacks: SPEC 7 "cannot verify", exit 3),
``integrity.hashes``, ``integrity.records``, ``integrity.trees`` (tree entries agree with the
objects they name), ``integrity.omitted`` (skipped when a bundle left objects out).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from .errors import MissingObject, RecordParseError, VerifierError
from .records import check_record, extract_links, parse_record
from .report import Check
from .sources import Source, Unreadable

CACHE_LIMIT = 64 << 20
"""Verified objects up to this size stay in memory; larger ones are re-read when needed."""
_SHOWN = 8
MISSING_CHECK = "integrity.missing"


class Unusable(VerifierError):
    """An object a checker needs did not pass integrity, is missing, or was omitted. Checkers
    turn this into a skipped check: the integrity checks already report the cause."""

    def __init__(self, object_id: str, why: str) -> None:
        super().__init__(f"{object_id} is unusable: {why}")
        self.object_id = object_id
        self.why = why


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
    _states: dict[str, _State] = field(default_factory=dict)
    _records: dict[str, dict[str, Any]] = field(default_factory=dict)

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
        except Unreadable as exc:
            return _State(missing=exc.missing, problem=exc.why)
        got = "blake3:" + b3.hexdigest()
        problems = []
        if got != oid:
            problems.append(f"bytes hash to {got}")
        if sha.hexdigest() != meta.sha256:
            problems.append(f"SHA-256 is {sha.hexdigest()}, recorded {meta.sha256}")
        if size != meta.size:
            problems.append(f"size is {size}, recorded {meta.size}")
        return _State(problem="; ".join(problems) or None, size=size, sha256=sha.hexdigest(),
                      data=b"".join(keep) if keep is not None and not problems else None)

    def kind(self, oid: str) -> str | None:
        """The kind the source records (None for blobs and unknown objects)."""
        meta = self.source.meta(oid)
        return meta.kind if meta is not None else None

    def bytes(self, oid: str) -> bytes:
        """The object's bytes, only if they passed integrity; raises ``Unusable``."""
        state = self.state(oid)
        if state.problem is not None:
            raise Unusable(oid, state.problem)
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
                cached = parse_record(self.bytes(oid)).value
            except RecordParseError as exc:
                raise Unusable(oid, exc.message) from None
            self._records[oid] = cached
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
            raise Unusable(oid, state.problem)
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


def walk(objects: Objects, target: str) -> tuple[Closure, list[Check]]:
    """Follow links from ``target``, re-hashing and parsing everything; all findings as checks."""
    order: list[str] = []
    seen = {target}
    queue = deque([target])
    records: dict[str, str] = {}
    missing: list[str] = []
    omitted: list[str] = []
    hash_problems: list[str] = []
    record_problems: list[str] = []
    total = 0
    while queue:
        oid = queue.popleft()
        order.append(oid)
        state = objects.state(oid)
        if state.missing:
            missing.append(oid)
            continue
        if state.omitted is not None:
            omitted.append(oid)
            continue
        if state.problem is not None:
            hash_problems.append(f"{oid}: {state.problem}")
            continue
        total += state.size
        if objects.kind(oid) is None:
            continue
        data = objects.bytes(oid)
        failed = [c for c in check_record(data, name="record", expected_kind=objects.kind(oid))
                  if c.status != "passed"]
        if failed:
            record_problems.append(f"{oid}: " + "; ".join(f"{c.name.split('.')[-1]}: {c.message}"
                                                            for c in failed))
            continue
        value = objects.record(oid)
        records[oid] = value["nscas"]
        for link in extract_links(value):
            if link.target not in seen:
                seen.add(link.target)
                queue.append(link.target)
    closure = Closure(target=target, order=tuple(order), records=records,
                      missing=tuple(missing), omitted=tuple(omitted))
    checks = [
        _listing(MISSING_CHECK, missing, "linked object(s) not available, cannot verify them",
                 recomputed=len(missing)),
        _listing("integrity.hashes", hash_problems, "object(s) do not match their ID, SHA-256 "
                 "or size", recomputed=f"{len(order) - len(missing) - len(omitted)} objects, "
                                       f"{total} bytes re-hashed"),
        _listing("integrity.records", record_problems, "record(s) are not canonical, "
                 "schema-valid records of their kind", recomputed=len(records)),
        _tree_check(objects, closure),
    ]
    if omitted:
        checks.append(Check.skipped("integrity.omitted", f"{len(omitted)} object(s) omitted "
                                    f"from the bundle ({_show(omitted)}): not re-hashed",
                                    claimed=len(omitted)))
    else:
        checks.append(Check.passed("integrity.omitted", recomputed=0))
    return closure, checks


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
