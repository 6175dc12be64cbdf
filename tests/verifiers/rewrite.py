"""A consistent bundle rewriter: the tamperer who rewrites everything a hash can pin.

``Rewrite(bundle, dest)`` copies an export bundle (docs/bundle.md) and edits the copy. Every
change of an object's bytes is re-hashed, and every record that links the old ID anywhere is
re-serialised (RFC 8785) with the new link, up to a new target: a ``tree/1`` entry gets the new
size and SHA-256 too, a ``journal/1`` whose entries were rewritten gets the chain's new head.
``seal()`` then regenerates manifest.json (canonical, ``records/<hex>.json`` and
``blobs/<hex>`` files renamed for their new IDs), measurements.tar.gz (deterministic, as
docs/bundle.md specifies) and SHA256SUMS. So ``sha256sum -c`` passes and every integrity and
bundle check holds: only recomputation can catch what was changed.

It is built from the stdlib, ``blake3`` and ``rfc8785`` only, and reads the bundle format from
docs/bundle.md, never from ``nscas.verifiers`` (or from the exporter), so it cannot share a
mistake with the code it tests. ``null_kind_in_store`` edits a store's database the same way
(a NULL kind in the ``objects`` table), for the labels-versus-bytes tests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import sqlite3
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import rfc8785

SUMS, MANIFEST, TARBALL = "SHA256SUMS", "manifest.json", "measurements.tar.gz"
RESERVED = (SUMS, MANIFEST, TARBALL)
_BINARY = (".safetensors", ".png", ".pdf")
"""Files never searched for IDs to relink (binary: a same-length edit would break them)."""

JsonEdit = Callable[[Any], Any]
"""Edits a parsed JSON value in place (and returns None) or returns its replacement."""


def object_id(data: bytes) -> str:
    return f"blake3:{blake3.blake3(data).hexdigest()}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_hash(entry: dict[str, Any]) -> str:
    """A journal entry's chain hash: SHA-256 of its canonical form without ``hash``."""
    return sha256(rfc8785.dumps({k: v for k, v in entry.items() if k != "hash"}))


def _apply(edit: JsonEdit, value: Any) -> Any:
    result = edit(value)
    return value if result is None else result


# ------------------------------------------------------------------ JSONL in its own style

def _serialisers() -> list[Callable[[Any], bytes]]:
    return [
        rfc8785.dumps,
        lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode(),
        lambda v: json.dumps(v, separators=(",", ":")).encode(),
        lambda v: json.dumps(v, ensure_ascii=False).encode(),
        lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True).encode(),
        lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False,
                             sort_keys=True).encode(),
    ]


def jsonl_style(data: bytes) -> Callable[[Any], bytes]:
    """The serialiser that reproduces the first line of ``data`` byte for byte (the producer's
    style), so an edit changes only what it means to change."""
    first = data.split(b"\n", 1)[0]
    try:
        value = json.loads(first)
    except ValueError:
        return _serialisers()[1]
    for dump in _serialisers():
        try:
            if dump(value) == first:
                return dump
        except Exception:  # rfc8785 refuses some values
            continue
    return _serialisers()[1]


def json_style(raw: bytes, value: Any) -> Callable[[Any], bytes]:
    """The serialiser of a whole JSON file that reproduces ``raw`` from ``value``."""
    for indent in (2, 1, 4, None):
        for sort_keys in (False, True):
            for ascii_ in (False, True):
                for end in ("\n", ""):
                    def dump(v: Any, indent: int | None = indent, sort_keys: bool = sort_keys,
                             ascii_: bool = ascii_, end: str = end) -> bytes:
                        return (json.dumps(v, indent=indent, sort_keys=sort_keys,
                                           ensure_ascii=ascii_) + end).encode()
                    if dump(value) == raw:
                        return dump
    if rfc8785.dumps(value) == raw:
        return rfc8785.dumps
    raise AssertionError("no serialiser reproduces this JSON file byte for byte")


def read_jsonl(data: bytes) -> list[Any]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def write_jsonl(lines: list[Any], dump: Callable[[Any], bytes]) -> bytes:
    return b"".join(dump(line) + b"\n" for line in lines)


def is_journal(lines: list[Any]) -> bool:
    return bool(lines) and all(isinstance(x, dict) and "hash" in x and "prev" in x
                               for x in lines)


def rechain(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries with ``prev`` and ``hash`` recomputed, in order (the journal chain)."""
    prev = None
    out = []
    for line in lines:
        body = {k: v for k, v in line.items() if k != "hash"}
        body["prev"] = prev
        body["hash"] = entry_hash(body)
        prev = body["hash"]
        out.append(body)
    return out


# ------------------------------------------------------------------ relinking

def relink(value: Any, old: str, new: dict[str, Any]) -> Any:
    """``value`` with every link to ``old`` pointing at ``new["id"]``; a tree entry (an object
    with ``id``, ``size`` and ``sha256``) of it also gets the new size and SHA-256."""
    if value == old:
        return new["id"]
    if isinstance(value, dict):
        if value.get("id") == old and {"size", "sha256"} <= value.keys():
            return {**{k: relink(v, old, new) for k, v in value.items()},
                    "id": new["id"], "size": new["size"], "sha256": new["sha256"]}
        return {k: relink(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [relink(v, old, new) for v in value]
    return value


class Rewrite:
    """A copy of a bundle at ``dest``, edited object by object and sealed consistently."""

    def __init__(self, bundle: Path, dest: Path) -> None:
        self.root = dest
        shutil.copytree(bundle, dest)
        self.manifest: dict[str, Any] = json.loads((dest / MANIFEST).read_bytes())
        self.original_target: str = self.manifest["target"]
        inner = self._read_inner()
        # What the tar leaves out as weights (docs/bundle.md): never edited here, so fixed.
        self.weights: dict[str, dict[str, Any]] = {
            oid: entry for oid, entry in inner["omitted"].items()
            if entry.get("reason") == "weights"}
        self.opaque: set[str] = set()
        """Paths written raw (hostile bytes): never parsed again to relink."""
        self.replaced: dict[str, str] = {}
        """Every old ID -> the ID that replaced it (chains followed by ``current``)."""
        self.heads: dict[str, str | None] = {}
        """New journal blob ID -> the head of its chain, for the journal/1 above it."""
        self.inner_edit: Callable[[dict[str, Any]], None] | None = None
        self.outer_edit: Callable[[dict[str, Any]], None] | None = None

    # -------------------------------------------------------------- looking things up

    @property
    def target(self) -> str:
        return self.manifest["target"]

    @property
    def objects(self) -> dict[str, dict[str, Any]]:
        return self.manifest["objects"]

    def current(self, oid: str) -> str:
        """What ``oid`` is called now, after every edit."""
        while oid in self.replaced:
            oid = self.replaced[oid]
        return oid

    def path_of(self, oid: str) -> str:
        """The first path of ``oid`` (bytewise): a version 2 bundle repeats shared model files."""
        oid = self.current(oid)
        return min((p for p, e in self.objects.items() if e["id"] == oid), key=str.encode)

    def find(self, suffix: str) -> str:
        """The one object path ending with ``suffix``."""
        found = sorted((p for p in self.objects if p.endswith(suffix)), key=str.encode)
        assert len({self.objects[p]["id"] for p in found}) == 1, (suffix, found)  # copies: one
        return found[0]

    def paths(self, pattern: str) -> list[str]:
        """Object paths matching a regular expression (search), sorted."""
        return sorted(p for p in self.objects if re.search(pattern, p))

    def bytes(self, path: str) -> bytes:
        return (self.root / path).read_bytes()

    def json(self, path: str) -> Any:
        return json.loads(self.bytes(path))

    def lines(self, path: str) -> list[Any]:
        return read_jsonl(self.bytes(path))

    def records(self, kind: str) -> list[str]:
        """Paths of the objects whose bytes are records of ``kind`` (by bytes, not label)."""
        found = []
        for path in sorted(self.objects):
            data = self.bytes(path) if not path.endswith(".safetensors") else b""
            if data.startswith(b"{") and f'"nscas":"{kind}"'.encode() in data:
                found.append(path)
        return found

    def receipt_path(self, recipe: str, *, nth: int = 0) -> str:
        """The ``nth`` receipt (by path) of ``recipe``."""
        found = []
        for path in self.records("receipt/1"):
            action = self.json(self.path_of(self.json(path)["action"]))
            if action["recipe"].partition("@")[0] == recipe:
                found.append(path)
        return found[nth]

    # -------------------------------------------------------------- edits

    def replace(self, path: str, data: bytes, *, opaque: bool = False) -> str:
        """Replace the object file ``path`` by ``data`` and relink everything above it; the
        new target. ``opaque``: the bytes are hostile, never parse them to relink."""
        pending = [self._write(path, data, opaque=opaque)]
        while pending:
            old, new = pending.pop()
            for other in sorted(self.objects):
                if other in self.opaque or other.endswith(_BINARY):
                    continue
                raw = self.bytes(other)
                if old[7:19].encode() not in raw:
                    continue
                edited = self._relinked(raw, old, new)
                if edited is not None and edited != raw:
                    pending.append(self._write(other, edited))
        return self.target

    def _relinked(self, raw: bytes, old: str, new: str) -> bytes | None:
        """``raw`` with every mention of ``old`` made one of ``new``: a record's links (tree
        entries with the new size and SHA-256), re-serialised canonically; in any text, the
        full ID, its bare hex and its 12-digit short form (request ids, file names, pages)."""
        record = None
        if raw.startswith(b"{"):
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
        if isinstance(record, dict) and isinstance(record.get("nscas"), str):
            edited = relink(record, old, self.objects[self.path_of(new)])
            if (record.get("nscas") == "journal/1" and record.get("entries") == old
                    and new in self.heads):
                edited["head"] = self.heads[new]
            data = rfc8785.dumps(edited)
        else:
            data = raw
        data = data.replace(old[7:].encode(), new[7:].encode())
        data = data.replace(old[7:19].encode(), new[7:19].encode())
        if record is None or not isinstance(record, dict) or "nscas" not in record:
            try:
                lines = read_jsonl(data)
            except ValueError:
                return data
            if is_journal(lines) and data != raw:  # the chain covers every byte
                lines = rechain(lines)
                data = write_jsonl(lines, jsonl_style(raw))
                self.heads[object_id(data)] = lines[-1]["hash"]
        return data

    def edit_record(self, path: str, edit: JsonEdit) -> str:
        """Parse the record at ``path``, apply ``edit``, store it canonically; the new target."""
        return self.replace(path, rfc8785.dumps(_apply(edit, self.json(path))))

    def edit_json(self, path: str, edit: JsonEdit, *,
                  dump: Callable[[Any], bytes] | None = None) -> str:
        """A JSON blob (report.json, resources.json) edited; written in the style its producer
        used (found by reproducing the original bytes) unless ``dump`` is given."""
        raw = self.bytes(path)
        original = json.loads(raw)
        dump = dump or json_style(raw, original)
        return self.replace(path, dump(_apply(edit, json.loads(raw))))

    def edit_lines(self, path: str, edit: Callable[[list[Any]], Any]) -> str:
        """A JSONL blob edited as a list of values, each line re-serialised in the file's own
        style; a hash-chained journal is re-chained (and its journal/1 gets the new head)."""
        raw = self.bytes(path)
        lines = _apply(edit, read_jsonl(raw))
        dump = jsonl_style(raw)
        journal = is_journal(read_jsonl(raw))
        if journal:
            lines = rechain(lines)
        data = write_jsonl(lines, dump)
        new = object_id(data)
        if journal:
            self.heads[new] = lines[-1]["hash"] if lines else None
        return self.replace(path, data)

    def edit_text(self, path: str, edit: Callable[[str], str]) -> str:
        return self.replace(path, edit(self.bytes(path).decode("utf-8")).encode("utf-8"))

    def add(self, path: str, data: bytes, *, kind: str | None) -> str:
        """A new object file (nothing links it yet); its ID."""
        assert path not in self.objects and not (self.root / path).exists(), path
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_bytes(data)
        oid = object_id(data)
        self.objects[path] = {"id": oid, "size": len(data), "sha256": sha256(data),
                              "kind": kind}
        return oid

    def add_record(self, record: dict[str, Any]) -> str:
        """A new record at ``records/<hex>.json``; its ID."""
        data = rfc8785.dumps(record)
        return self.add(f"records/{object_id(data)[7:]}.json", data, kind=record["nscas"])

    def omit(self, path: str, reason: str = "weights") -> str:
        """Take the object file out of the bundle and list it as ``omitted`` (in both
        manifests), as a ``--no-weights`` export does for weights; its ID."""
        entry = self.objects.pop(path)
        (self.root / path).unlink()
        self.manifest["omitted"][entry["id"]] = {"size": entry["size"],
                                                 "sha256": entry["sha256"], "reason": reason}
        return entry["id"]

    def relabel(self, path: str, kind: str | None) -> None:
        """Set the manifest's ``kind`` label of ``path`` (in manifest.json and the tar's)."""
        self.objects[path] = {**self.objects[path], "kind": kind}

    def _write(self, path: str, data: bytes, *, opaque: bool = False) -> tuple[str, str]:
        entry = self.objects[path]
        for copy in sorted(p for p, e in self.objects.items() if e["id"] == entry["id"]
                           and p != path):  # every copy of a repeated file changes with it
            self._write_one(copy, data, opaque=opaque)
        return self._write_one(path, data, opaque=opaque)

    def _write_one(self, path: str, data: bytes, *, opaque: bool = False) -> tuple[str, str]:
        entry = self.objects.pop(path)
        old, new = entry["id"], object_id(data)
        assert old != new, f"{path}: the edit changed nothing"
        (self.root / path).unlink()
        self.opaque.discard(path)
        path = self._new_path(path, old, new)
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_bytes(data)
        self.objects[path] = {**entry, "id": new, "size": len(data), "sha256": sha256(data)}
        if opaque:
            self.opaque.add(path)
        self.replaced[old] = new
        if self.manifest["target"] == old:
            self.manifest["target"] = new
        return old, new

    @staticmethod
    def _new_path(path: str, old: str, new: str) -> str:
        """Paths named after an object's ID follow the new ID (records/<hex>.json,
        blobs/<hex>, receipts/<recipe>-<short ID>.json)."""
        for full in (old[7:], old[7:19]):
            replacement = new[7:] if len(full) == 64 else new[7:19]
            head, sep, tail = path.rpartition("/")
            if full in tail:
                return f"{head}{sep}{tail.replace(full, replacement)}"
        return path

    # -------------------------------------------------------------- sealing

    def _read_inner(self) -> dict[str, Any]:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(self.bytes(TARBALL)))) as tar:
            stream = tar.extractfile(MANIFEST)
            assert stream is not None
            return json.loads(stream.read())

    def inner_manifest(self) -> dict[str, Any]:
        """The manifest a ``--no-weights`` export would have: the weights omitted, no ranges
        of them derived, everything else as in manifest.json."""
        m = self.manifest
        derived = {oid: d for oid, d in m["derived"].items()
                   if oid not in self.weights and d["from"] not in self.weights}
        return {"format": m["format"], "target": m["target"],
                "objects": {p: e for p, e in m["objects"].items() if e["id"] not in self.weights},
                "derived": derived,
                "omitted": {**{k: v for k, v in m["omitted"].items()}, **self.weights}}

    def seal(self, *, check: bool = True) -> Path:
        """Write manifest.json, measurements.tar.gz and SHA256SUMS for the edited files; with
        ``check``, assert that ``sha256sum -c`` accepts the result."""
        (self.root / MANIFEST).write_bytes(_dumps(self.manifest))
        relayout(self.root, self.objects)
        inner = self.inner_manifest()
        outer = json.loads(json.dumps(self.manifest))
        if self.inner_edit is not None:
            self.inner_edit(inner)
        if self.outer_edit is not None:
            self.outer_edit(outer)
        (self.root / MANIFEST).write_bytes(_dumps(outer))
        members = {p: self.root / p for p in inner["objects"]} if isinstance(
            inner.get("objects"), dict) else {}
        # Level 1: the exporter's level 9 (docs/bundle.md) makes its output deterministic, and
        # no check reads the level (bundle.measurements checks the header's mtime and name and
        # every entry), so a forgery is as consistent at a fraction of the compression time.
        write_tar(self.root / TARBALL, members, _dumps(inner), level=1)
        write_sums(self.root)
        if check and shutil.which("sha256sum"):
            done = subprocess.run(["sha256sum", "--quiet", "--strict", "-c", SUMS],
                                  cwd=self.root, capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
        return self.root


def relayout(root: Path, objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Move the closure's object files to the paths the exporter gives them (docs/bundle.md
    "Paths", as ``nscas.verifiers.bundle.layout`` derives them from the records now in the bundle),
    as a careful forger would: an edited receipt's ``<recipe>-<short ID>`` folder, a task set
    relabelled to another role, an output whose bytes now sniff as another file type; objects
    the target does not reach stay where they are. ``manifest.json`` must describe the files
    already; old path -> new path."""
    from nscas.verifiers.bundle.layout import derive, role_choices
    from nscas.verifiers.bundle.layoutcheck import closure_view
    from nscas.verifiers.bundle.source import BUNDLE_FORMAT_V1, BundleSource
    from nscas.verifiers.records.closure import Objects, walk

    (root / MANIFEST).write_bytes(_dumps_manifest(root, objects))
    bundle = BundleSource(root)
    found = Objects(bundle)
    closure, _ = walk(found, bundle.target)
    signatures = frozenset(e["id"] for e in objects.values() if e.get("kind") == "signature/1")
    view = closure_view(found, closure, signatures)
    layout = derive(view, next(role_choices(view)))
    left_out = {*bundle.manifest["derived"], *bundle.manifest["omitted"]}
    want = layout.files(exported=set(view.kinds) - left_out,
                        copies=bundle.format != BUNDLE_FORMAT_V1)
    wanted: dict[str, set[str]] = {}
    for path, oid in want.items():
        wanted.setdefault(oid, set()).add(path)
    have: dict[str, set[str]] = {}
    for path, entry in objects.items():
        have.setdefault(entry["id"], set()).add(path)
    moved: dict[str, str] = {}
    # Read everything that moves first: two objects may trade places (swapped weights).
    moving = {oid: (sorted(paths)[0], (root / sorted(paths)[0]).read_bytes(),
                    objects[sorted(paths)[0]])
              for oid, paths in sorted(have.items()) if oid in wanted and wanted[oid] != paths}
    for oid in moving:
        for old in sorted(have[oid] - wanted[oid]):
            (root / old).unlink()
            del objects[old]
    for oid, (source, data, entry) in moving.items():
        for new in sorted(wanted[oid] - have[oid]):
            (root / new).parent.mkdir(parents=True, exist_ok=True)
            (root / new).write_bytes(data)
            objects[new] = entry
            moved[source] = new
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()),
                            key=lambda p: -len(p.parts)):
        if not any(directory.iterdir()):
            directory.rmdir()
    return moved


def _dumps_manifest(root: Path, objects: dict[str, dict[str, Any]]) -> bytes:
    manifest = json.loads((root / MANIFEST).read_bytes())
    manifest["objects"] = objects
    return _dumps(manifest)


def _dumps(value: Any) -> bytes:
    try:
        return rfc8785.dumps(value)
    except Exception:  # a hostile manifest rfc8785 cannot write (a huge integer)
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def write_tar(path: Path, files: dict[str, Path], manifest: bytes, *, level: int = 9) -> None:
    """measurements.tar.gz as docs/bundle.md specifies: entries sorted by path (bytewise,
    UTF-8), regular files only, PAX, mtime 0, uid/gid 0, empty owner names, mode 0644; gzip
    level 9, header mtime 0, no file name."""
    members: dict[str, bytes] = {p: f.read_bytes() for p, f in files.items()}
    members[MANIFEST] = manifest
    raw = io.BytesIO()
    with (gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                        compresslevel=level) as gz,
          tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar):
        for name in sorted(members, key=str.encode):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            info.mtime, info.mode, info.uid, info.gid = 0, 0o644, 0, 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(members[name]))
    path.unlink(missing_ok=True)
    path.write_bytes(raw.getvalue())


def write_sums(root: Path) -> None:
    """SHA256SUMS: coreutils lines ``<sha256>  <path>``, sorted bytewise by path, every regular
    file of the bundle but SHA256SUMS itself."""
    files = sorted((p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()),
                   key=str.encode)
    files.remove(SUMS) if SUMS in files else None
    (root / SUMS).write_bytes("".join(
        f"{sha256((root / p).read_bytes())}  {p}\n" for p in files).encode())


def sums_digest(bundle: Path) -> str:
    """The SHA-256 of a bundle's SHA256SUMS file (what a publisher would print beside it)."""
    return sha256((bundle / SUMS).read_bytes())


# ------------------------------------------------------------------ the store's labels

def null_kind_in_store(store_dir: Path, oid: str) -> None:
    """Set the ``kind`` of ``oid`` to NULL in a store's ``objects`` table (the insert-only
    triggers allow it while a ``gc_session`` row exists, as during ``nscas gc``)."""
    db = sqlite3.connect(store_dir / "nscas.db")
    try:
        with db:
            db.execute("INSERT INTO gc_session (token) VALUES (1)")
            changed = db.execute("UPDATE objects SET kind = NULL WHERE id = ?",
                                 (oid.removeprefix("blake3:"),)).rowcount
            db.execute("DELETE FROM gc_session")
        assert changed == 1, oid
    finally:
        db.close()
