"""A delta read through its base's plane stream (docs/format.md §5.5.1: planes of a XOR b are
planes of a XOR planes of b; a ``subW`` delta adds to the base's values un-planed from it): the
same bytes as decoding each link on its own, for chains and odd sizes, every bound kept, and a
corrupt base named as the corrupt one."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import blake3
import numpy as np
import pytest
import zstandard

from nscas.errors import DecodeBoundExceeded, IntegrityError
from nscas.objects import codecs
from nscas.objects.codecs import Base
from nscas.objects.decoding import decode, plane_stream
from nscas.objects.digests import Digest
from nscas.store.putting import Leaf
from nscas.store.reading import StoreReader
from nscas.store.writer import Store


def _id(data: bytes) -> Digest:
    return Digest(blake3.blake3(data).hexdigest())


def _weights(n: int, dtype: str, seed: int) -> list[bytes]:
    """A parent and three fine-tunes of it, each from the one before, as ``dtype`` bytes
    (BF16: the high half of FP32), n bytes each (cut to n, so n mod W may be anything)."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(n // 2 + 8) * 0.02).astype(np.float32)
    out = []
    for _ in range(4):
        raw = values.view(np.uint32)
        data = (raw >> 16).astype(np.uint16).tobytes() if dtype == "BF16" else raw.tobytes()
        out.append(data[:n])
        values = (values + rng.standard_normal(values.shape) * 1e-4).astype(np.float32)
    return out


def _plant(store: Store, data: bytes, codec: str, stored: bytes, base: Digest | None) -> Digest:
    """A leaf row and chunk file written behind the writer's back (no check)."""
    oid = _id(data)
    path = store.chunks.path(oid)  # type: ignore[attr-defined]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(stored)
    store._insert([Leaf(hex=oid.hex, size=len(data), sha256=None, storage="file", codec=codec,
                        stored_size=len(stored), base=None if base is None else base.hex)],
                  [], [])
    return oid


def _delta(child: bytes, parent: bytes, w: int, kind: str = "xor") -> bytes:
    residual = codecs.xor(child, parent) if kind == "xor" else codecs.sub_residual(child, parent, w)
    return bytes.fromhex(_id(parent).hex) + codecs.pack_planes(residual, w)


def _chain(store: Store, links: list[bytes], w: int, first: str,
           kind: str = "xor") -> list[Digest]:
    """links[0] stored in ``first``, each later one a ``kind``W delta of the one before."""
    ids = [_plant(store, links[0], first,
                  codecs.pack_planes(links[0], w) if first.startswith("planes") else links[0],
                  None)]
    for before, data in pairwise(links):
        ids.append(_plant(store, data, f"{kind}{w}", _delta(data, before, w, kind), ids[-1]))
    return ids


def _base_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[Digest]:
    """The leaves read in full, checked (read_leaf), from now on."""
    seen: list[Digest] = []
    real = StoreReader.read_leaf

    def spy(self: StoreReader, oid: Digest, *args: object, **kw: object) -> bytes:
        seen.append(oid)
        return real(self, oid, *args, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(StoreReader, "read_leaf", spy)
    return seen


@pytest.mark.parametrize("kind", ["xor", "sub"])
@pytest.mark.parametrize(("dtype", "w"), [("F32", 4), ("BF16", 2)])
@pytest.mark.parametrize("n", [4100, 65543, 200_002])
def test_a_chain_over_a_planes_base_reads_back_through_plane_streams_alone(
        store: Store, monkeypatch: pytest.MonkeyPatch, dtype: str, w: int, n: int,
        kind: str) -> None:
    links = _weights(n, dtype, seed=n)
    ids = _chain(store, links, w, f"planes{w}", kind)
    seen = _base_reads(store, monkeypatch)
    for oid, data in zip(ids, links, strict=True):
        assert store.get_bytes(oid) == data
    # Each get checked only the leaf it asked for: no base was decoded to plain bytes.
    assert seen == ids


@pytest.mark.parametrize("w", [1, 4])
def test_a_base_of_another_codec_is_decoded_to_plain_bytes_and_gives_the_same_bytes(
        store: Store, monkeypatch: pytest.MonkeyPatch, w: int) -> None:
    links = _weights(30_001, "F32", seed=3)
    first = "zstd" if w == 4 else "raw"  # zstd has no plane stream of width 4; raw has W = 1
    stored = zstandard.ZstdCompressor().compress(links[0]) if first == "zstd" else links[0]
    base = _plant(store, links[0], first, stored, None)
    child = _plant(store, links[1], f"xor{w}", _delta(links[1], links[0], w), base)
    seen = _base_reads(store, monkeypatch)
    assert store.get_bytes(child) == links[1]
    assert seen == [child]  # the base unchecked: the child's check covers it


def test_an_xor_over_a_sub_base_decodes_that_base_on_its_own() -> None:
    """A ``subW`` leaf's stream is its residual's, not its plain bytes': never XORed into."""
    links = _weights(30_001, "F32", seed=12)
    stored = _delta(links[1], links[0], 4, "sub")
    assert plane_stream(stored, "sub4", _id(links[1]), len(links[1]), 4,
                        base=Base(id=_id(links[0]), load=lambda: links[0])) is None


def test_a_sub_chain_and_an_xor_over_it_read_back(store: Store,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    links = _weights(30_001, "F32", seed=13)
    ids = _chain(store, links[:3], 4, "planes4", "sub")
    top = _plant(store, links[3], "xor4", _delta(links[3], links[2], 4), ids[-1])
    seen = _base_reads(store, monkeypatch)
    assert store.get_bytes(top) == links[3]
    assert seen == [top]  # the sub base as plain bytes, its base as a stream, all unchecked


def test_plane_stream_is_the_format_s_stream_and_none_for_another_width() -> None:
    data = _weights(10_003, "F32", seed=4)[0]
    stored = codecs.pack_planes(data, 4)
    assert plane_stream(stored, "planes4", _id(data), len(data), 4) == codecs.planes(data, 4)
    assert plane_stream(stored, "planes4", _id(data), len(data), 2) is None
    assert plane_stream(data, "raw", _id(data), len(data), 1) == data


def test_a_bomb_in_a_base_s_stream_is_refused_at_its_record(store: Store) -> None:
    links = _weights(20_000, "F32", seed=5)
    bomb = zstandard.ZstdCompressor().compress(bytes(50 * len(links[0])))
    base = _plant(store, links[0], "planes4", bomb, None)
    child = _plant(store, links[1], "xor4", _delta(links[1], links[0], 4), base)
    with pytest.raises(DecodeBoundExceeded, match=f"at most {len(links[0])} bytes"):
        store.get_bytes(child)


def test_a_short_base_stream_falls_back_and_is_named(store: Store) -> None:
    links = _weights(20_000, "F32", seed=6)
    short = codecs.pack_planes(links[0][:-8], 4)
    base = _plant(store, links[0], "planes4", short, None)
    child = _plant(store, links[1], "xor4", _delta(links[1], links[0], 4), base)
    with pytest.raises(IntegrityError, match="a plane stream of 20000 bytes"):
        store.get_bytes(child)


@pytest.mark.parametrize("kind", ["xor", "sub"])
def test_a_corrupt_base_is_named_not_the_delta_read_through_it(store: Store, kind: str) -> None:
    links = _weights(20_000, "F32", seed=7)
    wrong = bytearray(links[0])
    wrong[4001] ^= 0x10
    base = _plant(store, links[0], "planes4", codecs.pack_planes(bytes(wrong), 4), None)
    child = _plant(store, links[1], f"{kind}4", _delta(links[1], links[0], 4, kind), base)
    with pytest.raises(IntegrityError) as caught:
        store.get_bytes(child)
    assert f"expected {base}" in str(caught.value), caught.value


@pytest.mark.parametrize("kind", ["xor", "sub"])
def test_a_delta_decoding_to_other_bytes_over_a_good_base_is_named(store: Store,
                                                                   kind: str) -> None:
    links = _weights(20_000, "F32", seed=8)
    wrong = bytearray(links[1])
    wrong[77] ^= 1
    base = _plant(store, links[0], "planes4", codecs.pack_planes(links[0], 4), None)
    child = _plant(store, links[1], f"{kind}4", _delta(bytes(wrong), links[0], 4, kind), base)
    with pytest.raises(IntegrityError) as caught:
        store.get_bytes(child)
    assert f"expected {child}" in str(caught.value), caught.value


@pytest.mark.parametrize("kind", ["xor", "sub"])
@pytest.mark.parametrize("w", [2, 4, 8])
def test_decode_through_a_stream_equals_decode_through_plain_bytes(w: int, kind: str) -> None:
    parent, child = _weights(77_777, "F32", seed=w)[:2]
    stored = _delta(child, parent, w, kind)
    plain = Base(id=_id(parent), load=lambda: parent)
    streamed = Base(id=_id(parent), load=lambda: pytest.fail("the base was decoded"),
                    stream=lambda k: memoryview(bytearray(codecs.planes(parent, k))))
    got = decode(stored, f"{kind}{w}", _id(child), len(child), base=streamed)
    assert got == decode(stored, f"{kind}{w}", _id(child), len(child), base=plain) == child


def test_the_store_s_twin_decoder_in_the_verifiers_agrees(store: Store, tmp_path: Path) -> None:
    from nscas.verifiers.records.codecs import ChunkRow, decode_leaf

    links = _weights(50_001, "F32", seed=9)
    ids = _chain(store, links[:2], 4, "planes4")
    ids.append(_plant(store, links[2], "sub4", _delta(links[2], links[1], 4, "sub"), ids[-1]))
    ids.append(_plant(store, links[3], "xor4", _delta(links[3], links[2], 4), ids[-1]))

    class Files:
        has_bases = True

        def chunk_row(self, hex_id: str) -> ChunkRow | None:
            info = store.info(Digest(hex_id))
            return ChunkRow(id=hex_id, size=info.size, storage="file", codec=info.codec,
                            base=None if info.base is None else info.base.hex)

        def chunk_head(self, hex_id: str, n: int) -> bytes:
            return store.chunks.path(Digest(hex_id)).read_bytes()[:n]  # type: ignore[attr-defined]

        def chunk_bytes(self, hex_id: str, limit: int) -> tuple[bytes, str]:
            path = store.chunks.path(Digest(hex_id))  # type: ignore[attr-defined]
            return path.read_bytes()[:limit + 1], str(path)

    for oid, data in zip(ids, links, strict=True):
        assert decode_leaf(Files(), Files().chunk_row(oid.hex)) == store.get_bytes(oid) == data
