"""Checks of an export bundle's own files (docs/bundle.md), beyond the objects it holds.

``bundle.manifest``: canonical RFC 8785 bytes, well-formed sections, each object in one
section only (and, in format 1, at one path only; format 2 may repeat a file, with identical
entries). ``bundle.copies``: every repeated file has its object's bytes, like the one that is
read. ``bundle.files``: every regular file is the manifest, ``SHA256SUMS``, the
tarball or a manifest path; no links anywhere. ``bundle.sha256sums``: coreutils lines, sorted
bytewise by path, naming every file but itself with its SHA-256. ``bundle.measurements``: a
deterministic tarball whose entries are exactly the bundle without weights, byte for byte.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import tarfile
import zlib
from pathlib import Path
from typing import IO, Any

import rfc8785

from ..core.errors import RecordParseError
from ..core.results import Check
from ..records.objects import file_digests
from ..records.reading import parse_json
from .source import (
    BUNDLE_FORMAT_V1,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    SUMS,
    TARBALL,
    BundleSource,
    safe_relative,
)

_SUM_LINE = re.compile(r"([0-9a-f]{64})  ([^\r\n]+)")
_SHOWN = 5
WEIGHT_SUFFIX = ".safetensors"
MAX_SUMS_BYTES = 64 << 20


def _keys(section: object) -> list[str]:
    return [k for k in section if isinstance(k, str)] if isinstance(section, dict) else []


def _verdict(name: str, problems: list[str], *, recomputed: object = None) -> Check:
    return Check.of_problems(name, problems, shown=_SHOWN, recomputed=recomputed)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while piece := stream.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


MODEL_SIGNATURES = "model-signatures"


def model_signature_files(bundle: BundleSource, files: list[str]) -> set[str]:
    """``model-signatures/<arm>.sig`` of a ``models/<arm>/`` folder the manifest has: OpenSSF
    Model Signing signatures (``nscas export --model-signing``). They are no objects, signed
    afresh at each export, so in neither the manifest nor SHA256SUMS nor the tar; the stock
    ``model_signing verify key`` command checks them (docs/bundle.md)."""
    arms = {p.split("/")[1] for p in bundle.paths if p.startswith("models/") and p.count("/") >= 2}
    out = set()
    for path in files:
        head, _, name = path.partition("/")
        if head == MODEL_SIGNATURES and "/" not in name and name.endswith(".sig") \
                and name[:-4] in arms:
            out.add(path)
    return out


def bundle_checks(bundle: BundleSource) -> list[Check]:
    """Every finding about the bundle's layout files."""
    every = bundle.all_files()
    signed = model_signature_files(bundle, every)
    files = [f for f in every if f not in signed]
    return [_manifest(bundle), _copies(bundle, files), _files(bundle, files),
            _sums(bundle, files), _measurements(bundle, files)]


def _manifest(bundle: BundleSource) -> Check:
    problems = list(bundle.problems)
    try:
        if rfc8785.dumps(bundle.manifest) != bundle.manifest_bytes:
            problems.append("manifest.json is not in RFC 8785 canonical form")
    except rfc8785.CanonicalizationError as exc:
        problems.append(f"manifest.json cannot be canonicalised: {exc}")
    sections: dict[str, list[str]] = {}
    repeats = bundle.format != BUNDLE_FORMAT_V1  # format 2: a file may repeat an object
    for oid, where in bundle.copies().items():
        first = bundle.paths[where[0]]
        problems += [f"objects[{path}] describes {oid} otherwise than objects[{where[0]}]"
                     for path in where[1:] if bundle.paths[path] != first]
    for path, entry in bundle.paths.items():
        paths = sections.setdefault(entry["id"], [])
        if not (repeats and paths and paths[0].startswith("objects[")):
            paths.append(f"objects[{path}]")
    for section in ("derived", "omitted"):
        for oid in bundle.manifest.get(section, {}):
            sections.setdefault(oid, []).append(section)
    twice = [f"{oid} is in {', '.join(where)}" for oid, where in sections.items()
             if len(where) > 1]
    problems += twice
    return _verdict("bundle.manifest", problems, recomputed=len(sections))


def _copies(bundle: BundleSource, files: list[str]) -> Check:
    """Every path of an object that a bundle repeats holds that object's bytes (the integrity
    checks hash the copy that is read; this hashes the others)."""
    problems, count = [], 0
    present = set(files)
    for oid, where in sorted(bundle.copies().items()):
        for path in where[1:]:
            count += 1
            entry = bundle.paths[path]
            if path not in present or (bundle.root / path).is_symlink():
                continue  # bundle.files names it
            try:
                got = file_digests(bundle.root / path)
            except OSError as exc:
                problems.append(f"{path} cannot be read ({exc.strerror or exc})")
                continue
            if (got.id, got.sha256, got.size) != (oid, entry["sha256"], entry["size"]):
                problems.append(f"{path} is {got.id} ({got.size} bytes); it repeats {oid}, "
                                f"as {where[0]} holds it")
    return _verdict("bundle.copies", problems, recomputed=count)


def _files(bundle: BundleSource, files: list[str]) -> Check:
    problems = []
    for directory, dirs, names in os.walk(bundle.root):
        for entry in (*dirs, *names):
            path = Path(directory) / entry
            if path.is_symlink():
                problems.append(f"{path.relative_to(bundle.root)} is a symbolic link")
            elif not (path.is_dir() or path.is_file()):
                problems.append(f"{path.relative_to(bundle.root)} is not a regular file")
    known = {*bundle.paths, MANIFEST, SUMS, TARBALL}
    problems += [f"{path} is not in the manifest" for path in files if path not in known]
    problems += [f"{path} is in the manifest but not in the bundle"
                 for path in bundle.paths if path not in files]
    return _verdict("bundle.files", problems, recomputed=len(files))


def _sums(bundle: BundleSource, files: list[str]) -> Check:
    path = bundle.root / SUMS
    if not path.is_file():
        return Check.failed("bundle.sha256sums", f"{SUMS} is missing")
    problems, listed = [], []
    present = set(files)
    try:
        if path.is_symlink() or path.stat().st_size > MAX_SUMS_BYTES:
            return Check.failed("bundle.sha256sums", f"{SUMS} is a link or over "
                                f"{MAX_SUMS_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return Check.failed("bundle.sha256sums", f"{SUMS} is not UTF-8")
    if text and not text.endswith("\n"):
        problems.append("the last line lacks its newline")
    lines = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if line.endswith("\r"):
            problems.append(f"line {number} ends in CR LF; {SUMS} lines end in LF only")
            continue
        match = _SUM_LINE.fullmatch(line)
        if match is None:
            problems.append(f"line {number} is not '<sha256>  <path>'")
            continue
        digest, rel = match.groups()
        if rel in seen:
            problems.append(f"line {number}: {rel} is listed again (first on line {seen[rel]})")
            continue
        seen[rel] = number
        listed.append(rel)
        target = bundle.root / rel
        if rel not in present:
            problems.append(f"line {number}: {rel} is not a file of the bundle")
        elif _sha256(target) != digest:
            problems.append(f"line {number}: SHA-256 of {rel} differs")
    problems += [f"{rel} is listed after {before}, against the bytewise order of paths"
                 for before, rel in itertools.pairwise(listed)
                 if rel.encode("utf-8") < before.encode("utf-8")]
    expected = [f for f in files if f != SUMS]
    missing = sorted(set(expected) - set(listed))
    if missing:
        problems.append(f"{len(missing)} file(s) not listed: {missing[:3]}")
    return _verdict("bundle.sha256sums", problems, recomputed=len(expected))


def _measurements(bundle: BundleSource, files: list[str]) -> Check:
    """The tarball is the bundle without weights: its own manifest (the one a bundle without
    weights has) lists the same objects, less the omitted weights; every other entry equals
    the bundle's file of that path byte for byte. Read as a stream: no entry is inflated
    past the size of the bundle file it must equal, so a gzip bomb costs nothing."""
    path = bundle.root / TARBALL
    if path.is_symlink() or not path.is_file():
        return Check.failed("bundle.measurements", f"{TARBALL} is missing")
    problems: list[str] = []
    names: list[str] = []
    inner_manifest: bytes | None = None
    try:
        with path.open("rb") as raw:
            head = raw.read(10)
        if head[:2] != b"\x1f\x8b" or head[4:8] != b"\0\0\0\0":
            problems.append("gzip header is not deterministic (mtime must be 0)")
        if len(head) > 3 and head[3] & 0x08:
            problems.append("gzip header carries a file name")
        with tarfile.open(path, mode="r|gz") as tar:
            for member in tar:
                names.append(member.name)
                if not member.isfile():
                    problems.append(f"{member.name}: not a regular file entry")
                    continue
                if (member.mtime, member.uid, member.gid, member.uname, member.gname,
                        member.mode) != (0, 0, 0, "", "", 0o644):
                    problems.append(f"{member.name}: mtime/owner/mode are not the fixed values")
                stream = tar.extractfile(member)
                if member.name == MANIFEST:
                    if member.size > MAX_MANIFEST_BYTES:
                        problems.append(f"the tarball's {MANIFEST} is over "
                                        f"{MAX_MANIFEST_BYTES} bytes")
                    elif stream is not None:
                        inner_manifest = stream.read(MAX_MANIFEST_BYTES + 1)
                elif member.name not in files or safe_relative(member.name) is not None:
                    problems.append(f"{member.name}: not a file of the bundle")
                elif not _same_content(stream, bundle.root / member.name, member.size):
                    problems.append(f"{member.name}: differs from the bundle's file")
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
        return Check.failed("bundle.measurements", f"{TARBALL} is not a readable tar.gz: {exc}")
    if names != sorted(names, key=lambda p: p.encode("utf-8")) or len(set(names)) != len(names):
        problems.append("entries are not sorted by path (or repeat)")
    problems += _tar_manifest(bundle, inner_manifest, set(names) - {MANIFEST})
    return _verdict("bundle.measurements", problems, recomputed=len(names))


def _same_content(stream: IO[bytes] | None, path: Path, size: int) -> bool:
    """Whether a tar entry's bytes equal a bundle file's, compared in pieces (never more than
    the file's own size is read from the entry)."""
    if stream is None or path.is_symlink() or not path.is_file() or path.stat().st_size != size:
        return False
    with path.open("rb") as mine:
        while piece := stream.read(1 << 20):
            if mine.read(len(piece)) != piece:
                return False
        return mine.read(1) == b""


def _tar_manifest(bundle: BundleSource, data: bytes | None, entries: set[str]) -> list[str]:
    """The tarball's manifest must describe exactly its entries: the bundle less weights."""
    if data is None:
        return [f"the tarball holds no {MANIFEST}"]
    if data == bundle.manifest_bytes:
        inner: dict[str, Any] = bundle.manifest
    else:
        try:
            inner = parse_json(data, what=f"{TARBALL} {MANIFEST}")
        except RecordParseError as exc:
            return [exc.message]
        if not isinstance(inner, dict) or rfc8785.dumps(inner) != data:
            return [f"the tarball's {MANIFEST} is not a canonical manifest"]
    problems = []
    if inner.get("format") != bundle.format:
        problems.append(f"the tarball's {MANIFEST} is of another format")
    if inner.get("target") != bundle.manifest.get("target"):
        problems.append(f"the tarball's {MANIFEST} names another target")
    objects = inner.get("objects")
    if not isinstance(objects, dict):
        objects = {}
    left_out = {*_keys(inner.get("omitted")), *_keys(inner.get("derived"))}
    for path, entry in bundle.paths.items():
        if path in objects:
            if objects[path] != entry:
                problems.append(f"the tarball's {MANIFEST} describes {path} differently")
        elif entry["id"] not in left_out or not path.endswith(WEIGHT_SUFFIX):
            problems.append(f"{path} is neither in the tarball nor an omitted weight file")
    extra = sorted(set(objects) - set(bundle.paths))
    if extra:
        problems.append(f"the tarball lists files the bundle lacks: {extra[:3]}")
    if entries != set(objects):
        problems.append(f"the tarball's entries are not the files its {MANIFEST} lists")
    return problems
