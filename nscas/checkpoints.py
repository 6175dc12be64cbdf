"""params/1 records of safetensors files (docs/format.md §4), stored or on disk, without any framework."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from nscas import canonical
from nscas.digests import Digest, hash_slice
from nscas.errors import InvalidInput
from nscas.kinds import SAFETENSORS_DTYPES

if TYPE_CHECKING:
    from nscas.reading import StoreReader

DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
              "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "F8_E4M3": 8, "F8_E5M2": 8,
              "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64}


def read_header(store: StoreReader, file_id: Digest) -> tuple[int, dict[str, Any]]:
    """(data section offset, header) of a stored safetensors file."""
    with store.open(file_id) as f:
        return _read_header(f, store.info(file_id).size, str(file_id))


def _read_header(f: BinaryIO, size: int, what: str) -> tuple[int, dict[str, Any]]:
    raw = f.read(8)
    if len(raw) != 8:
        raise InvalidInput(f"{what} is not a safetensors file (shorter than 8 bytes)")
    (hlen,) = struct.unpack("<Q", raw)
    if hlen > size - 8:
        raise InvalidInput(f"{what} is not a safetensors file (header length {hlen})")
    try:
        header = json.loads(f.read(hlen))
    except ValueError:
        raise InvalidInput(f"{what} is not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise InvalidInput(f"{what} is not a safetensors file (header is not an object)")
    return 8 + hlen, header


def _tensors(header: dict[str, Any],
             seen: dict[str, Any]) -> Iterator[tuple[str, str, list[int], int, int]]:
    """(name, dtype, shape, start, end) of each tensor, checked; ``seen``: earlier shards'."""
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if name in seen:
            raise InvalidInput(f"tensor {name!r} appears in more than one weights file")
        dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise InvalidInput(f"tensor {name!r} has unknown dtype {dtype!r}")
        expected = prod(shape) * DTYPE_BITS[dtype]
        if expected != (end - start) * 8:
            raise InvalidInput(f"tensor {name!r}: shape {shape} of {dtype} does not fill {end - start} bytes")
        yield name, dtype, list(shape), start, end


def params_record(store: StoreReader, files: list[Digest]) -> dict[str, Any]:
    """The params/1 record of the tensors in ``files`` (shards of one model)."""
    tensors: dict[str, dict[str, Any]] = {}
    for file_id in files:
        base, header = read_header(store, file_id)
        by_offset = {off: pid for off, pid in store.part_ids(file_id)}
        for name, dtype, shape, start, end in _tensors(header, tensors):
            if end == start:
                data = store.put_bytes(b"")
            elif base + start in by_offset:
                data = by_offset[base + start]
            else:  # stored without tensor-aligned parts: cut the tensor out once
                with store.open(file_id) as f:
                    f.seek(base + start)
                    data = store.put_bytes(f.read(end - start))
            tensors[name] = {"dtype": dtype, "shape": shape, "data": str(data)}
    return {"nscas": "params/1", "tensors": tensors}


def file_params_digest(paths: Sequence[Path]) -> Digest:
    """The ID of the params/1 record of safetensors files on disk (shards of one model), as
    ``params_record`` would store it; nothing is written, and memory stays at one read block."""
    tensors: dict[str, dict[str, Any]] = {}
    for path in paths:
        with path.open("rb") as f:
            base, header = _read_header(f, path.stat().st_size, str(path))
            for name, dtype, shape, start, end in _tensors(header, tensors):
                f.seek(base + start)
                data = hash_slice(f, end - start)
                tensors[name] = {"dtype": dtype, "shape": shape, "data": str(data)}
    return Digest.of(canonical.encode({"nscas": "params/1", "tensors": tensors}))
