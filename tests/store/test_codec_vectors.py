"""The shared chunk codec vectors (tests/vectors/codecs, written from docs/format.md §5.5.1 by
the verifiers' side) read through the store: each case decodes to the bytes of its ID, or is
refused with one line naming the leaf and nothing of it handed out."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import blake3
import pytest

from nscas.errors import NscasError
from nscas.objects.digests import Digest
from nscas.store.writer import Store, init_store

HERE = Path(__file__).resolve().parents[1] / "vectors" / "codecs"
MANIFEST = json.loads((HERE / "manifest.json").read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = MANIFEST["cases"]
BY_NAME = {c["name"]: c for c in CASES}


def _world(case: dict[str, Any]) -> list[dict[str, Any]]:
    found = [case]
    while found[-1]["base"] is not None and BY_NAME[found[-1]["base"]] not in found:
        found.append(BY_NAME[found[-1]["base"]])
    return found


def _hex(oid: str | None) -> str | None:
    return None if oid is None else oid.removeprefix("blake3:")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_the_store_reads_or_refuses_each_case_as_the_vector_says(
        tmp_path: Path, case: dict[str, Any]) -> None:
    init_store(tmp_path).close()
    root = tmp_path / ".nscas"
    con = sqlite3.connect(root / "nscas.db")
    with con:
        for link in _world(case):
            hex_id = _hex(link["id"]) or ""
            path = root / "data" / hex_id[:2] / hex_id[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes((HERE / link["file"]).read_bytes())
            con.execute("INSERT INTO objects (id, size, sha256, kind, storage, codec, "
                        "stored_size, data, created, base) VALUES (?, ?, ?, NULL, 'file', ?, ?, "
                        "NULL, ?, ?)", (hex_id, link["size"], link["sha256"], link["codec"],
                                        link["stored_size"], time.time(), _hex(link["base_id"])))
    con.close()
    store = Store(root)
    try:
        oid = Digest.parse(case["id"])
        if case["expect"] == "ok":
            data = store.get_bytes(oid)
            assert hashlib.sha256(data).hexdigest() == case["sha256"]
            assert blake3.blake3(data).hexdigest() == oid.hex
        else:
            with pytest.raises(NscasError) as caught:
                store.get_bytes(oid)
            assert "\n" not in str(caught.value)
    finally:
        store.close()
