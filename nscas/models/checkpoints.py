"""The model-checkpoint layer: checkpoint/1 and params/1 records of Hugging Face model
directories and safetensors files (docs/format.md §4), stored or on disk, without any framework.

It sits above the generic store and talks to it only through the seams of nscas.store.protocol;
the store knows nothing of models.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from nscas.errors import InvalidInput
from nscas.objects import canonical
from nscas.objects.digests import Digest, hash_slice
from nscas.objects.dtypes import DTYPES

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader, ObjectStore

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
"""Names of a model directory's weight files, which a tokenizer never reads (gigabytes at
scale): what a step that needs only the tokenizer leaves out."""


def is_weights(name: str) -> bool:
    """Whether a model directory's file ``name`` holds weights."""
    return name.endswith(WEIGHT_SUFFIXES)


def read_header(store: ObjectReader, file_id: Digest) -> tuple[int, dict[str, Any]]:
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
        if dtype not in DTYPES:
            raise InvalidInput(f"tensor {name!r} has unknown dtype {dtype!r}")
        expected = prod(shape) * DTYPES[dtype].bits
        if expected != (end - start) * 8:
            raise InvalidInput(f"tensor {name!r}: shape {shape} of {dtype} does not fill {end - start} bytes")
        yield name, dtype, list(shape), start, end


def delta_base(store: ObjectReader, text: str, *, tree: bool) -> Digest:
    """The object ``--delta-from TEXT`` names, as a base for a put of a directory (``tree``: a
    tree/1, or a checkpoint/1's files) or of a file (a stored file)."""
    oid = store.resolve(text)
    kind = store.info(oid).kind
    if kind == "checkpoint/1":
        oid, kind = Digest.parse(store.get_record(oid)["files"]), "tree/1"
    if tree and kind != "tree/1":
        raise InvalidInput(f"--delta-from {text}: a directory's base is a tree/1 or "
                           f"checkpoint/1, not {kind or 'a blob'}")
    if not tree and kind is not None:
        raise InvalidInput(f"--delta-from {text}: a file's base is a stored file, not a {kind}")
    return oid


def put_checkpoint(store: ObjectStore, hf_dir: Path, *, step: int, parent: Digest | None,
                   extra: dict[str, Any] | None = None, base: Digest | None = None) -> Digest:
    """Store an HF model directory as checkpoint/1 with its params/1 digest (docs/format.md §4):
    the directory as a tree/1, the tensors of its ``*.safetensors`` files as a params/1. With
    ``base`` (a stored checkpoint/1, the one training started from) each new tensor is also
    tried as a delta to the base's tensor of the same name, shape and dtype (§5.5.2)."""
    weights = sorted(hf_dir.glob("*.safetensors"))
    if not weights:
        raise InvalidInput(f"{hf_dir} holds no *.safetensors weights")
    base_tree = None
    if base is not None:
        base_record = store.get_record(base)
        if base_record.get("nscas") != "checkpoint/1":
            raise InvalidInput(f"{base} is not a checkpoint/1; a checkpoint's base is one")
        base_tree = Digest.parse(base_record["files"])
    tree = store.put_tree(hf_dir, base=base_tree)
    entries = store.get_record(tree)["entries"]
    files = [Digest.parse(entries[w.relative_to(hf_dir).as_posix()]["id"]) for w in weights]
    params = store.put_record(params_record(store, files))
    record: dict[str, Any] = {"nscas": "checkpoint/1", "files": str(tree), "params": str(params),
                              "step": step, "parent": str(parent) if parent else None}
    for key, value in (extra or {}).items():
        if key in record:
            raise InvalidInput(f"checkpoint member {key!r} is set by nscas")
        record[key] = value
    return store.put_record(record)


def params_record(store: ObjectStore, files: list[Digest]) -> dict[str, Any]:
    """The params/1 record of the tensors in ``files`` (shards of one model); a tensor stored
    without its own part is cut out and put, hence a store that writes."""
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
