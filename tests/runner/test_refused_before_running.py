"""What the runner refuses before a step runs, with nothing written: params a record cannot
hold, IDs with whitespace around them, and an output ref that is a tag already set elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nscas.errors import ConfigError
from nscas.runs.recipe import Recipe
from nscas.runs.runner import run_file
from nscas.store.writer import Store
from tests.runner.helpers import write


def everything(store: Store) -> tuple[object, ...]:
    """Every row a run could write (objects by ID, refs, the ref log) and the work areas."""
    with store._read() as c:
        rows = tuple(tuple(c.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall())
                     for t in ("objects", "links", "parts", "refs", "ref_log"))
    work = sorted(p.name for p in (store.root / "work").glob("*")) if (store.root / "work").exists() else []
    return rows, tuple(work)


@pytest.mark.parametrize("params,needle", [
    ("count = 9007199254740992", "params.count is 9007199254740992"),
    ("count = -9007199254740993", "params.count is -9007199254740993"),
    ("scale = nan", "params.scale is nan: a record holds finite numbers only"),
    ("scale = inf", "params.scale is inf"),
    ("scale = -inf", "params.scale is -inf"),
])
def test_a_param_a_record_cannot_hold_is_refused_before_anything_is_written(
        store: Store, tmp_path: Path, probe: Recipe, params: str, needle: str) -> None:
    path = write(tmp_path, "r.toml", f'recipe = "probe"\n[params]\n{params}\n')
    before = everything(store)
    with pytest.raises(ConfigError) as err:
        run_file(store, path)
    assert needle in err.value.message and "\n" not in err.value.message
    assert err.value.exit_code == 2
    assert everything(store) == before  # not even the recipe's code tree


def test_the_largest_exact_integer_is_accepted(store: Store, tmp_path: Path, probe: Recipe) -> None:
    path = write(tmp_path, "r.toml", 'recipe = "probe"\n[params]\ncount = 9007199254740991\n')
    [result] = run_file(store, path)
    assert store.get_record(result.action)["params"]["count"] == 2**53 - 1


def test_a_pipeline_step_with_a_bad_param_stops_the_first_step_too(
        store: Store, tmp_path: Path, probe: Recipe) -> None:
    path = write(tmp_path, "p.toml", """
[[step]]
name = "one"
recipe = "probe"

[[step]]
name = "two"
recipe = "probe"
inputs = { source = "step.one.seen" }
params = { count = 9223372036854775807 }
""")
    before = everything(store)
    with pytest.raises(ConfigError, match=r"step 'two': params\.count is 9223372036854775807"):
        run_file(store, path)
    assert everything(store) == before


@pytest.mark.parametrize("pad", [" {id}", "{id} ", "{id}\n", "\t{id}"])
def test_an_input_id_with_whitespace_around_it_is_refused(
        store: Store, tmp_path: Path, probe: Recipe, pad: str) -> None:
    blob = store.put_bytes(b"input")
    value = pad.format(id=blob)
    path = tmp_path / "r.toml"  # a JSON string is a TOML basic string, escapes and all
    path.write_text(f'recipe = "probe"\n[inputs]\nsource = {json.dumps(value)}\n')
    before = everything(store)
    with pytest.raises(ConfigError, match=r"inputs\.source: invalid object ID or ref name .*"
                                          r"surrounding whitespace"):
        run_file(store, path)
    assert everything(store) == before


def _tagged_run(tmp_path: Path, tag: str = "tags/seen", **params: str) -> Path:
    table = "".join(f'{k} = "{v}"\n' for k, v in params.items())
    return write(tmp_path, f"tagged-{len(params)}.toml",
                 f'recipe = "probe"\n[params]\n{table}[outputs]\nseen = "{tag}"\n')


def test_an_output_tag_set_elsewhere_is_refused_before_the_recipe_runs(
        store: Store, tmp_path: Path, probe: Recipe) -> None:
    elsewhere = store.put_bytes(b"released earlier")
    store.ref_set("tags/seen", elsewhere)
    before = everything(store)
    with pytest.raises(ConfigError) as err:
        run_file(store, _tagged_run(tmp_path))
    assert ("outputs.seen: tag 'tags/seen' is already set to " + str(elsewhere)) in err.value.message
    assert "tags never move" in err.value.message and err.value.exit_code == 2
    assert everything(store) == before  # no code tree, no action, no output, no receipt
    assert store.ref_get("tags/seen") == elsewhere


def test_an_output_tag_the_cache_already_gave_is_fine_and_a_rerun_may_confirm_it(
        store: Store, tmp_path: Path, probe: Recipe) -> None:
    path = _tagged_run(tmp_path)
    [first] = run_file(store, path)
    assert store.ref_get("tags/seen") == first.outputs["seen"]
    [again] = run_file(store, path)
    assert again.cached and again.receipt == first.receipt
    [rerun] = run_file(store, path, rerun=True)  # the probe is deterministic: same output
    assert not rerun.cached and rerun.outputs == first.outputs
    assert store.ref_get("tags/seen") == first.outputs["seen"]


def test_a_changed_step_may_not_take_over_a_tag(store: Store, tmp_path: Path,
                                                probe: Recipe) -> None:
    run_file(store, _tagged_run(tmp_path))
    changed = _tagged_run(tmp_path, label="other")  # another action: it has no receipt
    before = everything(store)
    with pytest.raises(ConfigError, match="tag 'tags/seen' is already set"):
        run_file(store, changed)
    assert everything(store) == before


def test_a_later_pipeline_step_with_a_set_tag_stops_the_whole_run(
        store: Store, tmp_path: Path, probe: Recipe) -> None:
    store.ref_set("tags/two", store.put_bytes(b"released earlier"))
    path = write(tmp_path, "p.toml", """
[[step]]
name = "one"
recipe = "probe"

[[step]]
name = "two"
recipe = "probe"
params = { label = "two" }
outputs = { seen = "tags/two" }
""")
    before = everything(store)
    with pytest.raises(ConfigError, match=r"step 'two': outputs\.seen: tag 'tags/two'"):
        run_file(store, path)
    assert everything(store) == before  # step one did not run


def test_a_step_fed_by_another_is_checked_before_it_runs(store: Store, tmp_path: Path,
                                                         probe: Recipe) -> None:
    # Its action is known only once step one ran; it is refused before it runs itself.
    store.ref_set("tags/two", store.put_bytes(b"released earlier"))
    path = write(tmp_path, "p.toml", """
[[step]]
name = "one"
recipe = "probe"
outputs = { seen = "one/seen" }

[[step]]
name = "two"
recipe = "probe"
inputs = { source = "step.one.seen" }
outputs = { seen = "tags/two" }
""")
    with pytest.raises(ConfigError, match=r"outputs\.seen: tag 'tags/two' is already set"):
        run_file(store, path)
    kinds = [o.kind for o in store.iter_objects()]
    assert kinds.count("receipt/1") == 1 and kinds.count("action/1") == 1  # step one's only
    assert store.ref_get("one/seen") is not None
