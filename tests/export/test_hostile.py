"""Hostile bundles: each is refused with one line naming the file and the problem, and the
store is left exactly as it was (nothing imported)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nscas.bundle.exporting import export_bundle
from nscas.bundle.format import InvalidBundle
from nscas.bundle.importing import import_bundle
from nscas.errors import InvalidInput
from nscas.store.writer import Store
from tests.export.conftest import Published


@pytest.fixture
def bundle(published: Published, tmp_path: Path) -> Path:
    export_bundle(published.store, published.target, tmp_path / "b")
    return tmp_path / "b"


def _refused(store: Store, source: Path, *needles: str) -> str:
    before = store.counts()
    with pytest.raises(InvalidBundle) as info:
        import_bundle(store, source)
    message = info.value.message
    assert "\n" not in message and message.startswith(str(source)), message
    for needle in needles:
        assert needle in message, (needle, message)
    assert store.counts() == before == {"objects": 0, "records": 0, "refs": 0}
    assert not [p for p in (store.root / "data").rglob("*") if p.is_file()]
    return message


def _rewrite(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    m = json.loads((bundle / "manifest.json").read_bytes())
    change(m)
    (bundle / "manifest.json").write_bytes(rfc8785.dumps(m))


def _move(m: dict[str, Any], old: str, new: str) -> None:
    m["objects"][new] = m["objects"].pop(old)


def test_absolute_path_in_manifest(bundle: Path, fresh_store: Store) -> None:
    _rewrite(bundle, lambda m: _move(m, "tasks/test.jsonl", "/tmp/tasks/test.jsonl"))
    _refused(fresh_store, bundle, "/tmp/tasks/test.jsonl", "absolute path")


def test_dotdot_path_in_manifest(bundle: Path, fresh_store: Store) -> None:
    shutil.copy(bundle / "tasks/test.jsonl", bundle.parent / "outside.jsonl")  # the bytes are right
    _rewrite(bundle, lambda m: _move(m, "tasks/test.jsonl", "../outside.jsonl"))
    (bundle / "tasks/test.jsonl").unlink()
    _refused(fresh_store, bundle, "../outside.jsonl", "'..'")


def test_symlink_file(bundle: Path, fresh_store: Store) -> None:
    target = bundle / "tasks/test.jsonl"
    shutil.copy(target, bundle.parent / "copy.jsonl")
    target.unlink()
    target.symlink_to(bundle.parent / "copy.jsonl")
    _refused(fresh_store, bundle, "tasks/test.jsonl", "symbolic link")


def test_symlinked_directory(bundle: Path, fresh_store: Store) -> None:
    shutil.move(bundle / "tasks", bundle.parent / "tasks")
    (bundle / "tasks").symlink_to(bundle.parent / "tasks", target_is_directory=True)
    _refused(fresh_store, bundle, ": tasks:", "symbolic link")


def test_file_whose_bytes_do_not_match_its_id(bundle: Path, fresh_store: Store) -> None:
    path = bundle / "evaluations/seed/checks.jsonl"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x20
    path.write_bytes(bytes(data))
    _refused(fresh_store, bundle, "evaluations/seed/checks.jsonl", "manifest.json says blake3:")


def test_derived_range_that_does_not_hash_to_its_id(bundle: Path, fresh_store: Store) -> None:
    def shift(m: dict[str, Any]) -> None:
        entry = next(e for e in m["derived"].values() if e["size"] > 64)
        entry["offset"] += 4
    _rewrite(bundle, shift)
    (bundle / "SHA256SUMS").unlink()  # the manifest changed; the sums would say so first
    _refused(fresh_store, bundle, "model.safetensors", "do not hash to derived")


def test_manifest_that_is_not_json(bundle: Path, fresh_store: Store) -> None:
    (bundle / "manifest.json").write_bytes(b'{"format": "nscas-bundle/1", "objects": ')
    _refused(fresh_store, bundle, "manifest.json", "not valid JSON")


def _replace_target(bundle: Path, path: Path, data: bytes) -> None:
    """Make ``data`` the target receipt's bytes, with a manifest that agrees about its hashes
    (so the record itself is what import must refuse)."""
    path.write_bytes(data)
    rel = path.relative_to(bundle).as_posix()

    def point(m: dict[str, Any]) -> None:
        m["objects"][rel].update(id="blake3:" + blake3.blake3(data).hexdigest(), size=len(data),
                                 sha256=hashlib.sha256(data).hexdigest())
        m["target"] = m["objects"][rel]["id"]
    _rewrite(bundle, point)
    (bundle / "SHA256SUMS").unlink()


def test_record_that_is_not_canonical(published: Published, bundle: Path,
                                      fresh_store: Store) -> None:
    path = bundle / f"receipts/evaluate-{published.target.short}.json"
    _replace_target(bundle, path, json.dumps(json.loads(path.read_bytes()), indent=1).encode())
    _refused(fresh_store, bundle, path.name, "not the RFC 8785 canonical encoding")


def test_record_that_breaks_its_schema(published: Published, bundle: Path,
                                       fresh_store: Store) -> None:
    path = bundle / f"receipts/evaluate-{published.target.short}.json"
    value = json.loads(path.read_bytes())
    value["status"] = "maybe"
    _replace_target(bundle, path, rfc8785.dumps(value))
    _refused(fresh_store, bundle, path.name, "receipt/1 record at $.status")


def test_incomplete_closure(published: Published, bundle: Path, fresh_store: Store) -> None:
    (bundle / "training/clean-single/rank-0.journal.jsonl").unlink()
    _rewrite(bundle, lambda m: m["objects"].pop("training/clean-single/rank-0.journal.jsonl"))
    (bundle / "SHA256SUMS").unlink()
    _refused(fresh_store, bundle, str(published.journal_entries), "neither holds nor lists")


def test_unlisted_file_and_missing_file(bundle: Path, fresh_store: Store) -> None:
    (bundle / "notes.txt").write_text("hello")
    _refused(fresh_store, bundle, "notes.txt", "not listed in manifest.json")
    (bundle / "notes.txt").unlink()
    (bundle / "tasks/train.jsonl").unlink()
    _refused(fresh_store, bundle, "tasks/train.jsonl", "missing")


def test_sums_that_disagree(bundle: Path, fresh_store: Store) -> None:
    lines = (bundle / "SHA256SUMS").read_text().splitlines()
    lines[0] = "0" * 64 + lines[0][64:]
    (bundle / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    _refused(fresh_store, bundle, lines[0][66:], "SHA256SUMS says")


def test_sums_with_another_line_end(bundle: Path, fresh_store: Store) -> None:
    data = (bundle / "SHA256SUMS").read_bytes()
    (bundle / "SHA256SUMS").write_bytes(data[:-1] + b"\r")  # str.splitlines would not notice
    _refused(fresh_store, bundle, "SHA256SUMS", "is not '<sha256>  <path>'")


# ------------------------------------------------------------------------------------ tars

def _tar_with(bundle: Path, dest: Path, extra: Callable[[tarfile.TarFile], None]) -> Path:
    """The bundle's own measurements.tar.gz plus whatever ``extra`` adds."""
    with tarfile.open(bundle / "measurements.tar.gz", mode="r:gz") as src, \
            tarfile.open(dest, mode="w:gz", format=tarfile.PAX_FORMAT) as out:
        for member in src.getmembers():
            out.addfile(member, src.extractfile(member))
        extra(out)
    return dest


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def _link(name: str, kind: bytes, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_the_untouched_tar_imports(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    copy = _tar_with(bundle, tmp_path / "copy.tar.gz", lambda tar: None)
    assert import_bundle(fresh_store, copy).imported


def test_tar_with_dotdot_member(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    tar = _tar_with(bundle, tmp_path / "t.tar.gz", lambda t: t.addfile(*_file("../evil.txt")))
    _refused(fresh_store, tar, "../evil.txt", "'..'")
    assert not (tmp_path / "evil.txt").exists()


def test_tar_with_absolute_member(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    member = _file(f"{tmp_path}/abs.txt")
    tar = _tar_with(bundle, tmp_path / "t.tar.gz", lambda t: t.addfile(*member))
    _refused(fresh_store, tar, "abs.txt", "absolute path")
    assert not (tmp_path / "abs.txt").exists()


def test_tar_with_symlink_member(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    tar = _tar_with(bundle, tmp_path / "t.tar.gz",
                    lambda t: t.addfile(_link("tasks/link.jsonl", tarfile.SYMTYPE, "/etc/passwd")))
    _refused(fresh_store, tar, "tasks/link.jsonl", "symbolic link")


def test_tar_with_hardlink_member(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    member = _link("tasks/hard.jsonl", tarfile.LNKTYPE, "tasks/test.jsonl")
    tar = _tar_with(bundle, tmp_path / "t.tar.gz", lambda t: t.addfile(member))
    _refused(fresh_store, tar, "tasks/hard.jsonl", "hard link")


def test_tar_with_device_member(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    tar = _tar_with(bundle, tmp_path / "t.tar.gz",
                    lambda t: t.addfile(_link("tasks/null", tarfile.CHRTYPE, "")))
    _refused(fresh_store, tar, "tasks/null", "device")


def test_tar_with_a_member_twice(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    tar = _tar_with(bundle, tmp_path / "t.tar.gz", lambda t: t.addfile(*_file("tasks/test.jsonl")))
    _refused(fresh_store, tar, "tasks/test.jsonl", "twice")


def test_truncated_tar(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    data = (bundle / "measurements.tar.gz").read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[:len(data) // 2])
    _refused(fresh_store, cut, "not a complete tar.gz")


def test_corrupt_tar(bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    data = bytearray((bundle / "measurements.tar.gz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(data))
    _refused(fresh_store, bad, "not a complete tar.gz")


def test_fifo_in_the_bundle(bundle: Path, fresh_store: Store) -> None:
    os.mkfifo(bundle / "tasks" / "pipe")
    _refused(fresh_store, bundle, "tasks/pipe", "FIFO")


def test_not_a_bundle_at_all(fresh_store: Store, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _refused(fresh_store, tmp_path / "empty", "manifest.json", "missing")
    (tmp_path / "empty" / "manifest.json").write_bytes(b"{}")
    _refused(fresh_store, tmp_path / "empty", "manifest.json", "exactly the members")
    with pytest.raises(InvalidInput, match="no such bundle"):
        import_bundle(fresh_store, tmp_path / "nowhere")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_flipped_byte_is_refused(bundle: Path, fresh_store: Store, tmp_path_factory,
                                     data: st.DataObject) -> None:
    files = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())
    rel = data.draw(st.sampled_from(files), label="file")
    copy = tmp_path_factory.mktemp("flip") / "b"
    shutil.copytree(bundle, copy)
    raw = bytearray((copy / rel).read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1), label="offset")
    raw[at] ^= data.draw(st.integers(1, 255), label="mask")
    (copy / rel).write_bytes(bytes(raw))
    _refused(fresh_store, copy)
