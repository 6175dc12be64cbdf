"""Property tests for the codecs: canonical records, chunking, and detection of any flipped byte."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rfc8785
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nscas.errors import RecordError
from nscas.objects import canonical
from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.writer import Store, init_store
from nscas.upkeep.fsck import fsck
from tests.store.helpers import b3, chunk_path, flip_byte, rewrite_inline, sha256, small_chunks

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# I-JSON values: integers inside the IEEE-754 exact range, finite floats, any text.
_SAFE = 2**53 - 1
scalars = (st.none() | st.booleans() | st.integers(-_SAFE, _SAFE)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty store made once by the migrations; examples copy it (0.4 s faster each)."""
    root = tmp_path_factory.mktemp("template")
    init_store(root).close()
    return root / ".nscas"


@contextmanager
def fresh_store(template: Path) -> Iterator[tuple[Store, Path]]:
    with tempfile.TemporaryDirectory(prefix="nscas-prop-") as d:
        shutil.copytree(template, Path(d) / ".nscas")
        s = open_store(Path(d))
        try:
            yield s, Path(d)
        finally:
            s.close()


# ------------------------------------------------------------------ canonical records

@SETTINGS
@given(json_objects)
def test_canonical_round_trip(value: dict[str, Any]) -> None:
    data = canonical.encode(value)
    assert data == rfc8785.dumps(value)
    back = canonical.decode(data)
    assert back == value
    assert canonical.encode(back) == data
    # Key order of the input never matters.
    assert canonical.encode(dict(reversed(list(value.items())))) == data


@SETTINGS
@given(json_objects)
def test_non_canonical_bytes_are_refused(value: dict[str, Any]) -> None:
    spaced = json.dumps(value, indent=1, ensure_ascii=True).encode()
    if spaced != canonical.encode(value):
        with pytest.raises(RecordError):
            canonical.decode(spaced)


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One store for every example (puts are idempotent); module scope keeps hypothesis happy."""
    s = init_store(tmp_path_factory.mktemp("prop-store"))
    yield s
    s.close()


@settings(SETTINGS, max_examples=30)
@given(params=json_objects)
def test_record_round_trip_through_the_store(shared_store: Store, params: dict[str, Any]) -> None:
    # action/1 takes any JSON object as `params`: the schema holds for every generated value.
    code = shared_store.put_bytes(b"code")
    value = {"nscas": "action/1", "recipe": "prop@1", "code": str(code), "inputs": {},
             "params": params}
    oid = shared_store.put_record(value)
    assert str(oid) == b3(rfc8785.dumps(value))
    assert shared_store.get_record(oid) == value
    assert shared_store.put_record(shared_store.get_bytes(oid)) == oid


# ------------------------------------------------------------------ chunking

@settings(SETTINGS, max_examples=40)
@given(data=st.binary(max_size=30_000) | st.integers(0, 30_000).map(lambda n: b"\0" * n))
def test_any_file_reassembles(empty_store: Path, data: bytes) -> None:
    with small_chunks(), fresh_store(empty_store) as (s, d):
        (d / "f.bin").write_bytes(data)
        oid = s.put_file(d / "f.bin")
        assert str(oid) == b3(data)
        info = s.info(oid)
        assert (info.size, info.sha256) == (len(data), sha256(data))
        assert s.get_bytes(oid) == data
        assert s.open(oid).read() == data
        parts = s.part_ids(oid)
        if len(data) > 5000:
            assert [off for off, _ in parts] == list(range(0, len(data), 5000))
            assert [str(p) for _, p in parts] == [b3(data[o:o + 5000]) for o, _ in parts]
        else:
            assert parts == []


tensor_sizes = st.lists(st.integers(0, 20_000), min_size=1, max_size=6)


@settings(SETTINGS, max_examples=30)
@given(sizes=tensor_sizes, seed=st.integers(0, 2**32 - 1))
def test_any_safetensors_reassembles_tensor_by_tensor(empty_store: Path, sizes: list[int],
                                                     seed: int) -> None:
    from safetensors.numpy import save

    rng = np.random.default_rng(seed)
    tensors = {f"t{i}": rng.integers(0, 4, n, dtype=np.uint8) for i, n in enumerate(sizes)}
    data = save(tensors)
    with small_chunks(), fresh_store(empty_store) as (s, d):
        (d / "m.safetensors").write_bytes(data)
        oid = s.put_file(d / "m.safetensors")
        assert str(oid) == b3(data)
        assert s.get_bytes(oid) == data
        base = 8 + int.from_bytes(data[:8], "little")
        header = json.loads(data[8:base])
        parts = dict(s.part_ids(oid))
        assert Digest.parse(b3(b"")) not in parts.values()
        for name, arr in tensors.items():
            start, end = header[name]["data_offsets"]
            if end == start:
                continue  # no bytes, no part (its offset may be the next tensor's)
            part = parts[base + start]
            assert str(part) == b3(arr.tobytes())
            assert s.get_bytes(part) == arr.tobytes()
            sub = s.part_ids(part)
            if end - start > 6000:  # a large tensor is itself split
                assert [o for o, _ in sub] == list(range(0, end - start, 6000))
            else:
                assert sub == []


# ------------------------------------------------------------------ corruption detection

@settings(SETTINGS, max_examples=int(os.environ.get("NSCAS_FLIP_EXAMPLES", "50")))
@given(data=st.data())
def test_any_flipped_stored_byte_is_found_by_deep_fsck(empty_store: Path,
                                                       data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    random_part = rng.bytes(data.draw(st.integers(1, 12_000), label="random bytes"))
    text_part = b"compressible " * data.draw(st.integers(1, 2000), label="text repeats")
    with small_chunks(), fresh_store(empty_store) as (s, d):
        (d / "f.bin").write_bytes(random_part + text_part)
        s.put_file(d / "f.bin")
        s.put_bytes(rng.bytes(100))
        s.put_record({"nscas": "tasks/1", "role": "train", "records": str(s.put_bytes(text_part)),
                      "count": 1, "ids": ["x"]})
        assert fsck(s, deep=True).findings == ()
        # Every place a stored byte lives: chunk files and inline rows.
        places: list[tuple[str, Digest, int]] = []
        for info in s.iter_objects():
            if info.storage == "file":
                places.append(("file", info.id, info.stored_size))
            elif info.storage == "inline" and info.size > 0:
                places.append(("inline", info.id, info.size))
        where, oid, size = data.draw(st.sampled_from(places), label="object")
        offset = data.draw(st.integers(0, size - 1), label="offset")
        mask = data.draw(st.integers(1, 255), label="mask")
        if where == "file":
            flip_byte(chunk_path(s, oid), offset, mask)
        else:
            stored = bytearray(s.inline_data(oid) or b"")
            stored[offset] ^= mask
            rewrite_inline(s, oid, bytes(stored))
        report = fsck(s, deep=True)
        if not report.errors and s.info(oid).codec == "zstd":
            # zstd frames have bits no decoder reads (e.g. bit 4 of the frame header): such a
            # flip changes no decoded byte, so nothing wrong can ever be read. Prove exactly that.
            assert b3(_unzstd(chunk_path(s, oid).read_bytes())) == str(oid)
            return
        assert report.errors, f"flipping byte {offset} of {where} object {oid} went unnoticed"
        assert any(str(oid) in f.detail or f.object == str(oid) for f in report.errors)
        assert fsck(s, full=True).errors  # whatever --deep finds, --full finds too


def _unzstd(stored: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(stored)


def test_a_flip_no_zstd_decoder_reads_changes_nothing(store: Store) -> None:
    """The one kind of flip deep fsck cannot see: the stored form changed, its content did not."""
    text = b"".join(b"line %d\n" % (i % 37) for i in range(4000))
    oid = store.put_bytes(text)
    path = chunk_path(store, oid)
    flip_byte(path, 4, 0x10)  # the frame header's "unused bit" (RFC 8878 3.1.1.1.1.3)
    assert b3(_unzstd(path.read_bytes())) == str(oid)
    assert fsck(store, deep=True).errors == ()
    assert store.get_bytes(oid) == text
