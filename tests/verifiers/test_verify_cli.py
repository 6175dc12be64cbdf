"""``nscas verify`` as a command: exit codes 0/1/2/3, the exact JSON shape, plain-text table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nscas.bundle.exporting import export_bundle
from nscas.cli.verify import app
from nscas.objects.digests import Digest

from .conftest import Pipeline


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), prog_name="nscas verify")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_a_verified_receipt_exits_0_with_a_table(pipeline: Pipeline) -> None:
    code, out, err = run(pipeline.receipt("eval-again"), "--store", str(pipeline.store_dir))
    assert code == 0, out + err
    lines = out.splitlines()
    # The full ID of what was verified comes first, never cut short.
    assert lines[0] == f"target {pipeline.receipt('eval-again')}"
    # Then the summary, before the table.
    assert lines[1].startswith("ok: ") and " 0 failed" in lines[1]
    assert lines[2].split() == ["check", "claimed", "recomputed", "status", "message"]
    # Then what was not rechecked, by name, and the self-reported facts.
    assert lines[-2].startswith("not rechecked (needs a model run): ")
    assert ".retention.losses" in lines[-2]
    assert lines[-1].startswith("self-reported, trusted only as far as the pinned ID")
    assert any(line.startswith("integrity.hashes ") for line in lines)


def test_json_shape(pipeline: Pipeline) -> None:
    code, out, _ = run(pipeline.receipt("eval-again"), "--store", str(pipeline.store_dir),
                       "--json")
    assert code == 0
    report = json.loads(out)
    assert list(report) == ["target", "named", "ok", "strict", "summary", "not_rechecked",
                            "self_reported", "signers", "checks"]
    assert report["target"] == pipeline.receipt("eval-again") and report["named"] is None
    assert report["ok"] is True
    assert all(set(c) == {"name", "status", "claimed", "recomputed", "message", "needs"}
               for c in report["checks"])
    assert set(report["not_rechecked"]) == {"weights", "model"}
    names = [c["name"] for c in report["checks"]]
    assert report["checks"][0]["recomputed"] == pipeline.receipt("eval-again")
    assert names[:8] == ["target", "integrity.missing", "integrity.hashes", "integrity.records",
                         "integrity.labels", "integrity.kinds", "integrity.trees",
                         "integrity.omitted"]


def test_strict_and_failed_checks_exit_1(pipeline: Pipeline) -> None:
    # What only a model run can recheck is listed, and strict does not fail for it.
    code, out, _ = run(pipeline.receipt("eval-again"), "--store", str(pipeline.store_dir),
                       "--strict", "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    assert json.loads(out)["not_rechecked"]["model"]
    claims = pipeline.record(pipeline.receipt("eval-seed"))["claims"]
    claims["correct"] = {**claims["correct"], "value": 5}
    tampered = pipeline.reput(pipeline.receipt("eval-seed"), claims=claims)
    code, out, _ = run(tampered, "--store", str(pipeline.store_dir))
    assert code == 1
    row = next(line for line in out.splitlines() if ".claims.correct " in line)
    assert row.split()[1:4] == ["5", "0", "failed"]
    assert any(line.startswith("FAILED: ") for line in out.splitlines())


def test_bad_input_exits_2_with_one_line(pipeline: Pipeline, tmp_path: Path) -> None:
    code, out, err = run("not-an-id!", "--store", str(pipeline.store_dir))
    assert (code, out) == (2, "")
    assert err.startswith("nscas: error: ") and err.count("\n") == 1
    code, _, err = run(pipeline.receipt("eval-seed"), "--store", str(tmp_path))
    assert code == 2 and "not an nscas store" in err


def test_a_missing_target_exits_3(pipeline: Pipeline) -> None:
    code, _, err = run("blake3:" + "1" * 64, "--store", str(pipeline.store_dir))
    assert code == 3 and "not available" in err


def test_the_store_comes_from_the_environment(pipeline: Pipeline,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSCAS_STORE", str(pipeline.root))
    code, _, _ = run(pipeline.receipt("commit"))
    assert code == 0


def test_a_bundle_needs_no_store(pipeline: Pipeline, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    export_bundle(pipeline.store, Digest.parse(pipeline.receipt("init")), tmp_path / "bundle",
                  weights=False)
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("bundle", "--json")
    assert code == 0
    report = json.loads(out)
    assert {c["name"]: c["status"] for c in report["checks"]}["integrity.omitted"] == "skipped"
    code, _, _ = run("bundle", "--strict")
    assert code == 1


def test_registered_in_the_main_app_when_the_lead_adds_it(pipeline: Pipeline) -> None:
    from nscas.cli.root import COMMANDS
    from nscas.cli.root import app as main_app

    if "verify" not in COMMANDS:
        pytest.skip("verify is not registered in cli/main.py yet")
    result = CliRunner().invoke(main_app, ["--store", str(pipeline.store_dir), "verify",
                                           pipeline.receipt("commit"), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True
