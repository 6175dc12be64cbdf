"""Objects and their IDs (docs/format.md §1): BLAKE3-256 names, SHA-256 and size, for bytes and files.

An ID is ``blake3:`` followed by the 64 lowercase hex digits of BLAKE3-256 of exactly the
object's bytes; anything else is not an ID. Files are hashed in bounded memory.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import TypeGuard

import blake3

ID_PATTERN = re.compile(r"^blake3:[0-9a-f]{64}$")
READ_CHUNK = 1 << 20


def object_id(data: bytes) -> str:
    """The docs/format.md §1 ID of a byte string: ``blake3:`` + BLAKE3-256 hex."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_object_id(value: object) -> TypeGuard[str]:
    """True for a string that is exactly ``blake3:`` + 64 lowercase hex digits."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Digests:
    """What docs/format.md §1 records of every object."""

    id: str
    """``blake3:`` ID."""
    sha256: str
    """SHA-256 hex."""
    size: int
    """Length in bytes."""


def digests(data: bytes) -> Digests:
    return Digests(id=object_id(data), sha256=sha256_hex(data), size=len(data))


def file_digests(path: str | os.PathLike[str]) -> Digests:
    """ID, SHA-256 and size of a file's bytes, read in 1 MiB pieces."""
    b3, sha, size = blake3.blake3(), hashlib.sha256(), 0
    with open(path, "rb") as stream:
        while chunk := stream.read(READ_CHUNK):
            b3.update(chunk)
            sha.update(chunk)
            size += len(chunk)
    return Digests(id="blake3:" + b3.hexdigest(), sha256=sha.hexdigest(), size=size)
