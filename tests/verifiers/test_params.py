"""params/1 rebuilt from safetensors files, compared with a hand computation."""

from __future__ import annotations

import hashlib
import json
import struct
import tracemalloc
from pathlib import Path

import blake3
import numpy as np
import pytest
import rfc8785
from safetensors.numpy import save_file

from nscas.verifiers.core.errors import InvalidArgument, SafetensorsError
from nscas.verifiers.records.reading import parse_record
from nscas.verifiers.training.params import params_digest, read_header, sha256_stream

DTYPES = {np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int8: "I8",
          np.uint8: "U8", np.float64: "F64", np.bool_: "BOOL"}


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "model.embed.weight": rng.standard_normal((6, 4)).astype(np.float32),
        "model.layers.0.bias": rng.standard_normal(4).astype(np.float16),
        "model.step": np.array(12, dtype=np.int64),
        "model.mask": np.array([True, False, True]),
        "model.empty": np.zeros((0, 3), dtype=np.float32),
        "lm_head.scale": np.arange(5, dtype=np.int8),
    }


def hand_record(arrays: dict[str, np.ndarray]) -> tuple[str, dict[str, str]]:
    ids = {}
    entries = {}
    for name, array in arrays.items():
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        ids[name] = "blake3:" + blake3.blake3(raw).hexdigest()
        entries[name] = {"dtype": DTYPES[array.dtype.type], "shape": list(array.shape),
                         "data": ids[name]}
    record = rfc8785.dumps({"nscas": "params/1", "tensors": entries})
    return "blake3:" + blake3.blake3(record).hexdigest(), ids


def test_digest_equals_hand_computation(tmp_path: Path) -> None:
    arrays = tensors()
    path = tmp_path / "model.safetensors"
    save_file(arrays, str(path), metadata={"format": "pt"})
    result = params_digest(path, with_sha256=True)
    expected_id, expected_ids = hand_record(arrays)
    assert result.id == expected_id
    assert {n: t.data for n, t in result.tensors.items()} == expected_ids
    assert result.tensors["model.embed.weight"].shape == (6, 4)
    assert result.tensors["model.step"].shape == ()
    assert result.tensors["model.embed.weight"].size == 96
    raw = arrays["model.embed.weight"].tobytes()
    assert result.tensors["model.embed.weight"].sha256 == hashlib.sha256(raw).hexdigest()
    # The rebuilt bytes are a valid canonical params/1 record with one link per tensor.
    record = parse_record(result.record)
    assert record.id == result.id and record.kind == "params/1"
    assert len(record.links) == len(arrays)


def test_metadata_and_file_layout_do_not_change_the_digest(tmp_path: Path) -> None:
    arrays = tensors()
    save_file(arrays, str(tmp_path / "a.safetensors"))
    save_file(arrays, str(tmp_path / "b.safetensors"), metadata={"format": "pt", "x": "y"})
    names = list(arrays)
    save_file({n: arrays[n] for n in names[:3]}, str(tmp_path / "s1.safetensors"))
    save_file({n: arrays[n] for n in names[3:]}, str(tmp_path / "s2.safetensors"))
    one = params_digest(tmp_path / "a.safetensors").id
    assert params_digest(str(tmp_path / "b.safetensors")).id == one
    assert params_digest([tmp_path / "s1.safetensors", tmp_path / "s2.safetensors"]).id == one
    changed = dict(arrays, **{"model.step": np.array(13, dtype=np.int64)})
    save_file(changed, str(tmp_path / "c.safetensors"))
    assert params_digest(tmp_path / "c.safetensors").id != one


def test_repeated_tensor_across_shards_is_refused(tmp_path: Path) -> None:
    arrays = tensors()
    save_file(arrays, str(tmp_path / "a.safetensors"))
    with pytest.raises(SafetensorsError, match="repeats"):
        params_digest([tmp_path / "a.safetensors", tmp_path / "a.safetensors"])


def write_raw(path: Path, header: dict, buffer: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + buffer)
    return path


@pytest.mark.parametrize("header,buffer,why", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "buffer"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs"),
    ({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype"),
    ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
      "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3, "starts at"),
    ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, b"\0" * 4, "starts at"),
    ({"a": {"dtype": "U8", "shape": [2]}}, b"\0" * 2, "exactly"),
    ([1, 2], b"", "not a JSON object"),
])
def test_malformed_files_are_refused(tmp_path: Path, header, buffer, why) -> None:
    path = write_raw(tmp_path / "bad.safetensors", header, buffer)
    with pytest.raises(SafetensorsError, match=why):
        params_digest(path)


def test_truncated_and_duplicate_key_headers(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(SafetensorsError, match="ends inside"):
        read_header(path)
    text = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}}'
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0")
    with pytest.raises(SafetensorsError, match="duplicate key"):
        read_header(path)


def test_streaming_memory_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    big = np.arange(12 * 1024 * 1024, dtype=np.float32).reshape(3072, 4096)  # 48 MiB
    save_file({"big": big, "small": np.ones(3, dtype=np.float32)}, str(path))
    expected = "blake3:" + blake3.blake3(big.tobytes()).hexdigest()
    del big
    tracemalloc.start()
    try:
        result = params_digest(path, with_sha256=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.tensors["big"].data == expected
    assert peak < 4 * 1024 * 1024, f"peak traced memory {peak} bytes"


def test_sha256_stream_by_hand(tmp_path: Path) -> None:
    arrays = tensors()
    path = tmp_path / "m.safetensors"
    save_file(arrays, str(path))
    order = ["model.embed.weight", "model.layers.0.bias", "lm_head.scale"]
    digest = hashlib.sha256()
    digest.update(b"model.embed.weight\0(6, 4)\0" + arrays["model.embed.weight"].tobytes())
    digest.update(b"model.layers.0.bias\0(4,)\0" + arrays["model.layers.0.bias"].tobytes())
    digest.update(b"lm_head.scale\0(5,)\0" + arrays["lm_head.scale"].tobytes())
    assert sha256_stream(path, order) == digest.hexdigest()
    # Order matters.
    assert sha256_stream(path, list(reversed(order))) != digest.hexdigest()
    scalar = hashlib.sha256(b"model.step\0()\0" + arrays["model.step"].tobytes()).hexdigest()
    assert sha256_stream(path, ["model.step"]) == scalar


def test_sha256_stream_refuses_missing_and_repeated_names(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file(tensors(), str(path))
    with pytest.raises(InvalidArgument, match="not in the safetensors"):
        sha256_stream(path, ["model.embed.weight", "lm_head.weight"])
    with pytest.raises(InvalidArgument, match="repeat"):
        sha256_stream(path, ["model.embed.weight", "model.embed.weight"])
