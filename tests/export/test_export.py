"""Export: layout by role, every file is its object, determinism, SHA256SUMS, the tar, weights."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import blake3
import pytest

from nscas.bundle.exporting import export_bundle
from nscas.bundle.format import FORMAT_V1
from nscas.errors import DestinationExists, IntegrityError
from tests.export.conftest import Published, read_tree


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_bytes())


@pytest.mark.parametrize("bundle_format", ["nscas-bundle/2", FORMAT_V1])
def test_every_object_of_the_closure_is_in_exactly_one_place(published: Published,
                                                              tmp_path: Path,
                                                              bundle_format: str) -> None:
    """One section each; format 1 one file each, format 2 repeats only model files."""
    store = published.store
    report = export_bundle(store, published.target, tmp_path / "b", bundle_format=bundle_format)
    m = _manifest(tmp_path / "b")
    assert m["format"] == bundle_format and m["target"] == str(published.target)
    files = [e["id"] for e in m["objects"].values()]
    closure = {str(d) for d in store.closure([published.target])}
    assert sorted({*files} | {*m["derived"]} | {*m["omitted"]}) == sorted(closure)
    assert len(set(files)) + len(m["derived"]) + len(m["omitted"]) == len(closure)
    repeated = {p for p, e in m["objects"].items() if files.count(e["id"]) > 1}
    if bundle_format == FORMAT_V1:
        assert repeated == set()
    else:  # the config and tokenizer both checkpoints share
        assert repeated == {f"models/{arm}/{name}" for arm in ("seed", "clean-single")
                            for name in ("config.json", "tokenizer.json")}
    assert m["omitted"] == {}
    assert set(m["derived"]) == {str(t) for t in published.tensors}
    assert (report.files, report.derived, report.omitted) == (len(files), 3, ())
    for path, entry in m["objects"].items():
        data = (tmp_path / "b" / path).read_bytes()
        assert "blake3:" + blake3.blake3(data).hexdigest() == entry["id"], path
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size"]
        info = store.info(store.resolve(entry["id"]))
        assert entry["kind"] == info.kind
    for tid, d in m["derived"].items():  # each tensor is a range of a weights file, cut out here
        source = next(p for p, e in m["objects"].items() if e["id"] == d["from"])
        assert source.endswith("model.safetensors")
        cut = (tmp_path / "b" / source).read_bytes()[d["offset"]:d["offset"] + d["size"]]
        assert "blake3:" + blake3.blake3(cut).hexdigest() == tid
        assert hashlib.sha256(cut).hexdigest() == d["sha256"]


def test_paths_follow_roles(published: Published, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "b")
    m = _manifest(tmp_path / "b")
    by_path = {p: e["id"] for p, e in m["objects"].items()}
    short = published.target.short
    assert by_path[f"receipts/evaluate-{short}.json"] == str(published.target)
    # Named by the action input that cites it.
    assert by_path["receipts/baseline.json"] == str(published.baseline)
    assert by_path["receipts/training.json"] == str(published.train_receipt)
    assert by_path["training/clean-single/rank-0.journal.jsonl"] == str(published.journal_entries)
    for arm in ("seed", "clean-single"):  # arms are the names the commitment gives the checkpoints
        assert f"evaluations/{arm}/generations.jsonl" in by_path
        assert f"evaluations/{arm}/checks.jsonl" in by_path
    assert by_path["models/seed/model.safetensors"] == str(published.weight_files[0])
    assert by_path["models/clean-single/model.safetensors"] == str(published.weight_files[1])
    # The config is the same object in both checkpoints: a copy in each model folder.
    assert by_path["models/clean-single/config.json"] == by_path["models/seed/config.json"]
    for arm in ("seed", "clean-single"):
        assert {p.rpartition("/")[2] for p in by_path if p.startswith(f"models/{arm}/")} == {
            "config.json", "model.safetensors", "tokenizer.json"}
    assert {"tasks/test.jsonl", "tasks/train.jsonl",
            "code/evaluate@2/nscas/recipes/evaluate/recipe.py"} <= by_path.keys()
    others = [p for p in by_path if p.startswith(("records/", "blobs/"))]
    assert all(p == f"records/{by_path[p][7:]}.json" for p in others)
    assert not [p for p in others if p.startswith("blobs/")]


def test_sha256sum_check_passes(published: Published, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "b")
    sums = (tmp_path / "b" / "SHA256SUMS").read_text()
    paths = [line.split("  ", 1)[1] for line in sums.splitlines()]
    assert paths == sorted(paths, key=str.encode)
    everything = sorted(p for p in read_tree(tmp_path / "b") if p != "SHA256SUMS")
    assert sorted(paths) == everything
    assert "manifest.json" in paths and "measurements.tar.gz" in paths
    run = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=tmp_path / "b",
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(": OK\n") == len(paths)


def test_two_exports_are_byte_identical(published: Published, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "one")
    (tmp_path / "two").mkdir()  # an existing empty directory is fine
    export_bundle(published.store, published.target, tmp_path / "two")
    one, two = read_tree(tmp_path / "one"), read_tree(tmp_path / "two")
    assert one.keys() == two.keys() and "measurements.tar.gz" in one
    assert [p for p in one if one[p] != two[p]] == []


def test_tar_is_deterministic_and_holds_no_weights(published: Published, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "b")
    raw = (tmp_path / "b" / "measurements.tar.gz").read_bytes()
    assert raw[:3] == b"\x1f\x8b\x08" and raw[3] & 0x08 == 0  # gzip, no file name
    assert raw[4:8] == b"\0\0\0\0"  # gzip mtime 0
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names, key=str.encode)
        for m in members:
            assert (m.isreg(), m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == \
                (True, 0, 0, 0, "", "", 0o644), m.name
        inner = json.loads(tar.extractfile("manifest.json").read())
        for name in names:
            if name != "manifest.json":
                assert tar.extractfile(name).read() == (tmp_path / "b" / name).read_bytes()
    assert not [n for n in names if n.endswith(".safetensors")]
    full = _manifest(tmp_path / "b")
    # The tar's manifest describes the tar: the bundle without weights.
    assert sorted(inner["objects"]) == sorted(n for n in names if n != "manifest.json")
    assert set(inner["omitted"]) == {str(d) for d in (*published.weight_files, *published.tensors)}
    assert inner["derived"] == {} and inner["target"] == full["target"]
    assert {p: e for p, e in full["objects"].items() if p in inner["objects"]} == inner["objects"]
    assert gzip.decompress(raw)[-1024:] == b"\0" * 1024  # a proper end-of-archive


def test_no_weights_omits_weight_files_and_tensors(published: Published, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "full")
    report = export_bundle(published.store, published.target, tmp_path / "bare", weights=False)
    bare = read_tree(tmp_path / "bare")
    assert not [p for p in bare if p.endswith(".safetensors")]
    m = _manifest(tmp_path / "bare")
    weights = {str(d) for d in (*published.weight_files, *published.tensors)}
    assert set(m["omitted"]) == weights and set(map(str, report.omitted)) == weights
    assert all(e["reason"] == "weights" for e in m["omitted"].values())
    for oid in m["omitted"]:
        info = published.store.info(published.store.resolve(oid))
        assert (m["omitted"][oid]["size"], m["omitted"][oid]["sha256"]) == (info.size, info.sha256)
    assert m["derived"] == {}
    # Records of the checkpoints stay: only the weights are left out.
    assert {"models/seed/config.json", "models/clean-single/config.json"} <= m["objects"].keys()
    full = read_tree(tmp_path / "full")
    assert bare["measurements.tar.gz"] == full["measurements.tar.gz"]
    assert (tmp_path / "bare" / "manifest.json").read_bytes() == _inner_manifest(tmp_path / "full")
    run = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=tmp_path / "bare",
                         capture_output=True, check=False)
    assert run.returncode == 0


def _inner_manifest(bundle: Path) -> bytes:
    with tarfile.open(bundle / "measurements.tar.gz", mode="r:gz") as tar:
        return tar.extractfile("manifest.json").read()


def test_existing_non_empty_destination_is_refused(published: Published, tmp_path: Path) -> None:
    dest = tmp_path / "b"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(DestinationExists, match="not empty"):
        export_bundle(published.store, published.target, dest)
    assert read_tree(dest) == {"keep.txt": b"mine"}
    (tmp_path / "file").write_text("x")
    with pytest.raises(DestinationExists):
        export_bundle(published.store, published.target, tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_failed_export_leaves_nothing(published: Published, tmp_path: Path) -> None:
    store = published.store
    chunk = store.chunks.path(published.weight_files[1])
    parts = store.part_ids(published.weight_files[1])
    assert not chunk.exists() and parts  # stored as tensor parts: corrupt the big tensor's chunk
    big = max(parts, key=lambda p: store.info(p[1]).size)[1]
    path = store.chunks.path(big)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        export_bundle(store, published.target, tmp_path / "b")
    assert not (tmp_path / "b").exists()
    assert [p.name for p in tmp_path.iterdir() if "export" in p.name] == []
