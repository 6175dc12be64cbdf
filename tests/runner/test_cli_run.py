"""``nscas run`` end to end in-process: plain and JSON output, exit codes, progress on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import Result

from nscas.cli.run import verdict_text
from nscas.objects.digests import Digest
from nscas.runs.verdicts import Verdict
from nscas.store.writer import Store
from tests.runner.helpers import PIPELINE, PREPARE_RECIPE, TINY_COUNTS, snapshot, write

torch.set_num_threads(1)

Nscas = Callable[..., Result]
STEP_KEYS = {"receipt", "action", "cached", "outputs", "claims"}
PREPARE_OUTPUTS = {"test", "dev", "train", "damaged", "replay", "retention", "prepared"}


def open_home(home: Path) -> Store:
    return Store(home / ".nscas")


def test_recipe_file_plain_output_then_cached(nscas: Nscas, home: Path) -> None:
    path = write(home, "prepare.toml", PREPARE_RECIPE + '[outputs]\nprepared = "coop/p"\n')
    first = nscas("--store", home, "run", path)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[0].startswith("recipe prepare: ran, receipt blake3:")
    receipt = lines[0].rsplit(" ", 1)[1]
    with open_home(home) as store:
        rec = store.get_record(Digest.parse(receipt))
        prepared = store.ref_get("coop/p")
    assert rec["status"] == "succeeded"
    assert lines[1].split() == ["item", "name", "value"]
    rows = [line.split(maxsplit=2) for line in lines[2:]]
    assert ["output", "prepared", str(prepared)] in rows
    assert ["claim", "counts", '{"test": 16, "dev": 8, "train": 32}'] in rows
    assert [r[:2] for r in rows if r[0] == "output"] == [["output", n] for n in (
        "test", "dev", "train", "damaged", "replay", "retention", "prepared")]
    assert "[prepare] generating tasks" in first.stderr  # plain progress lines, on stderr
    again = nscas("--store", home, "run", path)
    assert again.exit_code == 0
    assert again.stdout.splitlines()[0] == f"recipe prepare: cached, receipt {receipt}"
    assert again.stderr == ""  # nothing ran, so no progress


def test_recipe_file_json_shape(nscas: Nscas, home: Path) -> None:
    path = write(home, "prepare.toml", PREPARE_RECIPE)
    result = nscas("--store", home, "run", path, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == STEP_KEYS
    assert out["cached"] is False
    assert set(out["outputs"]) == PREPARE_OUTPUTS
    assert out["claims"]["counts"] == TINY_COUNTS
    assert out["claims"]["damaged_fail_checker"] is True
    with open_home(home) as store:
        receipt = store.get_record(Digest.parse(out["receipt"]))
        assert receipt["action"] == out["action"]
        assert receipt["outputs"] == out["outputs"]
        assert {k: v["value"] for k, v in receipt["claims"].items()} == out["claims"]
    again = json.loads(nscas("--store", home, "run", path, "--json").stdout)
    assert again == {**out, "cached": True}


def test_pipeline_json_shape_and_rerun_verdicts(nscas: Nscas, home: Path) -> None:
    path = write(home, "pipeline.toml", PIPELINE)
    first = json.loads(nscas("--store", home, "run", path, "--json").stdout)
    assert isinstance(first, list)
    assert [s["step"] for s in first] == ["prepare", "tokenizer", "init"]
    assert all(set(s) == STEP_KEYS | {"step"} for s in first)
    assert set(first[2]["outputs"]) == {"checkpoint"}
    assert first[2]["claims"]["parameter_digest"].startswith("blake3:")

    rerun = nscas("--store", home, "run", path, "--json", "--rerun")
    assert rerun.exit_code == 0, rerun.output
    steps = json.loads(rerun.stdout)
    assert all(set(s) == STEP_KEYS | {"step", "verdicts"} for s in steps)
    for old, new in zip(first, steps, strict=True):
        assert new["cached"] is False and new["receipt"] != old["receipt"]
        assert new["verdicts"] == {name: {"status": "identical", "before": oid, "after": oid}
                                   for name, oid in old["outputs"].items()}

    plain = nscas("--store", home, "run", path, "--rerun")
    assert plain.exit_code == 0
    assert "step init (recipe init): ran, receipt " in plain.stdout
    verdicts = [line.split() for line in plain.stdout.splitlines() if line.startswith("verdict")]
    assert sorted(v[1] for v in verdicts) == sorted(PREPARE_OUTPUTS | {"tokenizer", "checkpoint"})
    assert {v[2] for v in verdicts} == {"identical"}


def test_failed_step_exits_1_naming_its_receipt(nscas: Nscas, home: Path) -> None:
    with open_home(home) as store:
        not_jsonl = store.put_bytes(b"{not json\n")
    path = write(home, "bad.toml", PREPARE_RECIPE + f'[inputs]\nreplay = "{not_jsonl}"\n')
    result = nscas("--store", home, "run", path, "--json")
    assert result.exit_code == 1
    *progress, line = result.stderr.splitlines()
    assert all(p.startswith("[prepare] ") for p in progress)
    assert line.startswith("nscas: error: recipe 'prepare' failed: conversations line 1: not JSON")
    receipt = line.rsplit("(receipt ", 1)[1].rstrip(")")
    out = json.loads(result.stdout)  # what ran is still reported
    assert out["receipt"] == receipt and out["status"] == "failed"
    assert out["error"].startswith("conversations line 1") and out["outputs"] == {}
    with open_home(home) as store:
        rec = store.get_record(Digest.parse(receipt))
    assert rec["status"] == "failed" and rec["error"] == out["error"]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(nscas: Nscas, home: Path) -> None:
    path = write(home, "bad.toml", 'recipe = "prepare"\n[params]\ngrounded_weight = 17\n')
    with open_home(home) as store:
        before = snapshot(store)
    result = nscas("--store", home, "run", path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (f"nscas: error: {path}: params: grounded_weight must be between "
                             "1 and 16, got 17\n")
    with open_home(home) as store:
        assert snapshot(store) == before


@pytest.mark.parametrize(("params", "message"), [
    ("world = 2\nmicro_batch = 5", "params: micro_batch (5) is more than a rank's "
                                   "documents per update (batch / world = 4)"),
    ('micro_batch = "all"', "params.micro_batch must be an integer, got 'all'"),
    ("bucket_mb = 0", "params: bucket_mb must be an integer between 1 and 4096, "
                      "not 0"),
])
def test_bad_train_params_exit_2_before_anything_runs(nscas: Nscas, home: Path, params: str,
                                                      message: str) -> None:
    with open_home(home) as store:
        blob = store.put_bytes(b"not looked at: params are checked first\n")
        before = snapshot(store)
    inputs = "".join(f'{name} = "{blob}"\n' for name in ("base", "documents", "replay"))
    path = write(home, "train.toml", f'recipe = "train"\n[inputs]\n{inputs}[params]\n{params}\n')
    result = nscas("--store", home, "run", path)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"nscas: error: {path}: {message}\n"
    with open_home(home) as store:
        assert snapshot(store) == before


def test_run_help_has_an_example(nscas: Nscas) -> None:
    result = nscas("run", "--help")
    assert result.exit_code == 0
    assert "Example: nscas run" in result.stdout and "--rerun" in result.stdout


def test_verdict_text() -> None:
    a, b = Digest("1" * 64), Digest("2" * 64)
    assert verdict_text(Verdict(status="identical", before=a, after=a)) == "identical"
    close = Verdict(status="within-tolerance", before=a, after=b, relative_l2=3.14159e-7,
                    max_abs_diff=2.5e-8)
    assert verdict_text(close) == "within-tolerance (relative L2 3.14e-07, max |Δ| 2.5e-08)"
    gone = Verdict(status="different", before=a, after=None, note="present in only one run")
    assert verdict_text(gone) == "different (present in only one run)"
