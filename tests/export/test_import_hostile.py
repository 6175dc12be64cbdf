"""Hostile bundles that aim at the importer's resources or at its trust in labels (issue 17):
disk bombs, memory bombs, deep nesting, hard links, and records labelled blobs. Each is
refused with one line (exit 2 from the CLI), the store's tables and files are unchanged, and
no temporary file is left behind."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
import rfc8785
from typer.testing import CliRunner

from nscas.bundle.exporting import export_bundle
from nscas.bundle.format import InvalidBundle
from nscas.bundle.importing import import_bundle
from nscas.bundle.unpacking import ImportLimits
from nscas.cli import root as main
from nscas.store.writer import Store
from tests.cli.conftest import snapshot
from tests.export.conftest import Published

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bundle(published: Published, tmp_path: Path) -> Path:
    export_bundle(published.store, published.target, tmp_path / "b")
    return tmp_path / "b"


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temporary directory import unpacks into: it must be empty again afterwards."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    assert not list(path.iterdir()), list(path.iterdir())


def _written() -> int:
    """Bytes this process has handed to write(2) so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _refused(store: Store, source: Path, *needles: str,
             limits: ImportLimits = ImportLimits()) -> str:
    before = snapshot(store.root)
    with pytest.raises(InvalidBundle) as info:
        import_bundle(store, source, limits=limits)
    message = info.value.message
    assert "\n" not in message and message.startswith(str(source)), message
    for needle in needles:
        assert needle in message, (needle, message)
    assert snapshot(store.root) == before
    assert store.counts() == {"objects": 0, "records": 0, "refs": 0}
    return message


def _cli(store: Store, *args: str) -> str:
    """``nscas import ARGS`` through the root app: exit 2, one stderr line; that line."""
    before = snapshot(store.root)
    result = CliRunner().invoke(main.app, ["--store", str(store.root), "import", *args],
                                prog_name="nscas")
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("nscas: error: "), line
    assert snapshot(store.root) == before
    return line


# ---------------------------------------------------------------- crafting tars cheaply

def _members(bundle: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(bundle / "measurements.tar.gz", mode="r:gz") as tar:
        return [(m, tar.extractfile(m).read()) for m in tar.getmembers()]


def _block(info: tarfile.TarInfo, data: bytes = b"") -> bytes:
    pad = -len(data) % tarfile.BLOCKSIZE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(pad)


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    return info


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def _tar(dest: Path, parts: list[bytes | tuple[tarfile.TarInfo, int, bytes]]) -> Path:
    """A tar.gz of concatenated gzip members: each part is plain tar bytes, or (header, MiB,
    one MiB of filler): a member of that many MiB whose data is compressed once and repeated,
    so a claim of a GiB costs a MiB of test disk."""
    out = []
    for part in parts:
        if isinstance(part, bytes):
            out.append(_gz(part))
        else:
            info, mib, filler = part
            out.append(_gz(_block(info)))
            out.extend([_gz(filler)] * mib)
    out.append(_gz(bytes(2 * tarfile.BLOCKSIZE)))
    dest.write_bytes(b"".join(out))
    return dest


def _plain(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    return b"".join(_block(i, d) for i, d in members)


def _split(members: list[tuple[tarfile.TarInfo, bytes]], name: str,
           ) -> tuple[list[tuple[tarfile.TarInfo, bytes]], list[tuple[tarfile.TarInfo, bytes]]]:
    """The members before ``name`` (sorted order) and from it on."""
    at = next((i for i, (m, _) in enumerate(members) if m.name >= name), len(members))
    return members[:at], members[at:]


# ---------------------------------------------------------------------- 1. disk bombs

@pytest.mark.parametrize("name", ["aaa/zeros.bin", "zzz/zeros.bin"])
def test_an_unlisted_gigabyte_member_is_refused_and_nothing_is_unpacked(
        bundle: Path, fresh_store: Store, tmp_path: Path, scratch: Path, name: str) -> None:
    before, after = _split(_members(bundle), name)
    mib = 1024 if name.startswith("aaa") else 64  # before the manifest: the costly case
    tar = _tar(tmp_path / "bomb.tar.gz",
               [_plain(before), (_info(name, mib * MIB), mib, bytes(MIB)), _plain(after)])
    assert tar.stat().st_size < 2 * MIB
    written = _written()
    _refused(fresh_store, tar, name, "not listed in manifest.json")
    assert _written() - written < 4 * MIB  # nothing near the member was written anywhere


def test_a_member_larger_than_the_manifest_says_is_refused_before_unpacking(
        bundle: Path, fresh_store: Store, tmp_path: Path, scratch: Path) -> None:
    members = _members(bundle)
    before, after = _split(members, "tasks/test.jsonl")
    victim, _data = after.pop(0)
    tar = _tar(tmp_path / "big.tar.gz",
               [_plain(before), (_info(victim.name, 256 * MIB), 256, bytes(MIB)), _plain(after)])
    written = _written()
    _refused(fresh_store, tar, "tasks/test.jsonl", f"holds {256 * MIB} bytes; manifest.json says")
    assert _written() - written < 4 * MIB


def test_a_sparse_member_is_refused(bundle: Path, fresh_store: Store, tmp_path: Path,
                                    scratch: Path) -> None:
    info = _info("aaa/sparse.bin", 1)
    info.pax_headers = {"GNU.sparse.map": "0,1", "GNU.sparse.size": str(1 << 40)}
    tar = _tar(tmp_path / "sparse.tar.gz", [_block(info, b"x") + _plain(_members(bundle))])
    _refused(fresh_store, tar, "aaa/sparse.bin", "sparse")


def test_more_than_max_bytes_is_refused_at_the_header(bundle: Path, fresh_store: Store,
                                                      tmp_path: Path, scratch: Path) -> None:
    tar = _tar(tmp_path / "huge.tar.gz",
               [(_info("aaa/zeros.bin", 1 << 50), 1, bytes(MIB))])  # claims a PiB, holds a MiB
    _refused(fresh_store, tar, "aaa/zeros.bin", f"past {16 << 30} unpacked bytes (--max-bytes)")
    honest = bundle / "measurements.tar.gz"
    line = _cli(fresh_store, str(honest), "--max-bytes", "1000")
    assert "past 1000 unpacked bytes (--max-bytes)" in line
    assert import_bundle(fresh_store, honest).imported  # the defaults let it in


def test_no_room_to_unpack_is_refused_before_unpacking(
        bundle: Path, fresh_store: Store, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1000))
    _refused(fresh_store, bundle / "measurements.tar.gz", "bytes, but", "has only 1000 bytes free")


def test_too_many_members(bundle: Path, fresh_store: Store, scratch: Path) -> None:
    few = ImportLimits(members=5)
    _refused(fresh_store, bundle / "measurements.tar.gz", "more than 5 members (--max-members)",
             limits=few)
    _refused(fresh_store, bundle, "more than 5 files and directories", limits=few)
    assert "more than 5 members" in _cli(fresh_store, str(bundle / "measurements.tar.gz"),
                                         "--max-members", "5")


def test_a_huge_pax_header_is_refused_unread(bundle: Path, fresh_store: Store, tmp_path: Path,
                                             scratch: Path) -> None:
    info = _info("aaa/x", 0)
    info.pax_headers = {"comment": " " * (8 * MIB)}
    tar = _tar(tmp_path / "pax.tar.gz", [_block(info) + _plain(_members(bundle))])
    _refused(fresh_store, tar, "a tar header is larger than")


def test_data_after_the_end_of_the_tar_is_refused(bundle: Path, fresh_store: Store,
                                                  tmp_path: Path, scratch: Path) -> None:
    tail = tmp_path / "tail.tar.gz"
    tail.write_bytes((bundle / "measurements.tar.gz").read_bytes() + _gz(bytes(2 * MIB)))
    _refused(fresh_store, tail, "follow the end of the tar")


def test_a_tar_inside_the_tar_is_refused(bundle: Path, fresh_store: Store, tmp_path: Path,
                                         scratch: Path) -> None:
    inner = (bundle / "measurements.tar.gz").read_bytes()
    members = _members(bundle)
    before, after = _split(members, "measurements.tar.gz")
    tar = _tar(tmp_path / "nested.tar.gz",
               [_plain([*before, (_info("measurements.tar.gz", len(inner)), inner), *after])])
    _refused(fresh_store, tar, "measurements.tar.gz", "does not hold another")


# --------------------------------------------------------------------- 2. memory bombs

_PROBE = """
import json, resource, sys
from pathlib import Path
from nscas.bundle.format import InvalidBundle
from nscas.bundle.importing import import_bundle
from nscas.store.writer import Store
store = Store(Path(sys.argv[1]))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    import_bundle(store, Path(sys.argv[2]))
    message = None
except InvalidBundle as exc:
    message = exc.message
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kib": peak - base, "message": message}))
"""


def _probe(store: Store, source: Path) -> tuple[int, str]:
    """Import in a fresh process: (how much its peak memory grew, in MiB; the refusal)."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(store.root), str(source)],
                         capture_output=True, text=True, cwd=REPO, check=True, timeout=300)
    got = json.loads(out.stdout)
    assert got["message"] is not None and "\n" not in got["message"]
    return got["grew_kib"] // 1024, got["message"]


def test_a_200_mb_manifest_in_a_tar_is_refused_before_it_is_read(
        bundle: Path, fresh_store: Store, tmp_path: Path) -> None:
    before, after = _split(_members(bundle), "manifest.json")
    after.pop(0)  # the real manifest
    tar = _tar(tmp_path / "fat.tar.gz",
               [_plain(before), (_info("manifest.json", 200 * MIB), 200, b" " * MIB),
                _plain(after)])
    assert tar.stat().st_size < MIB
    before_state = snapshot(fresh_store.root)
    grew, message = _probe(fresh_store, tar)
    assert f"manifest.json: is {200 * MIB} bytes; at most {16 << 20}" in message
    assert grew < 32, f"peak memory grew {grew} MiB"
    assert snapshot(fresh_store.root) == before_state


def test_a_200_mb_manifest_or_sums_in_a_directory_is_refused_unread(
        bundle: Path, fresh_store: Store) -> None:
    for name in ("manifest.json", "SHA256SUMS"):
        path = bundle / name
        keep = path.read_bytes()
        path.unlink()
        with path.open("wb") as f:  # sparse: a 200 MB file that takes no disk
            f.truncate(200 * MIB)
        grew, message = _probe(fresh_store, bundle)
        assert f"{name}: is {200 * MIB} bytes; at most {16 << 20} (--max-manifest-bytes)" \
            in message, message
        assert grew < 32, f"{name}: peak memory grew {grew} MiB"
        path.write_bytes(keep)


def test_the_manifest_limit_is_a_flag(bundle: Path, fresh_store: Store, scratch: Path) -> None:
    size = (bundle / "manifest.json").stat().st_size
    for source in (bundle, bundle / "measurements.tar.gz"):
        line = _cli(fresh_store, str(source), "--max-manifest-bytes", "1000")
        assert f"manifest.json: is {size if source == bundle else ''}" in line, line
        assert "at most 1000 (--max-manifest-bytes)" in line


# ------------------------------------------------------------------ 3. deep nesting

def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("depth", [9, 900, 100_000])
def test_a_deeply_nested_manifest_is_one_line(bundle: Path, fresh_store: Store, tmp_path: Path,
                                              scratch: Path, depth: int) -> None:
    data = ('{"derived":{},"format":' + _deep(depth) + "}").encode()
    (bundle / "manifest.json").write_bytes(data)
    _refused(fresh_store, bundle, "manifest.json", "nests deeper than 8 levels")
    members = [(i, d) for i, d in _members(bundle) if i.name != "manifest.json"]
    before, after = _split(members, "manifest.json")
    tar = _tar(tmp_path / "deep.tar.gz",
               [_plain([*before, (_info("manifest.json", len(data)), data), *after])])
    _refused(fresh_store, tar, "manifest.json", "nests deeper than 8 levels")
    assert "nests deeper" in _cli(fresh_store, str(bundle))


def _rewrite(bundle: Path, change: Any) -> None:
    m = json.loads((bundle / "manifest.json").read_bytes())
    change(m)
    (bundle / "manifest.json").write_bytes(rfc8785.dumps(m))
    (bundle / "SHA256SUMS").unlink(missing_ok=True)


def _put(bundle: Path, rel: str, data: bytes, *, kind: Any = "keep", target: bool = False) -> str:
    """Make ``data`` the bytes of file ``rel``, with a manifest that agrees about its hashes."""
    (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
    (bundle / rel).write_bytes(data)
    oid = "blake3:" + blake3.blake3(data).hexdigest()

    def point(m: dict[str, Any]) -> None:
        entry = m["objects"].setdefault(rel, {"kind": None})
        entry.update(id=oid, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        if kind != "keep":
            entry["kind"] = kind
        if target:
            m["target"] = oid
    _rewrite(bundle, point)
    return oid


def _target_path(published: Published, bundle: Path) -> str:
    return f"receipts/evaluate-{published.target.short}.json"


@pytest.mark.parametrize("depth", [65, 900, 50_000])
@pytest.mark.parametrize("label", ["receipt/1", None])
def test_a_deeply_nested_record_with_a_correct_hash_is_one_line(
        published: Published, bundle: Path, fresh_store: Store, depth: int, label: str | None,
        ) -> None:
    rel = _target_path(published, bundle)
    value = json.loads((bundle / rel).read_bytes())
    deep = json.dumps({"value": None, "verifier": "tasks"}).replace("null", _deep(depth))
    text = rfc8785.dumps(value).decode().replace('"claims":{', '"claims":{"deep":' + deep + ",")
    _put(bundle, rel, text.encode(), kind=label, target=True)
    _refused(fresh_store, bundle, rel, "nests deeper than 64 levels")
    assert "nests deeper than 64 levels" in _cli(fresh_store, str(bundle))


def test_a_record_at_the_depth_limit_still_imports(published: Published, bundle: Path,
                                                   fresh_store: Store) -> None:
    rel = _target_path(published, bundle)
    value = json.loads((bundle / rel).read_bytes())
    value["claims"]["deep"] = {"value": json.loads(_deep(61)), "verifier": "tasks"}  # 64 in all
    oid = _put(bundle, rel, rfc8785.dumps(value), target=True)
    assert oid in {str(d) for d in import_bundle(fresh_store, bundle).imported}


# ----------------------------------------------------------- 4. hard links and labels

def test_a_hard_link_to_a_file_outside_is_refused(bundle: Path, fresh_store: Store,
                                                  tmp_path: Path) -> None:
    inside = bundle / "tasks/test.jsonl"
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(inside.read_bytes())  # the bytes are right: only the link is wrong
    inside.unlink()
    os.link(outside, inside)
    _refused(fresh_store, bundle, "tasks/test.jsonl", "hard link (2 names)")
    assert "hard link" in _cli(fresh_store, str(bundle))


@pytest.mark.parametrize("which", ["target", "tasks"])
def test_a_record_labelled_a_blob_is_refused(published: Published, bundle: Path,
                                             fresh_store: Store, scratch: Path,
                                             which: str) -> None:
    rel = _target_path(published, bundle) if which == "target" else next(
        p for p, e in json.loads((bundle / "manifest.json").read_bytes())["objects"].items()
        if e["kind"] == "tasks/1")
    kind = json.loads((bundle / rel).read_bytes())["nscas"]
    _rewrite(bundle, lambda m: m["objects"][rel].update(kind=None))
    _refused(fresh_store, bundle, rel, f"bytes are a {kind} record; manifest.json says a blob")


def test_a_record_labelled_a_blob_in_a_tar_is_refused(published: Published, bundle: Path,
                                                      fresh_store: Store, tmp_path: Path,
                                                      scratch: Path) -> None:
    members = []
    for info, data in _members(bundle):
        if info.name == "manifest.json":
            m = json.loads(data)
            rel = next(p for p, e in m["objects"].items() if e["kind"] == "commitment/1")
            m["objects"][rel]["kind"] = None
            data = rfc8785.dumps(m)
            info = _info("manifest.json", len(data))
        members.append((info, data))
    tar = _tar(tmp_path / "relabel.tar.gz", [_plain(members)])
    _refused(fresh_store, tar, rel, "bytes are a commitment/1 record; manifest.json says a blob")


def test_a_blob_labelled_a_record_is_refused(bundle: Path, fresh_store: Store) -> None:
    _rewrite(bundle, lambda m: m["objects"]["tasks/test.jsonl"].update(kind="tasks/1"))
    _refused(fresh_store, bundle, "tasks/test.jsonl")


def test_a_derived_range_whose_bytes_are_a_record_is_refused(
        published: Published, bundle: Path, fresh_store: Store) -> None:
    """A record hidden as a byte range of a blob, linked from the target so the closure holds."""
    record = rfc8785.dumps({"nscas": "commitment/1", "purpose": "hidden", "subjects": {},
                            "previous": None})
    carrier = b"\n" + record
    carrier_id = _put(bundle, "blobs/carrier", carrier)
    hidden = "blake3:" + blake3.blake3(record).hexdigest()
    _rewrite(bundle, lambda m: m["derived"].update({hidden: {
        "from": carrier_id, "offset": 1, "size": len(record),
        "sha256": hashlib.sha256(record).hexdigest()}}))
    rel = _target_path(published, bundle)
    value = json.loads((bundle / rel).read_bytes())
    value["claims"]["hidden"] = {"value": [carrier_id, hidden], "verifier": "tasks"}
    _put(bundle, rel, rfc8785.dumps(value), target=True)
    _refused(fresh_store, bundle, "blobs/carrier", f"(derived {hidden}) are a record")


def test_the_honest_bundle_and_its_tar_still_import(bundle: Path, fresh_store: Store,
                                                    scratch: Path) -> None:
    tar = import_bundle(fresh_store, bundle / "measurements.tar.gz")
    assert tar.imported
    full = import_bundle(fresh_store, bundle)
    assert full.complete and full.present == len(tar.imported)


def test_names_that_are_not_utf8_are_one_line(bundle: Path, fresh_store: Store,
                                              tmp_path: Path, scratch: Path) -> None:
    odd = os.fsencode(bundle / "tasks") + b"/\xff.jsonl"
    with open(odd, "wb") as f:
        f.write(b"x")
    _refused(fresh_store, bundle, "tasks/\\udcff.jsonl", "not listed in manifest.json")
    assert "not listed" in _cli(fresh_store, str(bundle))
    os.unlink(odd)
    members = _members(bundle)
    tar = _tar(tmp_path / "odd.tar.gz",
               [_plain(members) + _block(_info("tasks/\udcff.jsonl", 1), b"x")])
    _refused(fresh_store, tar, "tasks/\\udcff.jsonl", "not UTF-8")
    # A manifest path with a lone surrogate escape cannot be canonical JSON text.
    data = (bundle / "manifest.json").read_bytes().replace(b'"tasks/test.jsonl"',
                                                           b'"tasks/\\udcff.jsonl"')
    (bundle / "manifest.json").write_bytes(data)
    _refused(fresh_store, bundle, "manifest.json", "not a JSON object in RFC 8785 canonical form")


_FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from nscas.errors import InvalidInput
from nscas.bundle.importing import import_bundle
from nscas.store.writer import Store
store = Store(Path(sys.argv[1]))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    import_bundle(store, Path(sys.argv[2]))
except InvalidInput as exc:
    print(exc.message)
"""


def test_a_write_that_fails_while_unpacking_is_one_line(bundle: Path, fresh_store: Store,
                                                        tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = snapshot(fresh_store.root)
    out = subprocess.run([sys.executable, "-c", _FULL_DISK, str(fresh_store.root),
                          str(bundle / "measurements.tar.gz")], capture_output=True, text=True,
                         cwd=REPO, check=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)})
    [line] = out.stdout.splitlines()
    assert "cannot unpack" in line and "File too large" in line, line
    assert snapshot(fresh_store.root) == before
    assert not list(scratch.iterdir())
