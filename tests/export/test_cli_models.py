"""`nscas export` of an output publishes the receipt that produced it; `nscas get` of a
checkpoint writes a model directory that transformers loads and `nscas import-hf` takes back.
Through typer's runner and as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nscas.cli.root import app
from nscas.store.writer import Store, init_store
from tests.export.conftest import read_tree
from tests.export.hf_models import Models, build_models

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    built = build_models(tmp_path_factory.mktemp("models"))
    yield built
    built.store.close()


def nscas(store: Store, *args: str):
    result = CliRunner().invoke(app, ["--store", str(store.root), *args], prog_name="nscas")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def process(store: Store, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NSCAS_STORE"}
    return subprocess.run([sys.executable, "-m", "nscas.cli.main", "--store", str(store.root),
                           *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_bytes())


# ------------------------------------------------------------------ export of an output

def test_export_of_an_output_ref_exports_its_producing_receipt(models: Models,
                                                              tmp_path: Path) -> None:
    out = nscas(models.store, "export", "experiments/coop/clean-pair", str(tmp_path / "b"))
    assert out.exit_code == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    # Two succeeded receipts produced it (and a failed one started before both): the earliest
    # succeeded by start is the one, as the cache picks.
    assert first == (f"exporting receipt {models.train} which produced experiments/coop/"
                     f"clean-pair ({models.trained}); the earliest by start of the 2 succeeded "
                     "receipts that produced it")
    assert second.startswith(f"exported {models.train} to {tmp_path / 'b'}: ")
    m = _manifest(tmp_path / "b")
    assert m["target"] == str(models.train)
    ids = {e["id"] for e in m["objects"].values()}
    assert {str(models.train), str(models.trained), str(models.base)} <= ids
    assert str(models.again) not in ids and str(models.failed) not in ids
    # The same bytes as exporting the receipt itself.
    direct = nscas(models.store, "export", str(models.train), str(tmp_path / "direct"))
    assert direct.exit_code == 0 and direct.stdout.startswith(f"exported {models.train} ")
    assert read_tree(tmp_path / "b") == read_tree(tmp_path / "direct")


def test_export_of_an_output_by_id_names_one_producer_plainly(tmp_path: Path) -> None:
    built = build_models(tmp_path / "one")
    try:
        # A blob only the later receipt outputs: one producer.
        store = built.store
        blob = store.put_bytes(b'{"loss": 1.0}\n')
        record = store.get_record(built.again)
        receipt = store.put_record({**record, "outputs": {**record["outputs"], "log": str(blob)}})
        out = nscas(store, "export", str(blob), str(tmp_path / "b"), "--no-weights")
        assert out.exit_code == 0, out.stderr
        assert out.stdout.splitlines()[0] == f"exporting receipt {receipt} which produced {blob}"
        assert _manifest(tmp_path / "b")["target"] == str(receipt)
        js = nscas(store, "export", str(blob), str(tmp_path / "j"), "--json", "--no-weights")
        report = json.loads(js.stdout)
        assert (report["target"], report["named"], report["producers"]) == (
            str(receipt), str(blob), [str(receipt)])
    finally:
        built.store.close()


def test_an_object_no_run_produced_is_exported_alone(models: Models, tmp_path: Path) -> None:
    out = nscas(models.store, "export", "experiments/coop/base", str(tmp_path / "b"))
    assert out.exit_code == 0, out.stderr
    assert out.stdout.startswith(f"exported {models.base} to ")
    m = _manifest(tmp_path / "b")
    assert m["target"] == str(models.base)
    assert not [e for e in m["objects"].values() if e["kind"] == "receipt/1"]


def test_export_of_an_output_as_a_process(models: Models, tmp_path: Path) -> None:
    done = process(models.store, "export", "experiments/coop/clean-pair", "b", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"exporting receipt {models.train} which produced ")
    check = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=tmp_path / "b",
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    refused = process(models.store, "export", "experiments/coop/clean-pair", "b", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "nscas: error: destination b (a directory that is not empty) already exists; nscas "
        "never overwrites"]


def test_export_help_says_what_an_output_exports(models: Models) -> None:
    out = nscas(models.store, "export", "--help")
    text = " ".join(out.stdout.split())
    assert out.exit_code == 0 and "the receipt that produced it is exported instead" in text


# ------------------------------------------------------------------ get of a checkpoint

def test_get_of_a_checkpoint_writes_a_loadable_model_directory(models: Models,
                                                               tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = nscas(models.store, "get", "experiments/coop/clean-pair", str(tmp_path / "model"))
    assert out.exit_code == 0, out.stderr
    assert out.stdout.startswith(f"wrote {tmp_path / 'model'} (checkpoint/1 {models.trained}: ")
    assert read_tree(tmp_path / "model") == read_tree(models.sources["clean-pair"])
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    original = AutoModelForCausalLM.from_pretrained(models.sources["clean-pair"])
    a, b = loaded.state_dict(), original.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert AutoTokenizer.from_pretrained(tmp_path / "model")("hello world")["input_ids"] == [3, 4]
    # import-hf takes it back: the same files and params (the trained checkpoint's record also
    # holds its step and parent, which an import does not know).
    fresh = init_store(tmp_path / "fresh")
    fresh.close()
    back = CliRunner().invoke(app, ["--store", str(fresh.root), "import-hf",
                                    str(tmp_path / "model"), "--json"], prog_name="nscas")
    assert back.exit_code == 0, back.stderr
    record = models.store.get_record(models.trained)
    got = json.loads(back.stdout)
    assert (got["files"], got["params"]) == (record["files"], record["params"])


def test_get_then_import_hf_gives_the_same_checkpoint_id(models: Models, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()  # an existing empty directory is fine
    done = process(models.store, "get", str(models.base), "model", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["id"], report["kind"]) == (str(models.base), "checkpoint/1")
    assert report["files"] == models.store.get_record(models.base)["files"]
    fresh = init_store(tmp_path / "fresh")
    fresh.close()
    back = process(fresh, "import-hf", "model", "--json", cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["checkpoint"] == str(models.base)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_get_of_a_checkpoint_refuses_a_non_empty_directory(models: Models,
                                                           tmp_path: Path) -> None:
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    out = nscas(models.store, "get", "experiments/coop/clean-pair", str(dest))
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [f"nscas: error: destination {dest} (a directory that is "
                                       "not empty) already exists; nscas never overwrites"]
    assert read_tree(dest) == {"keep.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    (tmp_path / "file").write_text("x")
    blob = nscas(models.store, "get", "experiments/coop/clean-pair", str(tmp_path / "file"))
    assert blob.exit_code == 2 and len(blob.stderr.splitlines()) == 1
    assert (tmp_path / "file").read_text() == "x"
