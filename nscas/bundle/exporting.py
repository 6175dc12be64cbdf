"""Exporting publication bundles and SHA256SUMS (docs/format.md §8, docs/bundle.md).

A bundle is a directory in which every object file is exactly an object's bytes, so
``sha256sum -c`` and ``b3sum`` check it with no store. Export is deterministic: where each
object goes is ``nscas.bundle.layout``'s, so one target always gives byte-identical files.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import rfc8785

from nscas.bundle.format import (
    FORMAT,
    FORMAT_V1,
    FORMATS,
    MANIFEST,
    MODEL_SIGNATURES,
    SUMS,
    TARBALL,
    WEIGHTS,
    Range,
    hash_stream,
    model_folders,
    sha256sums,
)
from nscas.bundle.layout import Closure, Plan, RecipeLookup, layout
from nscas.errors import DestinationExists, IntegrityError, InvalidInput
from nscas.objects.digests import Digest
from nscas.objects.durable import sync
from nscas.runs.registry import registered_recipe
from nscas.store.provenance import SIGNATURE

if TYPE_CHECKING:
    from nscas.store.reading import ObjectInfo, StoreReader

ModelSigner = Callable[[Path, Path], None]
"""Signs a model folder (first argument) into a signature file (second): ``--model-signing``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportReport:
    target: Digest
    dest: Path
    files: int
    """Object files written (manifest.json, SHA256SUMS and the tar not counted)."""
    bytes: int
    """Their total size."""
    derived: int
    """Objects written as byte ranges of other files (tensors of weight files)."""
    omitted: tuple[Digest, ...]
    weights: bool
    model_signatures: tuple[str, ...] = ()
    """The model folders signed (``model-signatures/<arm>.sig``)."""
    signatures: int = 0
    """signature/1 records of the closure's receipts that came along."""


def export_bundle(store: StoreReader, target: Digest, dest: Path, *, weights: bool = True,
                  recipes: RecipeLookup = registered_recipe,
                  bundle_format: str = FORMAT,
                  model_signer: ModelSigner | None = None) -> ExportReport:
    """Write the closure of ``target`` as a bundle at ``dest`` (absent or an empty directory).

    Everything is written into a temporary sibling and renamed into place, so a failed
    export leaves nothing behind. Without ``weights``, checkpoint weight files and their
    tensors are listed as omitted. ``recipes`` finds the recipes whose bundle roles lay out
    their runs' outputs. ``bundle_format`` ``FORMAT_V1`` writes the first format (each object
    in one place, so model folders may lack shared files), kept for readers' tests.
    ``model_signer`` signs each model folder ``models/<arm>/`` into
    ``model-signatures/<arm>.sig`` (files outside the manifest, SHA256SUMS and the tar).
    """
    if bundle_format not in FORMATS:
        raise InvalidInput(f"unknown bundle format {bundle_format!r}; expected one of {FORMATS}")
    if model_signer is not None and not weights:
        raise InvalidInput("model signatures sign every file of a model folder: they need the "
                           "weights (drop --no-weights or the model signing key)")
    _check_dest(dest)
    lay = layout(store, target, recipes)
    copies = bundle_format != FORMAT_V1
    plan = lay.plan(weights=weights, copies=copies)
    bare = lay.plan(weights=False, copies=copies)
    infos = lay.closure.infos
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.nscas-export-", dir=dest.parent))
    try:
        derived = (*plan.derived.items(), *bare.derived.items())
        wanted: dict[Digest, set[Range]] = defaultdict(set)
        for _t, r in derived:
            wanted[r.source].add(r)
        hashed: dict[Range, tuple[Digest, str]] = {}
        # SHA-256 values as the copies give them: a tensor's not known yet (docs/format.md
        # §1.2) comes from the bytes written here, the rest from the store (computed there).
        sha: dict[Digest, str] = {}
        for path, oid in sorted(plan.files.items()):  # each copy read and re-hashed anew
            sha[oid], ranges = _copy_out(store, oid, infos[oid], tmp / path,
                                         () if oid in sha else wanted[oid])
            hashed.update(ranges)
        for t, r in derived:  # a range is its tensor before the manifest says so
            if r not in hashed or hashed[r][0] != t or infos[t].sha256 not in (None, hashed[r][1]):
                got = f"{hashed[r][0]} ({hashed[r][1]})" if r in hashed else "a short file"
                raise IntegrityError(f"tensor {t} as bytes {r.offset}..+{r.size} of {r.source}",
                                     f"{t} ({infos[t].sha256})", got)
            sha[t] = hashed[r][1]
        named = {*plan.files.values(), *plan.derived, *plan.omitted, *bare.derived, *bare.omitted}
        known = Closure(target=lay.closure.target, records=lay.closure.records, infos={
            d: i._replace(sha256=sha.get(d) or store.sha256(d))
            if i.sha256 is None and d in named else i for d, i in infos.items()})
        sums = {p: sha[d] for p, d in plan.files.items()}
        manifest = _manifest(known, plan, bundle_format)
        sums[MANIFEST] = _write_new(tmp / MANIFEST, manifest)
        inner = _manifest(known, bare, bundle_format) if weights else manifest
        sums[TARBALL] = _write_tar(tmp / TARBALL, {p: tmp / p for p in bare.files}, inner)
        _write_new(tmp / SUMS, sha256sums(sums))
        signed: tuple[str, ...] = ()
        if model_signer is not None:
            signed = model_folders(plan.files)
            for arm in signed:
                (tmp / MODEL_SIGNATURES).mkdir(exist_ok=True)
                model_signer(tmp / "models" / arm, tmp / MODEL_SIGNATURES / f"{arm}.sig")
        try:
            os.rename(tmp, dest)
        except OSError:  # someone filled ``dest`` meanwhile
            raise DestinationExists(str(dest)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(target=target, dest=dest, files=len(plan.files),
                        bytes=sum(infos[d].size for d in plan.files.values()),
                        derived=len(plan.derived), omitted=tuple(sorted(plan.omitted)),
                        weights=weights, model_signatures=tuple(signed),
                        signatures=sum(1 for i in infos.values() if i.kind == SIGNATURE))


def _check_dest(dest: Path) -> None:
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise DestinationExists(str(dest))
    if dest.is_dir() and any(dest.iterdir()):
        raise DestinationExists(f"{dest} (a directory that is not empty)")
    if not dest.parent.is_dir():
        raise InvalidInput(f"cannot export to {dest}: {dest.parent} is not a directory")


def _copy_out(store: StoreReader, oid: Digest, info: ObjectInfo, path: Path,
              ranges: Iterable[Range]) -> tuple[str, dict[Range, tuple[Digest, str]]]:
    """Write one object to a new file, re-hashing it and the byte ranges asked for: its
    SHA-256 (checked against the recorded one, where there is one) and the ranges'."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.open(oid) as src, path.open("xb") as dst:
        whole, parts = hash_stream(src, ranges, sink=dst.write)
        sync(dst)
    if (whole[0], whole[2]) != (oid, info.size) or info.sha256 not in (None, whole[1]):
        raise IntegrityError(f"object {oid}", f"{oid} ({info.sha256})", f"{whole[0]} ({whole[1]})")
    return whole[1], parts


def _manifest(c: Closure, plan: Plan, bundle_format: str) -> bytes:
    i = c.infos
    return rfc8785.dumps({
        "format": bundle_format,
        "target": str(c.target),
        "objects": {p: {"id": str(d), "size": i[d].size, "sha256": i[d].sha256, "kind": i[d].kind}
                    for p, d in plan.files.items()},
        "derived": {str(t): {"from": str(r.source), "offset": r.offset, "size": r.size,
                             "sha256": i[t].sha256} for t, r in plan.derived.items()},
        "omitted": {str(d): {"size": i[d].size, "sha256": i[d].sha256, "reason": WEIGHTS}
                    for d in plan.omitted},
    })


def _write_new(path: Path, data: bytes) -> str:
    """Write a new file durably; its SHA-256."""
    with path.open("xb") as f:
        f.write(data)
        sync(f)
    return hashlib.sha256(data).hexdigest()


def _write_tar(path: Path, files: Mapping[str, Path], manifest: bytes) -> str:
    """A deterministic tar.gz (sorted regular files, zero times and owners, mode 0644, gzip
    without name or time) of ``files`` and ``manifest``; its SHA-256."""
    members: dict[str, Path | bytes] = {**files, MANIFEST: manifest}
    with path.open("xb") as raw:
        with (gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
              tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar):
            for name in sorted(members, key=str.encode):
                src = members[name]
                info = tarfile.TarInfo(name)
                info.size = len(src) if isinstance(src, bytes) else src.stat().st_size
                info.mtime, info.mode, info.uid, info.gid = 0, 0o644, 0, 0
                info.uname = info.gname = ""
                with io.BytesIO(src) if isinstance(src, bytes) else src.open("rb") as f:
                    tar.addfile(info, f)
        sync(raw)
    with path.open("rb") as f:
        return hash_stream(f, ())[0][1]
