"""Rebuild a model's ``params/1`` record (docs/format.md §4) from safetensors files, in bounded memory.

The safetensors layout is read here directly: an 8-byte little-endian header length, a
JSON header ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}``
and a data buffer that the offsets index. Tensors are hashed slice by slice from the file,
so memory stays at one read buffer whatever the model size. safetensors stores raw
little-endian C-contiguous bytes, which is exactly what docs/format.md §4 hashes.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import blake3
import rfc8785

from ..core.errors import InvalidArgument, RecordParseError, SafetensorsError
from ..records.objects import READ_CHUNK, object_id
from ..records.reading import parse_json
from ..records.schemas import DTYPE_BITS

MAX_HEADER_BYTES = 100_000_000  # the limit the safetensors library itself enforces
PathLike = str | os.PathLike[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """One tensor as a safetensors header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    """Absolute file offset of the first byte."""
    end: int
    """Absolute file offset one past the last byte."""

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True, kw_only=True)
class SafetensorsHeader:
    """The parsed header of one safetensors file."""

    source: str
    """The file it was read from, for messages."""
    data_start: int
    """File offset of the data buffer (8 + header length)."""
    tensors: dict[str, TensorSpec]
    """Tensors in header order (``__metadata__`` left out)."""
    metadata: dict[str, str]
    """The free-form ``__metadata__`` strings, empty if absent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDigest:
    """One tensor of a rebuilt ``params/1`` record and the hashes of its raw bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: str
    """``blake3:`` ID of the tensor's raw bytes: the blob the record links."""
    size: int
    """Number of raw bytes."""
    sha256: str | None
    """SHA-256 hex of the raw bytes, when asked for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamsDigest:
    """A ``params/1`` record rebuilt from safetensors bytes."""

    id: str
    """The parameter digest: the ID of ``record``."""
    record: bytes
    """The canonical record bytes."""
    tensors: dict[str, TensorDigest]
    """Per-tensor IDs, to compare with the tensor blobs a store holds."""


def _int_list(value: Any, what: str, source: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        raise SafetensorsError(source, f"{what} must be a list of non-negative integers")
    return tuple(value)


def _read_exact(stream: BinaryIO, n: int, source: str, what: str) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise SafetensorsError(source, f"file ends inside the {what}")
    return data


def _parse_header(stream: BinaryIO, source: str) -> SafetensorsHeader:
    (length,) = struct.unpack("<Q", _read_exact(stream, 8, source, "header length"))
    if length > MAX_HEADER_BYTES:
        raise SafetensorsError(source, f"header length {length} exceeds {MAX_HEADER_BYTES}")
    try:
        header = parse_json(_read_exact(stream, length, source, "header"),
                            what="safetensors header")
    except RecordParseError as exc:
        raise SafetensorsError(source, exc.message) from None
    if not isinstance(header, dict):
        raise SafetensorsError(source, "header is not a JSON object")
    data_start = 8 + length
    stream.seek(0, os.SEEK_END)
    buffer_size = stream.tell() - data_start
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError(source, "__metadata__ must map strings to strings")
    tensors: dict[str, TensorSpec] = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(source, f"tensor {name!r} needs exactly dtype, shape and "
                                           "data_offsets")
        dtype = info["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise SafetensorsError(source, f"tensor {name!r} has unknown dtype {dtype!r}")
        shape = _int_list(info["shape"], f"shape of {name!r}", source)
        offsets = _int_list(info["data_offsets"], f"data_offsets of {name!r}", source)
        if len(offsets) != 2 or offsets[0] > offsets[1]:
            raise SafetensorsError(source, f"tensor {name!r} has bad data_offsets {offsets}")
        bits = math.prod(shape) * DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            raise SafetensorsError(source, f"tensor {name!r}: {dtype}{list(shape)} needs "
                                   f"{bits / 8:g} bytes, offsets span {offsets[1] - offsets[0]}")
        tensors[name] = TensorSpec(name=name, dtype=dtype, shape=shape,
                                   begin=data_start + offsets[0], end=data_start + offsets[1])
    # The buffer must be covered exactly: no overlaps, no holes, nothing after the last tensor.
    position = data_start
    for spec in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if spec.begin != position:
            raise SafetensorsError(source, f"tensor {spec.name!r} starts at buffer offset "
                                   f"{spec.begin - data_start}, expected {position - data_start}")
        position = spec.end
    if position - data_start != buffer_size:
        raise SafetensorsError(source, f"data buffer holds {buffer_size} bytes, tensors cover "
                               f"{position - data_start}")
    return SafetensorsHeader(source=source, data_start=data_start, tensors=tensors,
                             metadata=metadata)


def read_header(path: PathLike) -> SafetensorsHeader:
    """Parse and validate the header of a safetensors file (reads the header only)."""
    with open(path, "rb") as stream:
        return _parse_header(stream, os.fspath(path))


def _slices(stream: BinaryIO, spec: TensorSpec, source: str) -> Iterator[bytes]:
    stream.seek(spec.begin)
    remaining = spec.nbytes
    while remaining:
        chunk = stream.read(min(READ_CHUNK, remaining))
        if not chunk:
            raise SafetensorsError(source, f"file ends inside tensor {spec.name!r}")
        remaining -= len(chunk)
        yield chunk


def _as_paths(paths: PathLike | Iterable[PathLike]) -> list[PathLike]:
    found = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not found:
        raise InvalidArgument("safetensors files", "no file given")
    return found


def params_digest(paths: PathLike | Iterable[PathLike], *,
                  with_sha256: bool = False) -> ParamsDigest:
    """Rebuild the ``params/1`` record from one safetensors file or the shards of one model.

    Tensor names must not repeat across shards. ``with_sha256`` also hashes each tensor with
    SHA-256 (for comparison with stored objects' SHA-256; it roughly doubles the time).
    """
    digests: dict[str, TensorDigest] = {}
    for path in _as_paths(paths):
        source = os.fspath(path)
        with open(path, "rb") as stream:
            header = _parse_header(stream, source)
            for spec in sorted(header.tensors.values(), key=lambda t: t.begin):
                if spec.name in digests:
                    raise SafetensorsError(source, f"tensor {spec.name!r} repeats across files")
                b3 = blake3.blake3()
                sha = hashlib.sha256() if with_sha256 else None
                for chunk in _slices(stream, spec, source):
                    b3.update(chunk)
                    if sha is not None:
                        sha.update(chunk)
                digests[spec.name] = TensorDigest(
                    name=spec.name, dtype=spec.dtype, shape=spec.shape,
                    data="blake3:" + b3.hexdigest(), size=spec.nbytes,
                    sha256=sha.hexdigest() if sha is not None else None)
    record = rfc8785.dumps({
        "nscas": "params/1",
        "tensors": {name: {"dtype": t.dtype, "shape": list(t.shape), "data": t.data}
                    for name, t in digests.items()},
    })
    ordered = {name: digests[name] for name in sorted(digests)}
    return ParamsDigest(id=object_id(record), record=record, tensors=ordered)


def sha256_stream(paths: PathLike | Iterable[PathLike], order: Sequence[str]) -> str:
    """docs/format.md §4 ``sha256_stream``: per parameter in ``order`` (module registration order),
    name UTF-8, NUL, ``str(tuple(shape))``, NUL, raw bytes.

    A tied weight appears once in the file and must appear once in ``order``; tensors in the
    file that ``order`` does not name (persistent buffers) are not hashed.
    """
    if isinstance(order, str):
        raise InvalidArgument("parameter order", "expected a list of names, not one string")
    if len(set(order)) != len(order):
        repeated = sorted({n for n in order if list(order).count(n) > 1})
        raise InvalidArgument("parameter order", f"names repeat: {repeated[:5]}")
    where: dict[str, tuple[SafetensorsHeader, TensorSpec]] = {}
    for path in _as_paths(paths):
        header = read_header(path)
        for name, spec in header.tensors.items():
            if name in where:
                raise SafetensorsError(header.source, f"tensor {name!r} repeats across files")
            where[name] = (header, spec)
    missing = [name for name in order if name not in where]
    if missing:
        raise InvalidArgument("parameter order", f"{len(missing)} name(s) not in the "
                              f"safetensors files: {missing[:5]}")
    digest = hashlib.sha256()
    for name in order:
        header, spec = where[name]
        digest.update(name.encode("utf-8") + b"\0" + str(spec.shape).encode("utf-8") + b"\0")
        with open(header.source, "rb") as stream:
            for chunk in _slices(stream, spec, header.source):
                digest.update(chunk)
    return digest.hexdigest()
