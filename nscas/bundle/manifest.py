"""manifest.json of a bundle, read (docs/bundle.md "Manifest"): strict RFC 8785 JSON of a fixed
shape, every problem naming the member; nothing else of the bundle is trusted before it."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import rfc8785

from nscas.bundle.format import (
    FORMAT_V1,
    FORMATS,
    MANIFEST,
    RESERVED,
    SHA256_HEX,
    InvalidBundle,
    Range,
)
from nscas.errors import StrictJSONError
from nscas.objects import canonical, kinds
from nscas.objects.digests import Digest, is_digest_text


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    id: Digest
    size: int
    sha256: str
    kind: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    target: Digest
    objects: Mapping[str, Entry]
    derived: Mapping[Digest, tuple[Range, str]]
    omitted: Mapping[Digest, Entry]
    paths: Mapping[Digest, str]
    """The file of each object in ``objects`` (its first path, bytewise, where a format 2
    bundle repeats it: every copy is checked against the same entry)."""


MANIFEST_MAX_DEPTH = 8
"""How deeply manifest.json may nest (an honest one nests 3 deep), checked before parsing."""


def parse_manifest(data: bytes, where: str) -> Manifest:
    """manifest.json's bytes (already within their size limit) as a checked manifest."""
    try:
        value = canonical.loads_strict(data, max_depth=MANIFEST_MAX_DEPTH)
    except StrictJSONError as exc:
        raise InvalidBundle(where, MANIFEST, f"not valid JSON ({exc.reason})") from None
    try:
        canonical_form = isinstance(value, dict) and rfc8785.dumps(value) == data
    except (rfc8785.CanonicalizationError, TypeError, ValueError):  # lone surrogates, say
        canonical_form = False
    if not canonical_form:
        raise InvalidBundle(where, MANIFEST, "not a JSON object in RFC 8785 canonical form")
    return _ManifestReader(where).read(value)


class _ManifestReader:
    """The shape of manifest.json (docs/bundle.md); every problem names the member."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, at: str, problem: str) -> NoReturn:
        raise InvalidBundle(self.where, MANIFEST, f"{at}: {problem}")

    def exactly(self, value: Any, at: str, names: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict) or value.keys() != names:
            self.fail(at, f"expected an object with exactly the members {', '.join(sorted(names))}")
        return value

    def mapping(self, value: Any, at: str) -> dict[str, Any]:
        return value if isinstance(value, dict) else self.fail(at, "expected an object")

    def digest(self, value: Any, at: str) -> Digest:
        return Digest.parse(value) if is_digest_text(value) else self.fail(at, "expected an ID")

    def count(self, value: Any, at: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(at, "expected an integer >= 0")
        return value

    def sha(self, value: Any, at: str) -> str:
        if not isinstance(value, str) or not SHA256_HEX.fullmatch(value):
            self.fail(at, "expected 64 lowercase hex digits")
        return value

    def read(self, value: dict[str, Any]) -> Manifest:
        top = self.exactly(value, "$", {"format", "target", "objects", "derived", "omitted"})
        if top["format"] not in FORMATS:
            self.fail("format", f"expected one of {', '.join(map(repr, FORMATS))}")
        objects = {path: self.entry(path, e)
                   for path, e in self.mapping(top["objects"], "objects").items()}
        derived: dict[Digest, tuple[Range, str]] = {}
        for key, e in self.mapping(top["derived"], "derived").items():
            at = f"derived[{key!r}]"
            e = self.exactly(e, at, {"from", "offset", "size", "sha256"})
            r = Range(source=self.digest(e["from"], f"{at}.from"),
                      offset=self.count(e["offset"], f"{at}.offset"),
                      size=self.count(e["size"], f"{at}.size"))
            derived[self.digest(key, at)] = (r, self.sha(e["sha256"], f"{at}.sha256"))
        omitted: dict[Digest, Entry] = {}
        for key, e in self.mapping(top["omitted"], "omitted").items():
            at = f"omitted[{key!r}]"
            e = self.exactly(e, at, {"size", "sha256", "reason"})
            if not isinstance(e["reason"], str) or not e["reason"]:
                self.fail(f"{at}.reason", "expected a non-empty string")
            oid = self.digest(key, at)
            omitted[oid] = Entry(id=oid, size=self.count(e["size"], f"{at}.size"),
                                  sha256=self.sha(e["sha256"], f"{at}.sha256"), kind=None)
        files: dict[Digest, list[str]] = defaultdict(list)
        for path in sorted(objects, key=str.encode):
            files[objects[path].id].append(path)
        if top["format"] == FORMAT_V1:  # version 2 may repeat a file, never a section
            ids = Counter([e.id for e in objects.values()] + [*derived] + [*omitted])
        else:
            ids = Counter([*files, *derived, *omitted])
            for oid, where in sorted(files.items()):
                for other in (p for p in where[1:] if objects[p] != objects[where[0]]):
                    self.fail(f"objects[{other!r}]", f"describes {oid} otherwise than "
                                                     f"objects[{where[0]!r}]")
        for oid in sorted(d for d, n in ids.items() if n > 1):
            self.fail(str(oid), "is in more than one place (a file, derived, omitted)")
        paths = {oid: where[0] for oid, where in files.items()}
        target = self.digest(top["target"], "target")
        if target not in paths:
            self.fail("target", f"{target} is not a file of the bundle")
        return Manifest(target=target, objects=objects, derived=derived, omitted=omitted,
                         paths=paths)

    def entry(self, path: str, e: Any) -> Entry:
        at = f"objects[{path!r}]"
        if (problem := kinds.relpath_problem(path) or ("reserved name" if path in RESERVED else None)):
            raise InvalidBundle(self.where, path, problem)
        e = self.exactly(e, at, {"id", "size", "sha256", "kind"})
        if e["kind"] is not None and not isinstance(e["kind"], str):
            self.fail(f"{at}.kind", "expected a record kind or null")
        size = self.count(e["size"], f"{at}.size")
        if e["kind"] is not None and size > canonical.MAX_RECORD_BYTES:
            self.fail(f"{at}.size", f"records stay under {canonical.MAX_RECORD_BYTES} bytes")
        return Entry(id=self.digest(e["id"], f"{at}.id"), size=size,
                      sha256=self.sha(e["sha256"], f"{at}.sha256"), kind=e["kind"])
