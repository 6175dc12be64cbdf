"""``nscas import BUNDLE --ref PREFIX``: the bundle's runs named under PREFIX by their step names
(and variants), as a pipeline's refs prefix names them (docs/bundle.md, "Refs")."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.bundle.exporting import export_bundle
from nscas.objects.digests import Digest
from nscas.runs.recipe import Recipe
from nscas.runs.runner import run_file
from nscas.store.writer import Store, init_store
from tests.runner.helpers import CHAIN, snapshot, write

Nscas = Callable[..., Result]

NAMED = 'name = "chain"\n' + CHAIN


@pytest.fixture
def bundle(probe: Recipe, tmp_path: Path) -> tuple[Path, dict[str, Digest]]:
    """A bundle of the variant ``a.label-x``'s step c, and the receipts of that run by step."""
    with init_store(tmp_path / "source") as store:
        path = write(tmp_path, "p.toml", NAMED)
        run_file(store, path)
        ran = {r.step: r.receipt for r in run_file(store, path, sets=("a.label=x",))}
        export_bundle(store, ran["c"], tmp_path / "bundle")
    init_store(tmp_path / "dest").close()
    return tmp_path / "bundle", ran


def test_import_ref_names_each_run_by_step_and_variant(bundle: tuple[Path, dict[str, Digest]],
                                                        tmp_path: Path, nscas: Nscas) -> None:
    path, ran = bundle
    dest = tmp_path / "dest"
    result = nscas("--store", dest, "import", path, "--ref", "imported/chain", "--json")
    assert result.exit_code == 0, result.output
    refs = json.loads(result.stdout)["refs"]
    v = "imported/chain/variants/a.label-x"
    with Store(dest / ".nscas") as store:
        seen_a = store.get_record(ran["a"])["outputs"]["seen"]
        seen_c = store.get_record(ran["c"])["outputs"]["seen"]
        assert dict(store.ref_list("imported/")) == {
            name: Digest.parse(oid) for name, oid in refs.items()}
    assert refs == {"imported/chain/target": str(ran["c"]),
                    f"{v}/a/receipt": str(ran["a"]), f"{v}/a/seen": seen_a,
                    f"{v}/c/receipt": str(ran["c"]), f"{v}/c/seen": seen_c}  # b: not in it
    again = nscas("--store", dest, "import", path, "--ref", "imported/chain")  # the same refs
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines()[-1] == "set 5 ref(s) under imported/chain/"


def test_a_receipt_without_a_step_name_is_named_as_its_bundle_file(
        probe: Recipe, tmp_path: Path, nscas: Nscas) -> None:
    with init_store(tmp_path / "source") as store:
        (solo,) = run_file(store, write(tmp_path, "r.toml", 'recipe = "probe"\n'))
        export_bundle(store, solo.receipt, tmp_path / "bundle")
    name = next((tmp_path / "bundle" / "receipts").iterdir()).stem
    init_store(tmp_path / "dest").close()
    result = nscas("--store", tmp_path / "dest", "import", tmp_path / "bundle", "--ref", "x")
    assert result.exit_code == 0, result.output
    with Store(tmp_path / "dest" / ".nscas") as store:
        assert store.ref_get(f"x/{name}/receipt") == solo.receipt
        assert store.ref_get("x/target") == solo.receipt


@pytest.mark.parametrize(("prefix", "said"), [("bad name!", "invalid ref name"),
                                              ("taken", "already names")])
def test_a_bad_or_taken_prefix_writes_nothing(bundle: tuple[Path, dict[str, Digest]],
                                              tmp_path: Path, nscas: Nscas, prefix: str,
                                              said: str) -> None:
    path, _ = bundle
    dest = tmp_path / "dest"
    with Store(dest / ".nscas") as store:
        store.ref_set("taken/target", store.put_bytes(b"something else"))
        before = snapshot(store)
    result = nscas("--store", dest, "import", path, "--ref", prefix)
    assert result.exit_code == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1
    with Store(dest / ".nscas") as store:
        assert snapshot(store) == before
