"""Chunk codecs (docs/format.md §5.5.1, §5.5.2): byte planes, XOR and integer-difference deltas
round-trip at any size, the writer keeps the smallest, and every limit of the format is refused
before decoding, in one line naming the chunk."""

from __future__ import annotations

import io
from pathlib import Path

import blake3
import numpy as np
import pytest
import zstandard

from nscas.errors import CodecError, DecodeBoundExceeded, IntegrityError
from nscas.objects import codecs
from nscas.objects.codecs import Base
from nscas.objects.decoding import decode, plain_digest
from nscas.objects.digests import Digest
from nscas.objects.segments import TENSOR_SPLIT
from nscas.store.putting import Leaf
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck, gc
from tests.store.helpers import raw_update, write_safetensors

OID = Digest("ab" * 32)


def _id(data: bytes) -> Digest:
    return Digest(blake3.blake3(data).hexdigest())


def _planes_by_hand(data: bytes, w: int) -> bytes:
    """The plane stream as docs/format.md words it, one byte at a time."""
    q, r = divmod(len(data), w)
    out = bytearray()
    for k in range(w):
        out += bytes(data[i * w + k] for i in range(q))
    return bytes(out + data[q * w:q * w + r])


def _fine_tune(n: int, seed: int = 0) -> tuple[bytes, bytes]:
    rng = np.random.default_rng(seed)
    parent = rng.standard_normal(n, dtype=np.float32)
    child = (parent + rng.standard_normal(n, dtype=np.float32) * 1e-4).astype(np.float32)
    return parent.tobytes(), child.tobytes()


@pytest.mark.parametrize("w", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 7, 1029, 4099])
def test_the_plane_stream_is_the_format_s_and_unplanes(w: int, n: int) -> None:
    data = np.random.default_rng(n).bytes(n)
    stream = codecs.planes(data, w)
    assert stream == _planes_by_hand(data, w)
    assert bytes(codecs.unplanes(stream, w)) == data


@pytest.mark.parametrize("codec", ["raw", "zstd", "planes2", "planes4", "planes8",
                                   "xor1", "xor2", "xor4", "xor8", "sub2", "sub4", "sub8"])
@pytest.mark.parametrize("n", [4097, 12345, 65543])  # n mod W != 0 for every W > 1
def test_every_codec_round_trips_at_odd_sizes(codec: str, n: int) -> None:
    parent, child = (b[:n] for b in _fine_tune(n // 4 + 2))
    w = codecs.width(codec)
    base = None
    if codec == "raw":
        stored = child
    elif codec == "zstd":
        stored = zstandard.ZstdCompressor().compress(child)
    elif codecs.is_delta(codec):
        residual = (codecs.sub_residual(child, parent, w) if codecs.is_sub(codec)
                    else codecs.xor(child, parent))
        stored = bytes.fromhex(_id(parent).hex) + codecs.pack_planes(residual, w)
        base = Base(id=_id(parent), load=lambda: parent)
    else:
        stored = codecs.pack_planes(child, w)
    assert decode(stored, codec, _id(child), n, base=base) == child
    assert plain_digest(io.BytesIO(stored), codec, _id(child), n, base=base) == (_id(child), n)


def test_the_writer_keeps_the_smallest_and_raw_unless_it_saves_3_percent() -> None:
    parent, child = _fine_tune(300_000)
    codec, stored = codecs.choose(child, w=4, base=(_id(parent), parent))
    assert codec == "sub4"  # a small step of a float: a small difference, bits flipped by XOR
    head = bytes.fromhex(_id(parent).hex)
    assert len(stored) < len(head + codecs.pack_planes(codecs.xor(child, parent), 4))
    # Low mantissa bytes flipped at random: XOR leaves three zero planes, the difference two.
    flips = np.random.default_rng(2).integers(0, 256, len(parent) // 4, dtype=np.uint32)
    flipped = (np.frombuffer(parent, np.uint32) ^ flips).tobytes()
    assert codecs.choose(flipped, w=4, base=(_id(parent), parent))[0] == "xor4"
    planes = codecs.choose(child, w=4)
    assert planes[0] == "planes4" and len(stored) < len(planes[1])
    noise = np.random.default_rng(1).bytes(1 << 20)
    assert codecs.choose(noise, w=4)[0] == "raw"
    assert codecs.choose(noise, w=1, base=(_id(parent), parent[:1 << 20]))[0] == "raw"


# ------------------------------------------------------------------ the store


def _pair(tmp_path: Path, n: int = 1 << 18) -> tuple[Path, Path, bytes]:
    parent, child = _fine_tune(n)
    a = tmp_path / "a" / "model.safetensors"
    b = tmp_path / "b" / "model.safetensors"
    a.parent.mkdir()
    b.parent.mkdir()
    write_safetensors(a, {"w": np.frombuffer(parent, np.float32).reshape(-1, 64),
                          "bias": np.zeros(3, np.float32)})
    data = write_safetensors(b, {"w": np.frombuffer(child, np.float32).reshape(-1, 64),
                                 "bias": np.ones(3, np.float32)})
    return a, b, data


def _tensor_leaf(store: Store, file_id: Digest) -> Digest:
    return max((store.info(p) for _, p in store.part_ids(file_id)), key=lambda i: i.size).id


def test_a_child_put_against_its_parent_is_a_delta_and_reads_back(store: Store,
                                                                   tmp_path: Path) -> None:
    a, b, data = _pair(tmp_path)
    parent = store.put_file(a)
    assert store.info(_tensor_leaf(store, parent)).codec == "planes4"
    child = store.put_file(b, base=parent)
    leaf = store.info(_tensor_leaf(store, child))
    assert leaf.codec == "sub4" and leaf.base == _tensor_leaf(store, parent)
    assert leaf.stored_size < 0.9 * store.info(_tensor_leaf(store, parent)).stored_size
    assert store.get_bytes(child) == data
    assert fsck(store, deep=True).ok


def test_a_tree_base_matches_files_by_path_and_a_32_mib_tensor_round_trips(
        store: Store, tmp_path: Path) -> None:
    n = TENSOR_SPLIT // 4 + 5  # one piece of 32 MiB and an odd one
    parent, child = _fine_tune(n, seed=3)
    for name, body in (("a", parent), ("b", child)):
        (tmp_path / name).mkdir()
        write_safetensors(tmp_path / name / "model.safetensors",
                          {"w": np.frombuffer(body, np.float32)})
        (tmp_path / name / "notes.txt").write_text("same")
    base = store.put_tree(tmp_path / "a")
    tree = store.put_tree(tmp_path / "b", base=base)
    entry = store.get_record(tree)["entries"]["model.safetensors"]
    file_id = Digest.parse(entry["id"])
    pieces = [store.info(leaf) for leaf, *_ in store.leaves(file_id)][1:]
    assert [p.size for p in pieces] == [TENSOR_SPLIT, 20] and pieces[0].codec == "sub4"
    out = tmp_path / "out"
    store.materialise(tree, out)
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_gc_keeps_a_base_that_a_kept_delta_needs(store: Store, tmp_path: Path) -> None:
    a, b, data = _pair(tmp_path)
    parent = store.put_file(a)
    child = store.put_file(b, base=parent)
    store.ref_set("child", child)  # nothing names the parent
    report = gc(store, min_age=0)
    assert parent in report.objects
    base = store.info(_tensor_leaf(store, child)).base
    assert base is not None and store.has(base)
    assert store.get_bytes(child) == data
    assert fsck(store, deep=True).ok


# ------------------------------------------------------------------ refusals


def _plant(store: Store, data: bytes, codec: str, stored: bytes, base: Digest | None,
           size: int | None = None) -> Digest:
    """A leaf row and chunk file written behind the writer's back (no check)."""
    oid = _id(data)
    path = store.chunks.path(oid)  # type: ignore[attr-defined]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(stored)
    store._insert([Leaf(hex=oid.hex, size=len(data) if size is None else size, sha256=None,
                        storage="file", codec=codec, stored_size=len(stored),
                        base=None if base is None else base.hex)], [], [])
    return oid


Family = tuple[Store, bytes, Digest, bytes, str]


@pytest.fixture(params=["xor4", "sub4"])
def family(store: Store, request: pytest.FixtureRequest) -> Family:
    """A store holding a raw parent leaf; the child's bytes (a fine-tune of it); the delta
    codec a case is of."""
    parent, child = _fine_tune(5000)
    return store, child, store.put_bytes(parent), parent, request.param


def _residual(child: bytes, parent: bytes, codec: str) -> bytes | bytearray | memoryview:
    w = codecs.width(codec)
    return codecs.sub_residual(child, parent, w) if codecs.is_sub(codec) else codecs.xor(child,
                                                                                       parent)


def _delta(child: bytes, parent: bytes, named: bytes | None = None, codec: str = "xor4") -> bytes:
    return (named if named is not None else bytes.fromhex(_id(parent).hex)) + \
        codecs.pack_planes(_residual(child, parent, codec), codecs.width(codec))


def _refused(store: Store, oid: Digest, problem: str, *needles: str) -> None:
    with pytest.raises(IntegrityError) as caught:
        store.get_bytes(oid)
    message = str(caught.value)
    assert "\n" not in message and str(oid) in message
    for needle in needles:
        assert needle in message, message
    found = [f for f in fsck(store, deep=True).findings if f.object == str(oid)]
    assert [f.problem for f in found] == [problem], found


def test_a_good_delta_passes(family: Family) -> None:
    store, child, parent_id, parent, codec = family
    oid = _plant(store, child, codec, _delta(child, parent, codec=codec), parent_id)
    assert store.get_bytes(oid) == child
    assert fsck(store, deep=True).ok


def test_an_unknown_codec(family: Family) -> None:
    store, child, _, _, codec = family
    oid = _plant(store, child, codec[:3] + "3", child, None)
    _refused(store, oid, "bad-codec", f"unknown codec '{codec[:3]}3'")


def test_a_missing_header(family: Family) -> None:
    store, child, parent_id, _, codec = family
    oid = _plant(store, child, codec, b"\x00" * 7, parent_id)
    _refused(store, oid, "bad-base", "32-byte base header")


def test_a_header_naming_another_base(family: Family) -> None:
    store, child, parent_id, parent, codec = family
    oid = _plant(store, child, codec, _delta(child, parent, named=b"\x01" * 32, codec=codec),
                 parent_id)
    _refused(store, oid, "bad-base", "in the header")


def test_a_missing_base(family: Family) -> None:
    store, child, _, parent, codec = family
    oid = _plant(store, child, codec, _delta(child, parent, codec=codec), Digest("cd" * 32))
    _refused(store, oid, "bad-base", "cd" * 32)


def test_a_base_of_another_size(family: Family) -> None:
    store, child, _, parent, codec = family
    other = store.put_bytes(parent[:-4])
    oid = _plant(store, child, codec,
                 _delta(child, parent, bytes.fromhex(other.hex), codec=codec), other)
    _refused(store, oid, "bad-base", f"a base of {len(child)} bytes")


def test_a_chain_deeper_than_d(family: Family) -> None:
    store, child, base, _parent, codec = family
    rng = np.random.default_rng(5)
    ids = []
    for _ in range(codecs.CHAIN_MAX + 1):  # each a real delta of the one before
        body = rng.bytes(len(child))
        ids.append(_plant(store, body, "xor1" if codec == "xor4" else codec, b"", base))
        base = ids[-1]
    _refused(store, ids[-1], "bad-chain", f"at most {codecs.CHAIN_MAX} deltas deep")
    assert store.chain_depth(ids[-2]) == codecs.CHAIN_MAX


def test_a_cycle(family: Family) -> None:
    store, child, _, _parent, codec = family
    a_bytes = np.random.default_rng(6).bytes(len(child))
    a, b = _id(a_bytes), _id(child)
    _plant(store, a_bytes, codec, b"", b)
    oid = _plant(store, child, codec, b"", a)
    _refused(store, oid, "bad-chain", "twice in its chain")


def test_a_bomb_decoding_past_its_size(family: Family) -> None:
    store, child, parent_id, _parent, codec = family
    stored = bytes.fromhex(parent_id.hex) + zstandard.ZstdCompressor().compress(
        bytes(50 * len(child)))
    oid = _plant(store, child, codec, stored, parent_id)
    with pytest.raises(DecodeBoundExceeded, match=f"at most {len(child)} bytes"):
        store.get_bytes(oid)
    assert [f.problem for f in fsck(store, deep=True).findings
            if f.object == str(oid)] == ["size-mismatch"]


def test_a_short_stream(family: Family) -> None:
    store, child, parent_id, parent, codec = family
    stored = bytes.fromhex(parent_id.hex) + codecs.pack_planes(
        _residual(child, parent, codec)[:-8], 4)
    oid = _plant(store, child, codec, stored, parent_id)
    _refused(store, oid, "size-mismatch", f"a plane stream of {len(child)} bytes")


def test_a_delta_that_decodes_to_other_bytes(family: Family) -> None:
    store, child, parent_id, parent, codec = family
    wrong = bytearray(child)
    wrong[100] ^= 1
    oid = _plant(store, child, codec, _delta(bytes(wrong), parent, codec=codec), parent_id)
    _decodes_to_other_bytes(store, oid)


def test_a_sub_delta_of_another_width_decodes_to_other_bytes(
        family: Family) -> None:
    store, child, parent_id, parent, _codec = family
    stored = bytes.fromhex(parent_id.hex) + codecs.pack_planes(
        codecs.sub_residual(child, parent, 2), 2)
    oid = _plant(store, child, "sub4", stored, parent_id)  # a sub2 stream recorded as sub4
    _decodes_to_other_bytes(store, oid)


def _decodes_to_other_bytes(store: Store, oid: Digest) -> None:
    """A read of ``oid`` is refused naming it, and ``fsck --deep`` finds its hash wrong."""
    with pytest.raises(IntegrityError, match=f"expected {oid}"):
        store.get_bytes(oid)
    assert [f.problem for f in fsck(store, deep=True).findings
            if f.object == str(oid)] == ["hash-mismatch"]


def test_a_base_removed_behind_the_store_s_back_is_found(
        family: Family) -> None:
    store, child, parent_id, parent, codec = family
    oid = _plant(store, child, codec, _delta(child, parent, codec=codec), parent_id)
    raw_update(store, "DELETE FROM objects WHERE id = ?", (parent_id.hex,))
    _refused(store, oid, "bad-base", parent_id.hex)


def test_a_transfer_refuses_a_delta_whose_base_is_absent(
        family: Family, tmp_path: Path) -> None:
    from nscas.store.writer import init_store

    _store, child, parent_id, parent, codec = family
    other = init_store(tmp_path / "other")
    try:
        with pytest.raises(CodecError, match="in the store"):
            other.put_stored(_id(child), codec, len(child), _delta(child, parent, codec=codec),
                             base=parent_id)
        assert not other.has(_id(child))
    finally:
        other.close()


def test_put_checkpoint_with_a_base_stores_its_tensors_as_deltas(store: Store,
                                                                  tmp_path: Path) -> None:
    from nscas.errors import InvalidInput
    from nscas.models.checkpoints import put_checkpoint

    a, b, data = _pair(tmp_path)
    for d in (a.parent, b.parent):
        (d / "config.json").write_text("{}")
    seed = put_checkpoint(store, a.parent, step=0, parent=None)
    tuned = put_checkpoint(store, b.parent, step=4, parent=seed, base=seed)
    files = Digest.parse(store.get_record(tuned)["files"])
    weights = Digest.parse(store.get_record(files)["entries"]["model.safetensors"]["id"])
    assert store.info(_tensor_leaf(store, weights)).codec == "sub4"
    assert store.get_bytes(weights) == data
    with pytest.raises(InvalidInput, match="not a checkpoint/1"):
        put_checkpoint(store, b.parent, step=4, parent=seed, base=files)


@pytest.mark.parametrize("w", [2, 4])
def test_each_plane_s_frame_is_at_most_its_zstd_3_frame_and_decodes_to_the_stream(w: int) -> None:
    parent, child = _fine_tune(1 << 18)
    for data in (parent, codecs.xor(child, parent)):
        packed = codecs.pack_planes(data, w)
        assert zstandard.ZstdDecompressor().stream_reader(
            packed, read_across_frames=True).read() == codecs.planes(data, w)
        stream = codecs.planes(data, w)
        q = len(data) // w
        cuts = [stream[k * q:(k + 1) * q] for k in range(w - 1)] + [stream[(w - 1) * q:]]
        level_3 = sum(len(zstandard.ZstdCompressor(level=3).compress(c)) for c in cuts)
        assert len(packed) <= 1.01 * level_3
