"""A tour of the store commands on a checkpoint-like directory, in-process and as real processes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import blake3
import rfc8785

from nscas.cli import render
from nscas.models.checkpoints import put_checkpoint
from nscas.objects.digests import Digest
from nscas.store.opening import open_store

from .conftest import Nscas, run_process


def _expected_tree(ckpt: Path) -> dict:
    """The tree/1 record docs/format.md §3 prescribes for a directory, computed without nscas."""
    entries = {}
    for f in sorted(ckpt.iterdir()):
        data = f.read_bytes()
        entries[f.name] = {"id": "blake3:" + blake3.blake3(data).hexdigest(), "size": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()}
    return {"nscas": "tree/1", "entries": entries}


def test_tour(nscas: Nscas, store: Path, checkpoint: Path, tmp_path: Path) -> None:
    tree = _expected_tree(checkpoint)
    tree_bytes = rfc8785.dumps(tree)
    tree_id = "blake3:" + blake3.blake3(tree_bytes).hexdigest()
    weights = tree["entries"]["model.safetensors"]
    config = tree["entries"]["config.json"]

    # add: a directory becomes the tree/1 record above, named by a ref.
    r = nscas("add", str(checkpoint), "--ref", "experiments/tour/base", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json() == [{"path": str(checkpoint), "id": tree_id,
                         "sha256": hashlib.sha256(tree_bytes).hexdigest(),
                         "size": len(tree_bytes), "kind": "tree/1"}]

    # show: by ref, by prefix; the record comes back exactly.
    r = nscas("show", "experiments/tour/base", "--json")
    assert r.json() == {"id": tree_id, "kind": "tree/1", "size": len(tree_bytes),
                        "sha256": hashlib.sha256(tree_bytes).hexdigest(), "record": tree}
    assert nscas("show", tree_id[7:15], "--json").json()["id"] == tree_id
    r = nscas("show", "experiments/tour/base")
    assert r.exit_code == 0
    assert f"id:         {tree_id}" in r.stdout.splitlines()
    assert f'$.entries["model.safetensors"].id  blob  {weights["id"]}' in r.stdout
    r = nscas("show", weights["id"])
    assert f"size:       {weights['size']} bytes" in r.stdout
    assert f"tree/1  {tree_id}  $.entries[\"model.safetensors\"].id" in r.stdout

    # cat and get give the same bytes back.
    assert nscas("cat", weights["id"]).stdout_bytes == (checkpoint / "model.safetensors").read_bytes()
    r = nscas("get", "experiments/tour/base", str(tmp_path / "restored"), "--json")
    assert r.json() == {"id": tree_id, "path": str(tmp_path / "restored"), "kind": "tree/1"}
    for f in checkpoint.iterdir():
        assert (tmp_path / "restored" / f.name).read_bytes() == f.read_bytes()

    # lineage, three formats.
    r = nscas("lineage", "experiments/tour/base", "--format", "json")
    assert r.json() == {"id": tree_id, "kind": "tree/1", "refs": ["experiments/tour/base"],
                        "children": [
        {"id": config["id"], "kind": None, "via": '$.entries["config.json"].id'},
        {"id": weights["id"], "kind": None, "via": '$.entries["model.safetensors"].id'},
    ]}
    assert nscas("lineage", "experiments/tour/base", "--json").json() == r.json()
    r = nscas("lineage", "experiments/tour/base")
    assert r.stdout.splitlines() == [
        f"tree/1 {tree_id}  [ref experiments/tour/base]",
        f'|-- blob {config["id"]}  via $.entries["config.json"].id',
        f'`-- blob {weights["id"]}  via $.entries["model.safetensors"].id',
    ]
    r = nscas("lineage", "experiments/tour/base", "--format", "dot")
    assert r.stdout.startswith("digraph lineage {\n") and r.stdout.endswith("}\n")
    assert f'"{tree_id}" -> "{weights["id"]}" [label="entries[\\"model.safetensors\\"].id"];' in r.stdout
    assert r.stdout.count(" -> ") == 2
    r = nscas("lineage", weights["id"], "--down", "--json")
    assert r.json() == {"id": weights["id"], "kind": None, "children": [
        {"id": tree_id, "kind": "tree/1", "via": '$.entries["model.safetensors"].id',
         "linked_from": True, "refs": ["experiments/tour/base"]}]}

    # fsck: a healthy store.
    r = nscas("fsck", "--deep")
    assert r.exit_code == 0, r.stdout
    assert r.stdout.startswith("ok: ")

    # gc: an unnamed blob goes, everything the ref reaches stays.
    stray = tmp_path / "stray.txt"
    stray.write_bytes(b"nobody points at me\n")
    stray_id = nscas("add", str(stray), "--json").json()[0]["id"]
    # By default gc keeps anything younger than an hour (a put elsewhere may be using it).
    r = nscas("gc", "--dry-run")
    assert r.stdout.splitlines() == [
        "would remove 0 object(s) (0 bytes stored), 0 temporary file(s), 0 orphan chunk file(s); "
        "kept 1 object(s) and 0 file(s) younger than 3600 s"]
    r = nscas("gc", "--dry-run", "--min-age", "0", "--json")
    assert r.json() == {"dry_run": True, "min_age": 0, "objects": 1, "bytes": 20,
                        "temporary_files": 0, "orphan_chunks": 0, "young_objects": 0,
                        "young_files": 0, "removed": [stray_id], "work_areas": []}
    assert nscas("cat", stray_id).exit_code == 0
    r = nscas("gc", "--min-age", "0")
    assert r.stdout.splitlines() == [
        f"removed {stray_id}",
        "removed 1 object(s) (20 bytes stored), 0 temporary file(s), 0 orphan chunk file(s); "
        "kept 0 object(s) and 0 file(s) younger than 0 s"]
    assert nscas("cat", stray_id).exit_code == 2
    assert nscas("fsck", "--deep", "--json").json()["ok"] is True
    with open_store(store, readonly=True) as s:
        assert s.has(Digest.parse(weights["id"]))


def test_init_is_idempotent(nscas: Nscas, tmp_path: Path) -> None:
    where = tmp_path / "fresh"
    r = nscas("init", str(where), use_store=False)
    assert r.stdout == f"initialised an empty nscas store in {where / '.nscas'}\n"
    r = nscas("init", str(where), "--json", use_store=False)
    assert (r.exit_code, r.json()) == (0, {"store": str(where / ".nscas")})
    r = nscas("--store", str(where), "init", use_store=False)
    assert r.stdout == f"nscas store already in {where / '.nscas'}\n"


def test_log_lists_records_newest_first_with_receipt_status(nscas: Nscas, store: Path,
                                                             checkpoint: Path) -> None:
    with open_store(store) as s:
        code = s.put_tree(checkpoint)
        action = s.put_record({"nscas": "action/1", "recipe": "train@1", "code": str(code),
                               "inputs": {}, "params": {"steps": 1}})
        env = s.put_record({"nscas": "environment/1", "python": "3.11", "platform": "linux",
                            "packages": {}, "torch": None, "devices": [], "determinism": {}})
        receipt = s.put_record({"nscas": "receipt/1", "action": str(action), "environment": str(env),
                                "outputs": {}, "journals": [], "claims": {}, "started": "t0",
                                "finished": "t1", "status": "failed", "error": "boom"})
        receipt_size = s.info(receipt).size
    r = nscas("log", "--json")
    assert [(e["id"], e["kind"]) for e in r.json()] == [
        (str(receipt), "receipt/1"), (str(env), "environment/1"), (str(action), "action/1"),
        (str(code), "tree/1")]
    first = r.json()[0]
    assert set(first) == {"id", "kind", "time", "size", "recipe", "status", "pipeline", "step",
                          "variant", "claims"}
    assert (first["recipe"], first["status"]) == ("train@1", "failed")
    assert (first["pipeline"], first["step"], first["claims"]) == (None, None, {})
    assert set(r.json()[1]) == {"id", "kind", "time", "size"}
    assert [e["id"] for e in nscas("log", "--kind", "action/1", "--json").json()] == [str(action)]
    assert len(nscas("log", "-n", "2", "--json").json()) == 2
    lines = nscas("log").stdout.splitlines()
    assert lines[0].split() == ["time", "kind", "size", "id", "step", "recipe", "status", "claims"]
    assert lines[1].split()[1:] == ["receipt/1", str(receipt_size), str(receipt), "-",
                                    "train@1", "failed", "-"]
    assert nscas("log", "--kind", "params/1").stdout == "No records of kind params/1 are stored.\n"


def test_lineage_depth_and_seen(nscas: Nscas, store: Path, checkpoint: Path) -> None:
    with open_store(store) as s:
        first = put_checkpoint(s, checkpoint, step=0, parent=None)
        second = put_checkpoint(s, checkpoint, step=1, parent=first)
        files = s.get_record(first)["files"]
    r = nscas("lineage", str(second), "--depth", "1", "--json")
    assert r.json() == {"id": str(second), "kind": "checkpoint/1", "children": [
        {"id": files, "kind": "tree/1", "via": "$.files", "more": 2},
        {"id": s.get_record(first)["params"], "kind": "params/1", "via": "$.params", "more": 2},
        {"id": str(first), "kind": "checkpoint/1", "via": "$.parent", "more": 2}]}
    # Both checkpoints share their files tree: the second time it is marked, not expanded.
    r = nscas("lineage", str(second), "--json").json()
    parent = next(c for c in r["children"] if c["via"] == "$.parent")
    assert {"id": files, "kind": "tree/1", "via": "$.files", "seen": True} in parent["children"]
    down = nscas("lineage", files, "--down", "--depth", "1", "--json").json()
    assert sorted(c["id"] for c in down["children"]) == sorted([str(first), str(second)])


def test_rich_rendering_on_a_terminal(nscas: Nscas, checkpoint: Path, monkeypatch) -> None:
    (checkpoint / "notes[red].txt").write_text("a file name that looks like rich markup\n")
    tree_id = nscas("add", str(checkpoint), "--ref", "tty/base", "--json").json()[0]["id"]
    monkeypatch.setattr(render, "is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")
    for args in (["show", "tty/base"], ["log"], ["ref", "list"], ["ref", "log"],
                 ["lineage", "tty/base"], ["add", str(checkpoint)]):
        r = nscas(*args)
        assert r.exit_code == 0, (args, r.stderr)
        # Tables and trees abbreviate IDs on a terminal to 12 hex digits, a valid prefix.
        assert tree_id[7:19] in r.stdout, (args, r.stdout)
        assert "|-- " not in r.stdout and "path  kind" not in r.stdout  # not the plain form
    assert "\x1b[" not in r.stdout  # rich writes no colour codes when the stream is not a terminal
    assert '$.entries["notes[red].txt"].id' in nscas("show", "tty/base").stdout


def test_tour_as_real_processes(tmp_path: Path, checkpoint: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    r = run_process("init", cwd=project)
    assert r.exit_code == 0, r.stderr
    sub = project / "deep" / "er"
    sub.mkdir(parents=True)
    # The store is found upwards from a subdirectory, like .git.
    r = run_process("add", str(checkpoint), "--ref", "experiments/p/base", "--json", cwd=sub)
    assert r.exit_code == 0, r.stderr
    (entry,) = json.loads(r.stdout)
    tree_id = "blake3:" + blake3.blake3(rfc8785.dumps(_expected_tree(checkpoint))).hexdigest()
    assert entry["id"] == tree_id
    # $NSCAS_STORE points anywhere else.
    r = run_process("show", "experiments/p/base", "--json", cwd=tmp_path,
                    env={"NSCAS_STORE": str(project)})
    assert json.loads(r.stdout)["record"] == _expected_tree(checkpoint)
    weights = _expected_tree(checkpoint)["entries"]["model.safetensors"]["id"]
    r = run_process("cat", weights, cwd=sub)
    assert r.stdout_bytes == (checkpoint / "model.safetensors").read_bytes()
    r = run_process("lineage", "experiments/p/base", "--format", "dot", cwd=sub)
    assert r.stdout.count(" -> ") == 2
    r = run_process("fsck", "--deep", "--json", cwd=sub)
    assert (r.exit_code, json.loads(r.stdout)["ok"]) == (0, True)
    r = run_process("gc", "--json", cwd=sub)
    assert json.loads(r.stdout)["objects"] == 0
