"""Tamperers who rewrite everything they can: shifted request timings re-put through the store
API, and edited answers, claims and timings in export bundles whose every link, manifest
entry, tarball and SHA256SUMS line was rewritten to match. Integrity then holds; only the
recomputation of the edited answer, claim or throughput can catch them, and it must.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import pytest
import rfc8785

from nscas.bundle.exporting import _write_tar, export_bundle
from nscas.bundle.format import sha256sums
from nscas.objects.digests import Digest
from nscas.runs.runner import StepResult, run_file
from nscas.store.writer import Store
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import exit_code, verify
from tests.pipelines import evaluate_step, run_pipeline, serve_step, tiny_pipeline
from tests.verifiers.rewrite import relayout

PIPELINE = (tiny_pipeline(train=16, retention=2)
            + evaluate_step("evaluate", retention=False, max_new_tokens=8, threads=1)
            + serve_step(replicas=2, requests=4, concurrency=2, warmup=1, max_new_tokens=8))
SUMS, MANIFEST, TARBALL = "SHA256SUMS", "manifest.json", "measurements.tar.gz"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    root: Path
    store: Store
    steps: dict[str, StepResult]
    bundles: dict[str, Path]
    """Untouched full bundles of the ``evaluate`` and ``serve`` receipts."""
    other: str
    """A checkpoint of the same architecture with another seed."""

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def receipt(self, step: str) -> str:
        return str(self.steps[step].receipt)

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tamper-bundles")
    store, steps = run_pipeline(root, PIPELINE, name="run.toml")
    (root / "other.toml").write_text(
        f'recipe = "init"\n[inputs]\ntokenizer = "{steps["tokenizer"].outputs["tokenizer"]}"\n'
        "[params]\nseed = 1\n")
    (other,) = run_file(store, root / "other.toml")
    bundles = {}
    for step in ("evaluate", "serve"):
        bundles[step] = root / f"bundle-{step}"
        export_bundle(store, Digest.parse(str(steps[step].receipt)), bundles[step])
    yield Run(root=root, store=store, steps=steps, bundles=bundles,
              other=str(other.outputs["checkpoint"]))
    store.close()


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def label(recipe: str, oid: str) -> str:
    return f"{recipe}.{oid[7:15]}"


def read_jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


def write_jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()


def shift_pair_ends(log: bytes, seconds: float = 0.5) -> bytes:
    lines = read_jsonl(log)
    assert sum(x["phase"] == "pair" for x in lines) >= 4
    for line in lines:
        if line["phase"] == "pair":
            line["end"] += seconds
    return write_jsonl(lines)


def pair_findings(name: str) -> set[str]:
    """What shifted pair timings change (the phase order may break too, if the failure phase
    began within the shift)."""
    return {f"{name}.claims.throughput_ratio", *(f"{name}.claims.pair.{x}" for x in (
        "wall_seconds", "requests_per_second", "median_latency_seconds", "p95_latency_seconds"))}


# ------------------------------------------------------------------ the bundle tamperer

def object_id(data: bytes) -> str:
    return f"blake3:{blake3.blake3(data).hexdigest()}"


def relink(value: Any, old: str, new: dict[str, Any]) -> Any:
    """``value`` with every link to ``old`` pointing at ``new["id"]``; a tree entry of it also
    gets the new size and SHA-256."""
    if value == old:
        return new["id"]
    if isinstance(value, dict):
        if value.get("id") == old and {"size", "sha256"} <= value.keys():
            return {**value, **{k: new[k] for k in ("id", "size", "sha256")}}
        return {k: relink(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [relink(v, old, new) for v in value]
    return value


class Tamperer:
    """A copy of a bundle, edited file by file; every record that links an edited object is
    re-serialised (RFC 8785) with the new link, up to the target, and ``seal`` rewrites the
    manifest, the tarball and SHA256SUMS to match."""

    def __init__(self, bundle: Path, dest: Path) -> None:
        self.root = dest
        shutil.copytree(bundle, dest)
        self.manifest = json.loads((dest / MANIFEST).read_bytes())
        self.moved: dict[str, str] = {}
        """Old path -> new path, for record files named by their ID."""
        self.replaced: dict[str, str] = {}
        """Old ID -> new ID of every object edited."""

    def path_of(self, suffix: str) -> str:
        (path,) = [p for p in self.manifest["objects"] if p.endswith(suffix)]
        return path

    def edit(self, path: str, change: Callable[[bytes], bytes]) -> str:
        """Replace the file at ``path`` by ``change(its bytes)``; the new target ID."""
        replaced: dict[str, dict[str, Any]] = {}
        self._write(path, change((self.root / path).read_bytes()), replaced)
        # Relink to a fixed point: a record linking two edited objects is rewritten once per
        # edit, and each rewrite is itself an edit. One pass in manifest order (IDs, so the
        # order differs from run to run) could leave a rewritten record linking a stale ID.
        changed = True
        while changed:
            changed = False
            objects = self.manifest["objects"]
            for other in list(objects):
                if other not in objects or objects[other]["kind"] is None:
                    continue
                record = json.loads((self.root / other).read_bytes())
                edited = record
                for old, new in replaced.items():
                    edited = relink(edited, old, new)
                if edited != record:
                    self._write(other, rfc8785.dumps(edited), replaced)
                    changed = True
        return self.manifest["target"]

    def _write(self, path: str, data: bytes, replaced: dict[str, dict[str, Any]]) -> None:
        objects = self.manifest["objects"]
        entry = objects.pop(path)
        old, new = entry["id"], object_id(data)
        assert old != new
        (self.root / path).unlink()
        if path == f"records/{old[7:]}.json":
            self.moved[path] = path = f"records/{new[7:]}.json"
        (self.root / path).write_bytes(data)
        objects[path] = {**entry, "id": new, "size": len(data),
                         "sha256": hashlib.sha256(data).hexdigest()}
        replaced[old] = objects[path]
        self.replaced[old] = new
        if self.manifest["target"] == old:
            self.manifest["target"] = new

    def seal(self) -> Path:
        """Rewrite manifest.json, the tarball (with its own manifest) and SHA256SUMS."""
        (self.root / MANIFEST).write_bytes(rfc8785.dumps(self.manifest))
        self.moved.update(relayout(self.root, self.manifest["objects"]))
        canonical = rfc8785.dumps(self.manifest)
        (self.root / MANIFEST).write_bytes(canonical)
        tar = self.root / TARBALL
        inner = self._inner_manifest(tar)
        tar.unlink()
        _write_tar(tar, {p: self.root / p for p in inner["objects"]}, rfc8785.dumps(inner))
        files = [p for p in self.root.rglob("*") if p.is_file() and p.name != SUMS]
        sums = {p.relative_to(self.root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in files}
        (self.root / SUMS).write_bytes(sha256sums(sums))
        if shutil.which("sha256sum"):
            done = subprocess.run(["sha256sum", "--quiet", "-c", SUMS], cwd=self.root,
                                  capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
        return self.root

    def _inner_manifest(self, tar: Path) -> dict[str, Any]:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(tar.read_bytes()))) as t:
            stream = t.extractfile(MANIFEST)
            assert stream is not None
            inner = json.loads(stream.read())
        paths = []
        for path in inner["objects"]:
            while path in self.moved:  # a record relinked twice moved twice
                path = self.moved[path]
            paths.append(path)
        inner["objects"] = {p: self.manifest["objects"][p] for p in paths}
        inner["target"] = self.manifest["target"]
        left_out = {**inner["omitted"], **inner["derived"]}
        for path, entry in self.manifest["objects"].items():  # weights stay out of the tar
            if path.endswith(".safetensors") and entry["id"] not in left_out:
                inner["omitted"][entry["id"]] = {"size": entry["size"], "sha256": entry["sha256"],
                                                 "reason": "weights"}
        return inner


def tamper(bundle: Path, tmp_path: Path, suffix: str,
           change: Callable[[bytes], bytes]) -> tuple[Path, str]:
    t = Tamperer(bundle, tmp_path / "bundle")
    target = t.edit(t.path_of(suffix), change)
    return t.seal(), target


def assert_integrity_holds(report: Report) -> None:
    statuses = {c.name: c.status for c in report.checks}
    for name in ("integrity.hashes", "integrity.records", "bundle.manifest", "bundle.files",
                 "bundle.sha256sums", "bundle.measurements"):
        assert statuses[name] == "passed", (name, [c for c in report.failures])


# ------------------------------------------------------------------ tests

def test_the_untampered_store_and_bundles_pass(run: Run, tmp_path: Path) -> None:
    for step in ("evaluate", "serve"):
        assert verify(run.receipt(step), store=run.store_dir).ok, step
        report = verify(str(run.bundles[step]), store=None)
        assert report.ok and exit_code(report) == 0, report.failures
        assert_integrity_holds(report)
    # The tamperer's tools, applied with no change, leave a bundle that still passes.
    t = Tamperer(run.bundles["serve"], tmp_path / "same")
    assert verify(str(t.seal()), store=None).ok


def test_shifted_request_timings_in_the_store_fail_throughput(run: Run) -> None:
    original = run.receipt("serve")
    receipt = run.record(original)
    log = run.store.get_bytes(Digest.parse(receipt["outputs"]["requests"]))
    requests = str(run.store.put_bytes(shift_pair_ends(log)))
    receipt["outputs"] = {**receipt["outputs"], "requests": requests}
    tampered = str(run.store.put_record(receipt))
    report = verify(tampered, store=run.store_dir)
    name = label("serve", tampered)
    assert pair_findings(name) == failed(report) - {f"{name}.rule.phase_order"}
    assert exit_code(report) == 1
    check = next(c for c in report.checks if c.name == f"{name}.claims.pair.wall_seconds")
    assert check.recomputed == pytest.approx(check.claimed + 0.5, abs=1e-9)


def test_shifted_request_timings_in_a_resealed_bundle_fail_throughput(
        run: Run, tmp_path: Path) -> None:
    bundle, target = tamper(run.bundles["serve"], tmp_path, "requests.jsonl", shift_pair_ends)
    assert target != run.receipt("serve")
    report = verify(str(bundle), store=None)
    assert_integrity_holds(report)
    name = label("serve", target)
    assert pair_findings(name) == failed(report) - {f"{name}.rule.phase_order"}
    assert exit_code(report) == 1


def test_an_edited_answer_in_a_resealed_bundle_fails_the_recomputed_claims(
        run: Run, tmp_path: Path) -> None:
    tasks = read_jsonl(run.store.get_bytes(Digest.parse(
        run.record(str(run.steps["prepare"].outputs["test"]))["records"])))

    def right_answer(data: bytes) -> bytes:
        lines = read_jsonl(data)
        assert lines[0]["text"] != tasks[0]["target"]
        lines[0]["text"] = tasks[0]["target"]
        return write_jsonl(lines)

    bundle, target = tamper(run.bundles["evaluate"], tmp_path, "generations.jsonl", right_answer)
    report = verify(str(bundle), store=None)
    assert_integrity_holds(report)
    name = label("evaluate", target)
    bad = failed(report)
    assert {f"{name}.claims.correct", f"{name}.answers.decoded"} <= bad, bad
    assert all(n.startswith(f"{name}.") for n in bad), bad
    check = next(c for c in report.checks if c.name == f"{name}.claims.correct")
    assert check.recomputed == check.claimed + 1
    assert exit_code(report) == 1


def test_an_edited_claim_in_a_resealed_bundle_fails(run: Run, tmp_path: Path) -> None:
    def more_correct(data: bytes) -> bytes:
        record = json.loads(data)
        record["claims"]["correct"]["value"] += 1
        return rfc8785.dumps(record)

    t = Tamperer(run.bundles["evaluate"], tmp_path / "bundle")
    path = next(p for p, e in t.manifest["objects"].items() if e["id"] == run.receipt("evaluate"))
    target = t.edit(path, more_correct)
    report = verify(str(t.seal()), store=None)
    assert_integrity_holds(report)
    name = label("evaluate", target)
    assert failed(report) == {f"{name}.claims.correct"}
    check = next(c for c in report.checks if c.name == f"{name}.claims.correct")
    assert check.claimed == check.recomputed + 1
    assert exit_code(report) == 1


def test_a_swapped_checkpoint_in_a_resealed_bundle_fails_the_weight_check(
        run: Run, tmp_path: Path) -> None:
    other = run.record(run.record(run.other)["files"])["entries"]["model.safetensors"]["id"]
    t = Tamperer(run.bundles["evaluate"], tmp_path / "bundle")
    weights = t.path_of("/model.safetensors")
    # The seed's weight file stays in the bundle under another name, so the params/1 tensors
    # (byte ranges of it) still hash right; the checkpoint's tree now names another model's.
    entry = t.manifest["objects"][weights]
    kept = f"blobs/{entry['id'][7:]}.safetensors"
    (t.root / "blobs").mkdir(exist_ok=True)
    shutil.copyfile(t.root / weights, t.root / kept)
    t.manifest["objects"][kept] = entry
    target = t.edit(weights, lambda _: run.store.get_bytes(Digest.parse(other)))
    report = verify(str(t.seal()), store=None)
    assert_integrity_holds(report)
    (checkpoint,) = [e["id"] for e in t.manifest["objects"].values()
                     if e["kind"] == "checkpoint/1"]
    assert checkpoint != str(run.steps["init"].outputs["checkpoint"])
    # The weights no longer hash to the params; and the original weight file the tamperer kept
    # for the tensor ranges is an object the target no longer reaches, at a path the layout
    # of the closure does not have.
    assert failed(report) == {f"checkpoint.{checkpoint[7:15]}.params", "bundle.closure",
                              "bundle.layout"}, failed(report)
    assert kept in next(c for c in report.checks if c.name == "bundle.layout").message
    (stray,) = [c for c in report.checks if c.name == "bundle.closure"]
    assert kept.removeprefix("blobs/").split(".")[0] in stray.message
    assert target != run.receipt("evaluate") and exit_code(report) == 1
