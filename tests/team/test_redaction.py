"""Credentials never print: every form a store URL can carry a secret in (``user:pass@``,
``?password=`` and the other secret query parameters, S3 keys in an endpoint URL, the AWS
secret key in the environment) fed through every output that can show a store URL: the CLI's
errors of init, open (ref list, fsck), push and pull, with and without ``--json``, and the UI's
error page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nscas.errors import NscasError, StoreError
from nscas.redacting import redact
from nscas.store.config import S3Settings, StoreConfig, render_config
from nscas.store.writer import init_store
from nscas.ui.app import error_page

SECRET = "S3cr3tPw9"
ENV_SECRET = "EnvS3cr3tKey7"
DEAD = "127.0.0.1:9"  # nothing listens on the discard port here: every connection is refused

DATABASES = {
    "userinfo": f"postgresql://nscas:{SECRET}@{DEAD}/nscas",
    "userinfo-with-at": f"postgresql://nscas:a@{SECRET}@{DEAD}/nscas",
    "password-param": f"postgresql://nscas@{DEAD}/nscas?password={SECRET}",
    "sslpassword": f"postgresql://nscas@{DEAD}/nscas?sslmode=disable&sslpassword={SECRET}",
    "passfile": f"postgresql://nscas@{DEAD}/nscas?passfile=/run/{SECRET}",
    "keywords": f"postgresql:///nscas?host=127.0.0.1&port=9&user=nscas&password={SECRET}",
}
ENDPOINTS = {
    "plain": None,
    "s3-userinfo": f"http://AKIAEXAMPLE:{SECRET}@{DEAD}",
    "s3-query": f"http://{DEAD}/?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}",
}


def _nscas(*args: str, store: Path | None = None, cwd: Path | None = None) -> str:
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": ENV_SECRET, "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}
    env.pop("NSCAS_STORE", None)
    if store is not None:
        env["NSCAS_STORE"] = str(store)
    p = subprocess.run([sys.executable, "-m", "nscas.cli", *args], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, (args, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    return p.stdout + p.stderr


def _shown(text: str) -> bool:
    return SECRET in text or ENV_SECRET in text


FORMS = [*((form, "plain") for form in DATABASES),
         *((form, endpoint) for endpoint in ENDPOINTS if endpoint != "plain"
           for form in ("userinfo", "keywords"))]
"""Every secret through every command, each in a real process (162 of them when every database
form met every endpoint): each database form with a plain endpoint, and each endpoint's secret
beside a database secret in URL and in keyword form, so that two secrets meet in one config."""


@pytest.mark.parametrize(("form", "endpoint"), FORMS)
def test_no_output_shows_a_credential(tmp_path: Path, form: str, endpoint: str) -> None:
    database, s3 = DATABASES[form], ENDPOINTS[endpoint]
    outputs: dict[str, str] = {}
    init = ["init", "--database", database, "--objects", f"s3://bucket-{SECRET}x/p"]
    if s3:
        init += ["--s3-endpoint", s3]
    outputs["init"] = _nscas(*init, cwd=tmp_path)
    outputs["init --json"] = _nscas(*init, "--json", cwd=tmp_path)
    team = tmp_path / "team" / ".nscas"
    team.mkdir(parents=True)
    toml = team / "store.toml"
    toml.write_text(render_config(StoreConfig(database=database, objects="s3://bucket/p",
                                              s3=S3Settings(endpoint_url=s3))))
    for args in (("ref", "list"), ("fsck",), ("fsck", "--json"), ("log",)):
        outputs[" ".join(args)] = _nscas(*args, store=toml)
    local = init_store(tmp_path / "laptop")
    oid = local.put_bytes(b"sent")
    local.close()
    (tmp_path / "laptop" / ".nscas" / "remotes.toml").write_text(
        f'[remote.team]\nurl = "{toml}"\n')
    for args in (("push", str(oid), "--to", "team"), ("pull", str(oid), "--from", "team"),
                 ("push", str(oid), "--to", "team", "--json")):
        outputs[" ".join(args[:1] + args[3:])] = _nscas(*args, store=tmp_path / "laptop" / ".nscas")
    leaked = {what: text for what, text in outputs.items() if _shown(text)}
    assert not leaked, leaked
    assert all(text.strip() for text in outputs.values()), outputs  # each did say something


@pytest.mark.parametrize("form", [*DATABASES.values(), *filter(None, ENDPOINTS.values())])
def test_library_errors_and_the_ui_error_page_hide_credentials(
        form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    message = f"cannot reach {form} with key {ENV_SECRET}"
    exc = StoreError(message)
    assert isinstance(exc, NscasError)
    for text in (exc.message, str(exc), redact(message), error_page(503, message).text or ""):
        assert not _shown(text), text
    assert "cannot reach" in exc.message and "***" in exc.message


def test_what_is_no_credential_is_left_as_it_is() -> None:
    for text in ("postgresql://nscas@db:5432/nscas?sslmode=require", "s3://bucket/prefix",
                 "recorded size=12001, sample=0.5", "host=db dbname=nscas"):
        assert redact(text) == text


def test_a_failed_receipts_crash_message_hides_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe that fails with a store URL in its exception: the receipt's message (what the
    runner records, nscas.runs.runner) holds none of its secrets."""
    from nscas.runs.runner import _crash_message

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    for form in DATABASES.values():
        try:
            raise RuntimeError(f"cannot open {form} ({ENV_SECRET})")
        except RuntimeError as exc:
            recorded = _crash_message(exc)
        assert not _shown(recorded) and recorded.startswith("RuntimeError: cannot open"), recorded
