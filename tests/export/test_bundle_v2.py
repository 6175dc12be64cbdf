"""Bundle format 2: every model folder holds all files of its checkpoint, so it loads with plain
transformers and `nscas import-hf` takes it; a repeated file must be its object's bytes (import
refuses, verify fails a copy that differs); format 1 bundles still import and verify."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import rfc8785

from nscas.bundle.exporting import _write_tar, export_bundle
from nscas.bundle.format import FORMAT, FORMAT_V1, InvalidBundle, sha256sums
from nscas.bundle.importing import import_bundle
from nscas.cli.import_hf import import_hf
from nscas.objects.digests import Digest
from nscas.store.writer import Store, init_store
from tests.export.conftest import read_tree
from tests.export.hf_models import Models, build_models

pytest.importorskip("transformers")
SHARED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    built = build_models(tmp_path_factory.mktemp("models"))
    yield built
    built.store.close()


@pytest.fixture(scope="module")
def bundles(models: Models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The commitment naming both arms, exported in each format (and format 2 without
    weights)."""
    root = tmp_path_factory.mktemp("bundles")
    target = models.store.ref_get("experiments/coop/commit")
    export_bundle(models.store, target, root / "v2")
    export_bundle(models.store, target, root / "v1", bundle_format=FORMAT_V1)
    export_bundle(models.store, target, root / "bare", weights=False)
    return {"v2": root / "v2", "v1": root / "v1", "bare": root / "bare"}


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_bytes())


def _entries(store: Store, checkpoint: Digest) -> dict[str, str]:
    tree = store.get_record(Digest.parse(store.get_record(checkpoint)["files"]))
    return {name: e["id"] for name, e in tree["entries"].items()}


def test_every_model_folder_holds_its_whole_checkpoint(models: Models,
                                                       bundles: dict[str, Path]) -> None:
    m = _manifest(bundles["v2"])
    assert m["format"] == FORMAT == "nscas-bundle/2"
    for arm, checkpoint in (("seed", models.base), ("clean-pair", models.trained)):
        folder = {p.removeprefix(f"models/{arm}/"): e["id"] for p, e in m["objects"].items()
                  if p.startswith(f"models/{arm}/")}
        assert folder == _entries(models.store, checkpoint)
        assert set(SHARED) | {"model.safetensors"} <= folder.keys()
    # The shared files are one object at two paths, and the bytes of each path are it.
    for name in SHARED:
        a, b = m["objects"][f"models/seed/{name}"], m["objects"][f"models/clean-pair/{name}"]
        assert a == b
        assert (bundles["v2"] / "models/seed" / name).read_bytes() == \
            (bundles["v2"] / "models/clean-pair" / name).read_bytes()
    run = subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "SHA256SUMS"],
                         cwd=bundles["v2"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_model_folders_load_with_transformers_and_import_hf_takes_them(
        models: Models, bundles: dict[str, Path], tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fresh = init_store(tmp_path / "fresh")
    try:
        for arm, checkpoint in (("seed", models.base), ("clean-pair", models.trained)):
            folder = bundles["v2"] / "models" / arm
            loaded = AutoModelForCausalLM.from_pretrained(folder)
            original = AutoModelForCausalLM.from_pretrained(models.sources[arm])
            a, b = loaded.state_dict(), original.state_dict()
            assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
            tokenizer = AutoTokenizer.from_pretrained(folder)
            assert tokenizer("the cat sat")["input_ids"] == [5, 6, 7]
            again = import_hf(fresh, folder)
            record = models.store.get_record(checkpoint)
            assert (str(again.files), str(again.params)) == (record["files"], record["params"])
            if arm == "seed":  # imported as import-hf imports: the very same checkpoint
                assert again.checkpoint == checkpoint
    finally:
        fresh.close()


def test_the_v1_writer_gives_each_object_one_place(bundles: dict[str, Path]) -> None:
    m = _manifest(bundles["v1"])
    assert m["format"] == FORMAT_V1
    ids = [e["id"] for e in m["objects"].values()]
    assert len(ids) == len(set(ids))
    # The v1 flaw that format 2 fixes: one arm's folder lacks the files it shares.
    folders = {arm: {p.rpartition("/")[2] for p in m["objects"] if p.startswith(f"models/{arm}/")}
               for arm in ("seed", "clean-pair")}
    assert folders["clean-pair"] >= set(SHARED) and folders["seed"] == {"model.safetensors"}


@pytest.mark.parametrize("version", ["v1", "v2", "bare"])
def test_both_formats_import_and_verify(models: Models, bundles: dict[str, Path],
                                        tmp_path: Path, version: str) -> None:
    checks = _verifier_checks(bundles[version])
    assert [(c.name, c.message) for c in checks if c.status == "failed"] == []
    skipped = [c.name for c in checks if c.status == "skipped"]
    assert skipped == (["integrity.omitted"] if version == "bare" else [])
    assert {"bundle.copies", "bundle.manifest", "integrity.hashes"} <= {c.name for c in checks}
    fresh = init_store(tmp_path / "fresh")
    try:
        got = import_bundle(fresh, bundles[version])
        closure = models.store.closure([got.target])
        if version == "bare":
            assert not got.complete and models.trained in got.skipped
        else:
            assert got.complete and set(got.imported) == closure
            assert all(fresh.get_bytes(d) == models.store.get_bytes(d) for d in closure)
        tar = import_bundle(init_store(tmp_path / "tar"), bundles[version] / "measurements.tar.gz")
        assert tar.target == got.target
    finally:
        fresh.close()


def test_the_tar_is_the_same_for_every_export_with_copies(bundles: dict[str, Path]) -> None:
    assert (bundles["v2"] / "measurements.tar.gz").read_bytes() == \
        (bundles["bare"] / "measurements.tar.gz").read_bytes()
    assert (bundles["v1"] / "measurements.tar.gz").read_bytes() != \
        (bundles["v2"] / "measurements.tar.gz").read_bytes()


def _verifier_checks(bundle: Path) -> list:
    """What the independent verifiers find of a bundle's files and of its target's closure
    (a commitment: the full ``verify`` of format 1 and 2 receipts is in test_pipeline.py)."""
    from nscas.verifiers.bundle.files import bundle_checks
    from nscas.verifiers.bundle.source import BundleSource
    from nscas.verifiers.records.closure import Objects, walk

    source = BundleSource(bundle)
    return [*bundle_checks(source), *walk(Objects(source), source.target)[1]]


# ------------------------------------------------------------------ a copy that differs

def _reseal(bundle: Path, manifest: dict | None = None) -> None:
    """A tamperer's last steps: manifest.json (if given, and the tarball's likewise), the
    tarball from the files as they are now, and SHA256SUMS."""
    tar = bundle / "measurements.tar.gz"
    with tarfile.open(tar, mode="r:gz") as t:
        inner = json.loads(t.extractfile("manifest.json").read())
    if manifest is not None:
        (bundle / "manifest.json").write_bytes(rfc8785.dumps(manifest))
        inner.update(format=manifest["format"], objects={
            p: manifest["objects"][p] for p in inner["objects"]})
    tar.unlink()
    _write_tar(tar, {p: bundle / p for p in inner["objects"]}, rfc8785.dumps(inner))
    sums = {p.relative_to(bundle).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(bundle.rglob("*")) if p.is_file() and p.name != "SHA256SUMS"}
    (bundle / "SHA256SUMS").write_bytes(sha256sums(sums))
    run = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle,
                         capture_output=True, check=False)
    assert run.returncode == 0


def _copy(bundles: dict[str, Path], tmp_path: Path, version: str = "v2") -> Path:
    dest = tmp_path / "tampered"
    shutil.copytree(bundles[version], dest)
    return dest


def test_a_changed_second_copy_is_refused_on_import_and_fails_verify(
        bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(bundles, tmp_path)
    second = bundle / "models/seed/config.json"  # models/clean-pair/config.json is read first
    second.write_bytes(second.read_bytes().replace(b'"hidden_size": 16', b'"hidden_size": 17'))
    _reseal(bundle)
    fresh = init_store(tmp_path / "fresh")
    try:
        with pytest.raises(InvalidBundle, match=r"models/seed/config\.json: bytes are blake3:"):
            import_bundle(fresh, bundle)
        assert fresh.counts()["objects"] == 0
    finally:
        fresh.close()
    checks = _verifier_checks(bundle)
    failed = {c.name: c.message for c in checks if c.status == "failed"}
    assert list(failed) == ["bundle.copies"] and "models/seed/config.json is blake3:" in \
        failed["bundle.copies"]
    assert {c.name: c.status for c in checks}["integrity.hashes"] == "passed"


def test_a_copy_described_otherwise_is_refused(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(bundles, tmp_path)
    m = _manifest(bundle)
    m["objects"]["models/seed/config.json"]["kind"] = "tree/1"
    _reseal(bundle, m)
    with pytest.raises(InvalidBundle, match=r"objects\['models/seed/config.json'\]: describes"):
        import_bundle(init_store(tmp_path / "fresh"), bundle)
    failed = {c.name: c.message for c in _verifier_checks(bundle) if c.status == "failed"}
    assert "objects[models/seed/config.json] describes" in failed["bundle.manifest"]


def test_a_repeated_object_in_a_v1_bundle_is_refused(bundles: dict[str, Path],
                                                     tmp_path: Path) -> None:
    bundle = _copy(bundles, tmp_path, "v2")
    m = _manifest(bundle)
    m["format"] = FORMAT_V1
    _reseal(bundle, m)
    with pytest.raises(InvalidBundle, match="is in more than one place"):
        import_bundle(init_store(tmp_path / "fresh"), bundle)
    failed = {c.name: c.message for c in _verifier_checks(bundle) if c.status == "failed"}
    assert list(failed) == ["bundle.manifest"]
    assert "objects[models/clean-pair/config.json], objects[models/seed/config.json]" in \
        failed["bundle.manifest"]


def test_an_unknown_format_is_refused(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = _copy(bundles, tmp_path)
    m = _manifest(bundle)
    m["format"] = "nscas-bundle/3"
    (bundle / "manifest.json").write_bytes(rfc8785.dumps(m))
    with pytest.raises(InvalidBundle, match="format: expected one of 'nscas-bundle/1', "
                                            "'nscas-bundle/2'"):
        import_bundle(init_store(tmp_path / "fresh"), bundle)


def test_exporting_twice_is_byte_identical(models: Models, bundles: dict[str, Path],
                                           tmp_path: Path) -> None:
    export_bundle(models.store, models.store.ref_get("experiments/coop/commit"), tmp_path / "b")
    assert read_tree(tmp_path / "b") == read_tree(bundles["v2"])
