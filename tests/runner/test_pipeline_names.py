"""Pipeline and step names in receipts, the ``refs`` prefix, ``--set``, ``--only``/``--from``
and the one-line cached steps of ``nscas run`` (docs/format.md §3.9, §6.2, §6.3)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import Result

from nscas.errors import ConfigError, RecordError
from nscas.objects.digests import Digest
from nscas.runs.recipe import Recipe, blob_part
from nscas.runs.runner import run_file
from nscas.runs.verdicts import compare_outputs
from nscas.store.writer import Store
from nscas.verifiers.records.schemas import schema_problems
from tests.runner.helpers import CHAIN, RECEIPT, opened, snapshot, write

Nscas = Callable[..., Result]

def names(store: Store, receipt: Digest) -> tuple[object, object]:
    rec = store.get_record(receipt)
    return rec.get("pipeline"), rec.get("step")


def test_receipts_record_pipeline_and_step_names(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        named = run_file(store, write(home, "p.toml", 'name = "coop"\n' + CHAIN))
        assert [names(store, r.receipt) for r in named] == [("coop", s) for s in "abc"]
        by_refs = run_file(store, write(home, "q.toml", 'refs = "x/q"\n' + CHAIN.replace(
            'label = "a"', 'label = "q"')))
        assert names(store, by_refs[0].receipt) == ("x/q", "a")
        stem = run_file(store, write(home, "stem.toml", CHAIN.replace('label = "a"',
                                                                      'label = "s"')))
        assert names(store, stem[0].receipt) == ("stem", "a")
        recipe = run_file(store, write(home, "r.toml", 'recipe = "probe"\nname = "solo"\n'
                                                      'params = { label = "r" }\n'))
        assert names(store, recipe[0].receipt) == (None, "solo")
        plain = run_file(store, write(home, "plain.toml", 'recipe = "probe"\n'))
        assert names(store, plain[0].receipt) == (None, None)


def test_names_are_not_part_of_the_action(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        (alone,) = run_file(store, write(home, "r.toml", 'recipe = "probe"\nname = "x"\n'
                                                         'params = { label = "a" }\n'))
        first = run_file(store, write(home, "p.toml", 'name = "other"\n' + CHAIN))
        assert first[0].cached and first[0].receipt == alone.receipt
        assert names(store, first[0].receipt) == (None, "x")  # the run that made it


def test_refs_prefix_moves_a_ref_per_output_and_receipt(probe: Recipe, home: Path) -> None:
    text = 'refs = "experiments/chain"\n' + CHAIN.replace(
        'params = { label = "a" }', 'params = { label = "a" }\noutputs = { seen = "keep/a" }')
    with opened(home) as store:
        results = {r.step: r for r in run_file(store, write(home, "p.toml", text))}
        for step, result in results.items():
            assert store.ref_get(f"experiments/chain/{step}/seen") == result.outputs["seen"]
            assert store.ref_get(f"experiments/chain/{step}/receipt") == result.receipt
        assert store.ref_get("keep/a") == results["a"].outputs["seen"]
        again = run_file(store, write(home, "p.toml", text))  # cached: refs stay, no conflict
        assert all(r.cached for r in again)
        assert store.ref_get("experiments/chain/c/receipt") == results["c"].receipt


@pytest.mark.parametrize(("prefix", "extra", "said"), [
    ("bad name!", "", "invalid ref name"),
    ("tags/v1", "", "tags never move"),
    ("e", 'outputs = { seen = "e/b/seen" }', "one ref, one output"),
])
def test_bad_refs_prefix_is_one_line_and_writes_nothing(probe: Recipe, home: Path, nscas: Nscas,
                                                         prefix: str, extra: str,
                                                         said: str) -> None:
    text = f'refs = "{prefix}"\n' + CHAIN.replace('params = { label = "a" }',
                                                  'params = { label = "a" }\n' + extra)
    path = write(home, "p.toml", text)
    with opened(home) as store:
        before = snapshot(store)
    result = nscas("--store", home, "run", "--jobs", "1", path)
    assert result.exit_code == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1
    with opened(home) as store:
        assert snapshot(store) == before


def test_set_is_part_of_the_action_as_if_written(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        path = write(home, "p.toml", CHAIN)
        (a,) = [r for r in run_file(store, path, sets=("a.label=z", "b.count=3", "b.scale=2"))
                if r.step == "a"]
        action = store.get_record(a.action)
        assert action["params"]["label"] == "z"
        written = write(home, "w.toml", CHAIN.replace('label = "a"', 'label = "z"').replace(
            'inputs = { source = "step.a.seen" }',
            'inputs = { source = "step.a.seen" }\nparams = { count = 3, scale = 2.0 }'))
        assert all(r.cached for r in run_file(store, written))
        (solo,) = run_file(store, write(home, "r.toml", 'recipe = "probe"\n'),
                           sets=("label=bare words", "probe.count=4"))
        assert store.get_record(solo.action)["params"] | {} == {
            "fail": "", "label": "bare words", "count": 4, "scale": 1.0, "hold": "", "cores": 1,
            "gpus": 0, "gpu_memory_gb": 0.0, "disk_gb": 0.0}


@pytest.mark.parametrize(("args", "said"), [
    (("--set", "nope.label=1"), "step 'nope'"),
    (("--set", "a.colour=1"), "colour"),
    (("--set", "a.count=many"), "params.count must be an integer"),
    (("--set", "a.count"), "STEP.PARAM=VALUE"),
    (("--set", "a=1"), "names no param"),
    (("--only", "zzz"), "no step 'zzz'"),
    (("--from", "zzz"), "no step 'zzz'"),
    (("--only", "c"), "step 'a' is not run here"),  # nothing ran before it
])
def test_bad_set_only_from_is_one_line_and_writes_nothing(probe: Recipe, home: Path,
                                                           nscas: Nscas, args: tuple[str, ...],
                                                           said: str) -> None:
    path = write(home, "p.toml", CHAIN)
    with opened(home) as store:
        before = snapshot(store)
    result = nscas("--store", home, "run", "--jobs", "1", path, *args)
    assert result.exit_code == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1
    with opened(home) as store:
        assert snapshot(store) == before


def test_only_and_from_read_earlier_runs(probe: Recipe, home: Path) -> None:
    with opened(home) as store:
        path = write(home, "p.toml", CHAIN)
        full = {r.step: r for r in run_file(store, path)}
        only = run_file(store, path, only=("c",), sets=("c.label=again",))
        assert [r.step for r in only] == ["c"] and not only[0].cached
        assert store.get_record(only[0].action)["inputs"] == {
            "first": str(full["a"].receipt), "source": str(full["b"].outputs["seen"])}
        start = run_file(store, path, start="b", sets=("b.label=new",))
        assert [r.step for r in start] == ["b", "c"]
        assert store.get_record(start[0].action)["inputs"]["source"] == str(
            full["a"].outputs["seen"])
        assert not start[0].cached  # b's new params: a new action
        assert store.get_record(start[1].action)["inputs"]["source"] == str(
            start[0].outputs["seen"])


def test_a_fully_cached_pipeline_prints_one_line_per_step(probe: Recipe, home: Path,
                                                          nscas: Nscas) -> None:
    path = write(home, "p.toml", CHAIN)
    assert nscas("--store", home, "run", "--jobs", "1", path).exit_code == 0
    again = nscas("--store", home, "run", "--jobs", "1", path)
    assert again.exit_code == 0
    *lines, summary = again.stdout.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"step {s}: cached" for s in "abc"]
    assert summary == "3 steps: 3 cached, 0 ran, 0 failed"
    with opened(home) as store:
        for line in lines:
            short = line.rsplit(" ", 1)[1]
            assert len(short) == 12 and store.resolve(short).hex.startswith(short)


def test_a_measurement_with_the_same_reproducible_part_is_reproduced(store: Store) -> None:
    a, b, c = (store.put_bytes(x) for x in (b'1 0.5', b'1 0.7', b'2 0.5'))
    first_word = {"log": blob_part(lambda d: d.split()[0])}
    same = compare_outputs(store, {"log": a}, {"log": b}, measurements=first_word)["log"]
    assert (same.status, same.note) == ("reproduced", "timings differ")
    other = compare_outputs(store, {"log": a}, {"log": c}, measurements=first_word)["log"]
    assert other.status == "different"
    assert compare_outputs(store, {"log": a}, {"log": b})["log"].status == "different"


@pytest.mark.parametrize("member", ["pipeline", "step"])
@pytest.mark.parametrize("bad", ["", 3, None, ["a"]])
def test_receipt_names_must_be_non_empty_strings(store: Store, member: str, bad: object) -> None:
    assert schema_problems({**RECEIPT, member: "fine"}) == []
    assert any(p.startswith(f"/{member}:") for p in schema_problems({**RECEIPT, member: bad}))
    with pytest.raises(RecordError):
        store.put_record({**RECEIPT, member: bad})


def test_pipeline_top_level_keys_are_checked(home: Path) -> None:
    from nscas.runs.config import load_run_file

    for text, said in (('name = ""\n' + CHAIN, "'name'"), ("refs = 3\n" + CHAIN, "'refs'"),
                       ('colour = "x"\n' + CHAIN, "colour")):
        with pytest.raises(ConfigError, match=said):
            load_run_file(write(home, "p.toml", text))
