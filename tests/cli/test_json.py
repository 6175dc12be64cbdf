"""The ``--json`` output of every command: exact shapes and values, pretty-printed with indent 2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .conftest import Nscas


def test_json_shapes(nscas: Nscas, store: Path, checkpoint: Path, tmp_path: Path) -> None:
    config = checkpoint / "config.json"
    data = config.read_bytes()

    r = nscas("add", str(config), str(checkpoint), "--json")
    assert r.stdout == json.dumps(r.json(), indent=2) + "\n"
    blob, tree = r.json()
    assert blob == {"path": str(config), "id": blob["id"], "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data), "kind": "blob"}
    assert (tree["kind"], set(tree)) == ("tree/1", {"path", "id", "sha256", "size", "kind"})

    assert nscas("show", blob["id"], "--json").json() == {
        "id": blob["id"], "kind": "blob", "size": len(data), "sha256": blob["sha256"]}
    assert set(nscas("show", tree["id"], "--json").json()) == {"id", "kind", "size", "sha256", "record"}

    r = nscas("ref", "set", "experiments/j", tree["id"], "-m", "first", "--json")
    assert r.json() == {"name": "experiments/j", "old": None, "new": tree["id"]}
    r = nscas("ref", "set", "experiments/j", blob["id"], "--json")
    assert r.json() == {"name": "experiments/j", "old": tree["id"], "new": blob["id"]}
    assert nscas("ref", "list", "--json").json() == [
        {"name": "experiments/j", "id": blob["id"], "kind": "blob"}]
    assert nscas("ref", "list", "--prefix", "tags/", "--json").json() == []
    log = nscas("ref", "log", "experiments/j", "--json").json()
    assert [(e["old"], e["new"], e["message"]) for e in log] == [
        (tree["id"], blob["id"], ""), (None, tree["id"], "first")]
    assert set(log[0]) == {"name", "old", "new", "time", "message"}
    assert len(nscas("ref", "log", "--limit", "1", "--json").json()) == 1

    entries = nscas("log", "--json").json()
    assert [(e["id"], e["kind"]) for e in entries] == [(tree["id"], "tree/1")]
    assert entries[0]["time"].endswith("Z") and entries[0]["size"] == tree["size"]

    assert nscas("lineage", blob["id"], "--down", "--json").json() == {
        "id": blob["id"], "kind": None, "refs": ["experiments/j"],
        "children": [{"id": tree["id"], "kind": "tree/1", "via": '$.entries["config.json"].id',
                      "linked_from": True}]}

    report = nscas("fsck", "--deep", "--sample", "1", "--json").json()
    assert set(report) == {"ok", "mode", "objects", "deep_checked", "deep_bytes", "complete",
                           "seconds", "errors", "findings"}
    assert (report["ok"], report["errors"], report["findings"], report["complete"]) == (True, 0, [], True)
    assert report["mode"] == "deep"
    assert report["objects"] >= 5  # blob, tree, safetensors file and its parts

    dest = tmp_path / "out.json"
    assert nscas("get", blob["id"], str(dest), "--json").json() == {
        "id": blob["id"], "path": str(dest), "kind": "blob"}
    assert dest.read_bytes() == data

    assert nscas("gc", "--dry-run", "--json").json()["dry_run"] is True
    assert nscas("init", str(store), "--json").json() == {"store": str(store)}


def test_fsck_reports_interrupted_writes_as_notes(nscas: Nscas, store: Path) -> None:
    (store / "tmp" / "leftover.part").write_bytes(b"half a chunk")
    r = nscas("fsck")
    assert r.exit_code == 0  # notes are not errors
    assert f"note: temporary-file: {store / 'tmp' / 'leftover.part'}:" in r.stdout
    assert r.stdout.splitlines()[-1].startswith("ok: 0 objects checked; 0 error(s), 1 note(s)")
    # Written a moment ago: it may belong to a put in another process, so gc keeps it.
    kept = nscas("gc", "--json").json()
    assert (kept["temporary_files"], kept["young_files"], kept["min_age"]) == (0, 1, 3600)
    assert (store / "tmp" / "leftover.part").exists()
    assert nscas("gc", "--min-age", "0", "--json").json()["temporary_files"] == 1
    assert not (store / "tmp" / "leftover.part").exists()
