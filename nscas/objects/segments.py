"""How a file is cut into objects (docs/format.md §5.2): a safetensors file tensor by tensor,
a tensor over ``TENSOR_SPLIT`` in parts, any other large file in fixed-size chunks."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import NamedTuple

CHUNK_SIZE = 16 << 20  # fixed-size chunks of large ordinary files
TENSOR_SPLIT = 32 << 20  # tensors larger than this are themselves stored as parts
SINGLE_MAX = 16 << 20  # ordinary files up to this size are one leaf object
_SAFETENSORS_HEADER_MAX = 100 << 20
LEAF_MAX = max(SINGLE_MAX, CHUNK_SIZE, TENSOR_SPLIT)
"""No leaf the store writes is larger: a row claiming more is read as claiming this."""


class Segment(NamedTuple):
    """A byte range of a file that becomes one object: ``tensor`` names safetensors tensors."""

    offset: int
    length: int
    tensor: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


def tensor_layout(header: bytes) -> dict[str, tuple[str, tuple[int, ...], int, int]] | None:
    """(dtype, shape, start, end) of each tensor of a safetensors header (its JSON after the
    8 length bytes), offsets within the data section; None if it is not one."""
    try:
        value = json.loads(header)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, info in value.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
            dtype = str(info.get("dtype", ""))
            shape = tuple(int(x) for x in info.get("shape", ()))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        out[name] = (dtype, shape, start, end)
    return out


def plan_segments(path: Path, size: int) -> list[Segment] | None:
    """How to cut a file into part objects; ``None`` means store it as a single leaf."""
    if path.suffix == ".safetensors":
        segments = _safetensors_segments(path, size)
        if segments is not None:
            return segments
    if size <= SINGLE_MAX:
        return None
    return [Segment(offset=o, length=min(CHUNK_SIZE, size - o)) for o in range(0, size, CHUNK_SIZE)]


def split_ranges(length: int) -> list[tuple[int, int]]:
    """Sub-ranges (offset, length) of a large tensor; a single range if it needs no split."""
    if length <= TENSOR_SPLIT:
        return [(0, length)]
    return [(o, min(TENSOR_SPLIT, length - o)) for o in range(0, length, TENSOR_SPLIT)]


def _safetensors_segments(path: Path, size: int) -> list[Segment] | None:
    """Header, then one segment per tensor in file order; None if the file is not well formed."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (hlen,) = struct.unpack("<Q", raw)
            if hlen > _SAFETENSORS_HEADER_MAX or 8 + hlen > size:
                return None
            layout = tensor_layout(f.read(hlen))
    except OSError:
        return None
    if layout is None:
        return None
    base = 8 + hlen
    spans = sorted((start, end, name, dtype, shape)
                   for name, (dtype, shape, start, end) in layout.items())
    segments = [Segment(offset=0, length=base)]
    cursor = 0
    for start, end, name, dtype, shape in spans:
        if start != cursor or end < start:  # gaps or overlaps: not cut at tensor boundaries
            return None
        if end > start:
            segments.append(Segment(offset=base + start, length=end - start, tensor=name,
                                    dtype=dtype, shape=shape))
        cursor = end
    if base + cursor != size:
        return None
    return segments
