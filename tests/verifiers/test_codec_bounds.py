"""The verifiers' chunk decoder keeps the memory bounds of docs/format.md §5.5.1: a chain of D
deltas decodes holding at most one leaf per link (it holds far fewer), and a frame that
inflates to far more than its record is refused after at most the record's size."""

from __future__ import annotations

import tracemalloc

import blake3
import numpy as np
import pytest
import zstandard

from nscas.verifiers.records.codecs import DEPTH, ChunkRow, CodecRefused, decode_leaf
from tests.vectors.codecs.make_vectors import frame, planes, xor

SIZE = 4 << 20


class _Files:
    """Rows and chunk files held in memory."""

    has_bases = True

    def __init__(self) -> None:
        self.rows: dict[str, ChunkRow] = {}
        self.files: dict[str, bytes] = {}

    def add(self, plain: bytes, codec: str, stored: bytes, base: str | None = None,
            size: int | None = None) -> ChunkRow:
        hex_id = blake3.blake3(plain).hexdigest()
        self.rows[hex_id] = ChunkRow(id=hex_id, size=len(plain) if size is None else size,
                                     storage="file", codec=codec, base=base)
        self.files[hex_id] = stored
        return self.rows[hex_id]

    def chunk_row(self, hex_id: str) -> ChunkRow | None:
        return self.rows.get(hex_id)

    def chunk_head(self, hex_id: str, n: int) -> bytes:
        return self.files[hex_id][:n]

    def chunk_bytes(self, hex_id: str, limit: int) -> tuple[bytes, str]:
        return self.files[hex_id][:limit + 1], f"memory {hex_id[:8]}"


def _peak(files: _Files, row: ChunkRow) -> tuple[bytes, int]:
    tracemalloc.start()
    try:
        plain = decode_leaf(files, row)
        return plain, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_chain_of_d_deltas_decodes_holding_a_few_leaves() -> None:
    rng = np.random.default_rng(0)
    plain = (rng.standard_normal(SIZE // 4) * 0.02).astype("<f4").tobytes()
    files = _Files()
    row = files.add(plain, "planes4", frame(planes(plain, 4), level=1))
    for k in range(DEPTH):
        child = bytearray(plain)
        child[k * 4096:(k + 1) * 4096] = rng.bytes(4096)
        stored = bytes.fromhex(row.id) + frame(planes(xor(bytes(child), plain), 4), level=1)
        row = files.add(bytes(child), "xor4", stored, base=row.id)
        plain = bytes(child)
    got, peak = _peak(files, row)
    assert got == plain
    assert peak <= (DEPTH + 1) * SIZE  # the spec's bound
    assert peak <= 5 * SIZE, peak / SIZE  # this decoder's: the running bytes and one link's


def test_a_frame_inflating_far_past_its_record_is_refused_within_the_record() -> None:
    cobj = zstandard.ZstdCompressor(level=1).compressobj()
    bomb = b"".join(cobj.compress(bytes(1 << 24)) for _ in range(16)) + cobj.flush()  # 256 MiB
    files = _Files()
    size = 1 << 20
    row = files.add(b"x" * size, "zstd", bomb)
    tracemalloc.start()
    try:
        with pytest.raises(CodecRefused) as refused:
            decode_leaf(files, row)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.problem == "bomb"
    assert peak <= 3 * size, peak / size
