"""Variants (docs/format.md §6.10): a run with ``--set`` (or ``--name``) writes refs of its own,
never those of the run without it, and ``--only``/``--from`` read inside the same variant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.errors import ConfigError, RecordError
from nscas.runs.recipe import Recipe
from nscas.runs.runner import run_file
from nscas.runs.variants import check_name, variant_name, variant_prefix
from nscas.store.writer import Store, check_ref_name
from nscas.verifiers.records.schemas import schema_problems
from tests.runner.helpers import RECEIPT, opened, snapshot, write

Nscas = Callable[..., Result]

CHAIN = """
[[step]]
name = "a"
recipe = "probe"
params = { label = "a" }
outputs = { seen = "keep/a" }
[[step]]
name = "b"
recipe = "probe"
inputs = { source = "step.a.seen" }
outputs = { seen = "keep/b" }
[[step]]
name = "c"
recipe = "probe"
inputs = { source = "step.b.seen" }
"""
PREFIXED = 'refs = "exp/chain"\n' + CHAIN
NAMED = 'name = "chain"\n' + CHAIN


@pytest.mark.parametrize(("settings", "name"), [
    ({("train", "lr"): 3e-4}, "train.lr-3e-4"),
    ({("train", "lr"): 1e-5, ("train", "max_steps"): 100}, "train.lr-1e-5_train.max_steps-100"),
    ({("train", "max_steps"): 100, ("train", "lr"): 1e-5}, "train.lr-1e-5_train.max_steps-100"),
    ({("lowercase",): False}, "lowercase-false"),
    ({("a", "x"): 0.5}, "a.x-0.5"),
    ({("a", "x"): 1.0}, "a.x-1.0"),
    ({("a", "x"): 1}, "a.x-1"),
    ({("a", "x"): -2}, "a.x--2"),
    ({("train-single", "device"): "cuda"}, "train-single.device-cuda"),
    ({("a", "counts", "test"): 8}, "a.counts.test-8"),
])
def test_a_variant_name_is_readable_and_a_ref_part(settings: dict[tuple[str, ...], object],
                                                   name: str) -> None:
    assert variant_name(settings) == name
    check_ref_name(f"exp/variants/{name}")


@pytest.mark.parametrize(("one", "other"), [
    ({("a", "x"): "1"}, {("a", "x"): 1}),                  # a string that reads as a number
    ({("a", "x"): "a b"}, {("a", "x"): "a-b"}),            # characters no ref part holds
    ({("a", "x"): [1, 2]}, {("a", "x"): "1-2"}),
    ({("a", "x"): "true"}, {("a", "x"): True}),
    ({("a", "x"): "x_y"}, {("a", "x"): "x", ("y",): 1}),   # the separator inside a value
    ({("a", "x"): "a" * 200}, {("a", "x"): "a" * 201}),    # cut to the longest name
    ({("a", "x"): "p..q"}, {("a", "x"): "p.q"}),
])
def test_different_settings_never_share_a_name(one: dict[tuple[str, ...], object],
                                               other: dict[tuple[str, ...], object]) -> None:
    names = variant_name(one), variant_name(other)
    assert names[0] != names[1]
    for name in names:
        assert check_name(name) == name
        check_ref_name(f"exp/variants/{name}")


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "a..b", "-x", "x y", "a" * 101])
def test_a_bad_variant_name_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a variant"):
        check_name(bad)


def test_a_variant_never_moves_the_original_refs(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        path = write(home, "p.toml", PREFIXED)
        first = {r.step: r for r in run_file(store, path)}
        refs_before = dict(store.ref_list())
        lr = {r.step: r for r in run_file(store, path, sets=("b.label=x",))}
        assert {name: store.ref_get(name) for name in refs_before} == refs_before
        v = "b.label-x"
        assert store.ref_get(f"exp/chain/variants/{v}/b/receipt") == lr["b"].receipt
        assert store.ref_get(f"exp/chain/variants/{v}/c/seen") == lr["c"].outputs["seen"]
        assert store.ref_get(f"keep/b/variants/{v}") == lr["b"].outputs["seen"]
        assert lr["a"].cached and lr["a"].receipt == first["a"].receipt  # a is unchanged
        assert store.ref_get(f"exp/chain/variants/{v}/a/receipt") == first["a"].receipt
        assert store.get_record(lr["b"].receipt)["variant"] == v
        assert "variant" not in store.get_record(first["b"].receipt)


@pytest.mark.parametrize("text", [PREFIXED, NAMED], ids=["refs-prefix", "receipt-names"])
def test_only_reads_earlier_runs_inside_the_same_variant(probe: Recipe, home: Path,
                                                         text: str) -> None:
    with opened(home) as store:
        path = write(home, "p.toml", text)
        first = {r.step: r for r in run_file(store, path)}
        lr = {r.step: r for r in run_file(store, path, sets=("b.label=x",))}
        (inside,) = run_file(store, path, sets=("b.label=x",), only=("c",))
        assert inside.cached and inside.receipt == lr["c"].receipt
        (again,) = run_file(store, path, only=("c",))  # the original's b, not the variant's
        assert again.cached and again.receipt == first["c"].receipt
        with pytest.raises(ConfigError, match=r"variant 'b\.label-x_c\.label-new'"):
            run_file(store, path, sets=("b.label=x", "c.label=new"), only=("c",))  # another
        (later,) = run_file(store, path, sets=("b.label=x", "c.label=new"), only=("c",),
                            name="b.label-x")  # the same variant, named
        assert store.get_record(later.action)["inputs"]["source"] == str(lr["b"].outputs["seen"])


def test_an_unchanged_step_of_a_variant_comes_from_the_original(probe: Recipe,
                                                                home: Path) -> None:
    with opened(home) as store:
        path = write(home, "p.toml", NAMED)
        first = {r.step: r for r in run_file(store, path)}
        (c,) = run_file(store, path, sets=("c.label=z",), only=("c",))
        assert store.get_record(c.action)["inputs"]["source"] == str(first["b"].outputs["seen"])


def test_only_in_a_variant_that_never_ran_the_step_is_refused(probe: Recipe, home: Path,
                                                               nscas: Nscas) -> None:
    path = write(home, "p.toml", NAMED)
    with opened(home) as store:
        run_file(store, path)
        before = snapshot(store)
    result = nscas("--store", home, "run", "--jobs", "1", path, "--set", "b.label=y", "--only", "c")
    assert result.exit_code == 2, result.output
    assert "step 'b' is not run here" in result.stderr and "variant 'b.label-y'" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    with opened(home) as store:
        assert snapshot(store) == before


def test_a_named_variant(probe: Recipe, home: Path, nscas: Nscas) -> None:
    path = write(home, "p.toml", PREFIXED)
    result = nscas("--store", home, "run", "--jobs", "1", path, "--set", "b.label=x", "--name", "try-1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("variant try-1")
    with opened(home) as store:
        assert store.ref_get("exp/chain/variants/try-1/b/receipt") is not None
        assert store.ref_get("exp/chain/b/receipt") is None
        assert not any("b.label" in name for name, _ in store.ref_list())
    bad = nscas("--store", home, "run", "--jobs", "1", path, "--name", "no/slash")
    assert bad.exit_code == 2 and "cannot name a variant" in bad.stderr
    assert len(bad.stderr.splitlines()) == 1


def test_a_recipe_file_variant(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        path = write(home, "r.toml", 'recipe = "probe"\nname = "solo"\n'
                                     'outputs = { seen = "solo/seen" }\n')
        (plain,) = run_file(store, path)
        (lr,) = run_file(store, path, sets=("label=q",))
        assert store.ref_get("solo/seen") == plain.outputs["seen"]
        assert store.ref_get("solo/seen/variants/label-q") == lr.outputs["seen"]
        assert store.get_record(lr.receipt)["variant"] == "label-q"


def test_a_variant_of_a_tag_is_a_tag(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        path = write(home, "r.toml", 'recipe = "probe"\noutputs = { seen = "tags/v1" }\n')
        run_file(store, path, sets=("label=q",))
        with pytest.raises(ConfigError, match="tags never move"):
            run_file(store, path, sets=("label=q", "count=2"), name="label-q")


def test_variant_refs_too_long_are_one_line(probe: Recipe, home: Path, nscas: Nscas) -> None:
    path = write(home, "r.toml", 'recipe = "probe"\noutputs = { seen = "' + "x" * 240 + '" }\n')
    result = nscas("--store", home, "run", "--jobs", "1", path, "--set", "label=q")
    assert result.exit_code == 2 and "invalid ref name" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_variant_prefix() -> None:
    assert variant_prefix("exp/chain", None) == "exp/chain"
    assert variant_prefix("exp/chain", "v") == "exp/chain/variants/v"


@pytest.mark.parametrize("bad", ["", 3, None, "a/b", "../x", "a..b", "x" * 101])
def test_a_receipt_variant_must_be_a_variant_name(store: Store, bad: object) -> None:
    assert schema_problems({**RECEIPT, "variant": "train.lr-3e-4"}) == []
    assert any(p.startswith("/variant:") for p in schema_problems({**RECEIPT, "variant": bad}))
    with pytest.raises(RecordError):
        store.put_record({**RECEIPT, "variant": bad})
