"""Unpacking a bundle tar (``measurements.tar.gz``) that is hostile until checked: every bound of
``ImportLimits`` checked before the bytes it guards are read, the member list and manifest
checked before anything is written (docs/bundle.md "Import")."""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nscas.bundle.format import MANIFEST, SUMS, TARBALL, InvalidBundle
from nscas.bundle.manifest import Manifest, parse_manifest
from nscas.errors import InvalidInput
from nscas.objects import kinds

_CHUNK = 1 << 20  # how much of a tar member is read (and written) at once
_MAX_READ = 4 << 20  # the most tarfile may read in one call: a PAX or GNU long-name header
_TRAILER = 1 << 20  # what may follow the end of the tar inside the gzip stream (block padding)


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportLimits:
    """Absolute bounds on what a bundle can make ``nscas import`` read, hold in memory or
    unpack (docs/bundle.md), each checked before the bytes it guards are read."""

    manifest_bytes: int = 16 << 20
    """manifest.json, and SHA256SUMS, each: the file's size is checked before it is read."""
    unpacked_bytes: int = 16 << 30
    """The regular members of a tar together, checked at each member's header."""
    members: int = 100_000
    """Members of a tar (directories included), or files and directories of a bundle directory."""


class _HeaderTooLarge(Exception):
    """tarfile asked to read more than ``_MAX_READ`` bytes at once (a PAX or GNU header)."""


class _TarStream:
    """The uncompressed bytes of a tar.gz, as ``tarfile`` reads them: no single read larger than
    ``_MAX_READ`` (tarfile reads a PAX or GNU long-name header whole, whatever size it
    claims), and forward seeks (over member data) read the gzip stream in large blocks."""

    def __init__(self, raw: BinaryIO) -> None:
        raw.seek(0)
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > _MAX_READ:
            raise _HeaderTooLarge
        return self._gz.read(size)

    def tell(self) -> int:
        return self._gz.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or offset < self._gz.tell():
            return self._gz.seek(offset, whence)  # back: re-read from the start, as gzip does
        while (pos := self._gz.tell()) < offset and self._gz.read(min(_CHUNK, offset - pos)):
            pass
        return self._gz.tell()

    def drain(self, where: str, most: int = _TRAILER) -> None:
        """Read the rest of the gzip stream, at most ``most`` bytes (its CRC and length are
        checked at its end); raises tarfile's, gzip's or zlib's error for a broken stream."""
        end = self._gz.tell() + most
        while self._gz.read(_CHUNK):
            if self._gz.tell() > end:
                raise InvalidBundle(where, None, f"more than {most} bytes follow the end "
                                                 "of the tar in the gzip stream")


def shown(name: str) -> str:
    """A name fit for a one-line message, whatever bytes it came from."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def path_problem(name: str) -> str | None:
    if (problem := kinds.relpath_problem(name)) is not None:
        return problem
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "path is not UTF-8 text"
    return None


def _members(tar: tarfile.TarFile, where: str, limits: ImportLimits) -> Iterator[tarfile.TarInfo]:
    """The tar's members, each checked from its header alone (before its data is read): at
    most ``limits.members`` of them, safe paths, regular files or directories only."""
    count = 0
    while (member := tar.next()) is not None:
        # tarfile keeps every header it read; nothing here needs them. typeshed lacks the
        # attribute (getmembers() would read the whole archive first).
        tar.members.clear()  # type: ignore[attr-defined]
        count += 1
        if count > limits.members:
            raise InvalidBundle(where, None, f"holds more than {limits.members} members "
                                             "(--max-members)")
        problem = path_problem(member.name)
        if problem is None and member.issym():
            problem = f"is a symbolic link to {shown(member.linkname)!r}"
        elif problem is None and member.islnk():
            problem = f"is a hard link to {shown(member.linkname)!r}"
        elif problem is None and member.issparse():
            problem = "is a sparse file; bundle tars hold plain regular files"
        elif problem is None and not (member.isreg() or member.isdir()):
            problem = "is a device, FIFO or other special file"
        elif problem is None and member.name == TARBALL:
            problem = "a bundle tar does not hold another measurements.tar.gz"
        if problem is not None:
            raise InvalidBundle(where, shown(member.name), problem)
        yield member


def unpack(tar_path: Path, dest: Path, limits: ImportLimits) -> Manifest:
    """Unpack a bundle tar into ``dest``, only after its member list and manifest passed: every
    member a listed file of the size the manifest states (or manifest.json, SHA256SUMS), so
    what is written is at most the manifest's total, and there is room for it."""
    where = str(tar_path)
    try:
        with tar_path.open("rb") as raw:
            sizes, manifest = _list_tar(raw, where, limits)
            _check_listing(sizes, manifest, where)
            total = sum(sizes.values())
            free = shutil.disk_usage(dest).free
            if total > free:
                raise InvalidBundle(where, None, f"unpacks to {total} bytes, but {dest} has "
                                                 f"only {free} bytes free")
            _extract(raw, sizes, dest, where, limits)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        why = str(exc) or type(exc).__name__
        raise InvalidBundle(where, None, f"not a complete tar.gz ({why})") from None
    except _HeaderTooLarge:
        raise InvalidBundle(where, None, f"a tar header is larger than {_MAX_READ} bytes"
                                         ) from None
    return manifest


def _list_tar(raw: BinaryIO, where: str, limits: ImportLimits) -> tuple[dict[str, int], Manifest]:
    """First pass, writing nothing: every member's header checked, the running total of sizes
    checked at each header, the manifest parsed (its size checked at its header), and the gzip
    stream read to its end."""
    stream = _TarStream(raw)
    sizes: dict[str, int] = {}
    manifest: Manifest | None = None
    total = 0
    with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
        for member in _members(tar, where, limits):
            if member.isdir():
                continue
            name = member.name
            if name in sizes:
                raise InvalidBundle(where, name, "appears twice in the tar")
            total += member.size
            if total > limits.unpacked_bytes:
                raise InvalidBundle(where, name, f"takes the tar past {limits.unpacked_bytes} "
                                                 "unpacked bytes (--max-bytes)")
            if name in (MANIFEST, SUMS) and member.size > limits.manifest_bytes:
                raise InvalidBundle(where, name, f"is {member.size} bytes; at most "
                                                 f"{limits.manifest_bytes} (--max-manifest-bytes)")
            sizes[name] = member.size
            if name == MANIFEST:
                data = _member_bytes(tar, member, where)
                try:
                    manifest = parse_manifest(data, where)
                except InvalidBundle as refused:
                    try:  # a manifest that decompressed wrongly: report the broken stream
                        stream.drain(where, limits.unpacked_bytes)
                    except InvalidBundle:
                        raise refused from None
                    raise
        stream.drain(where)
    if manifest is None:
        raise InvalidBundle(where, MANIFEST, "missing or not a regular file")
    return sizes, manifest


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> bytes:
    src = tar.extractfile(member)
    if src is None:
        raise InvalidBundle(where, member.name, "cannot be read")
    with src:
        parts = []
        while chunk := src.read(_CHUNK):
            parts.append(chunk)
    return b"".join(parts)


def _check_listing(sizes: Mapping[str, int], m: Manifest, where: str) -> None:
    """Every member a file the manifest lists, of the size it states; every listed file there."""
    for name, size in sorted(sizes.items()):
        e = m.objects.get(name)
        if e is None and name not in (MANIFEST, SUMS):
            raise InvalidBundle(where, shown(name), "not listed in manifest.json")
        if e is not None and size != e.size:
            raise InvalidBundle(where, name, f"holds {size} bytes; manifest.json says {e.size}")
        parent = name.rpartition("/")[0]
        while parent:
            if parent in sizes:
                raise InvalidBundle(where, parent, "is both a file and a directory")
            parent = parent.rpartition("/")[0]
    for name in sorted(m.objects.keys() - sizes.keys()):
        raise InvalidBundle(where, name, "listed in manifest.json but missing")


def _extract(raw: BinaryIO, sizes: Mapping[str, int], dest: Path, where: str,
             limits: ImportLimits) -> None:
    """Second pass: write the files the first pass accepted, each at most its stated size
    (a tar that changed in between is refused)."""
    with tarfile.open(fileobj=_TarStream(raw), mode="r:") as tar:  # type: ignore[call-overload]
        for member in _members(tar, where, limits):
            if member.isdir() or member.name == MANIFEST:
                continue  # the manifest was parsed in the first pass
            if sizes.get(member.name) != member.size:
                raise InvalidBundle(where, member.name, "changed while it was being imported")
            _extract_one(tar, member, dest / member.name, where)


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, where: str) -> None:
    src = tar.extractfile(member)
    if src is None:
        raise InvalidBundle(where, member.name, "cannot be read")
    written = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with src, target.open("xb") as out:
            while chunk := src.read(_CHUNK):
                written += len(chunk)
                if written > member.size:
                    raise InvalidBundle(where, member.name, f"holds more than {member.size} bytes")
                out.write(chunk)
    except FileExistsError:
        raise InvalidBundle(where, member.name, "appears twice in the tar") from None
    except (NotADirectoryError, IsADirectoryError):
        raise InvalidBundle(where, member.name, "is both a file and a directory") from None
    except OSError as exc:  # a full disk, say: the temporary directory goes with the error
        raise InvalidInput(f"{where}: cannot unpack {member.name} into {target.parent}: "
                           f"{exc.strerror or exc}") from None
