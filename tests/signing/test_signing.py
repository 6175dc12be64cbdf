"""Signed receipts and model signatures (issue 21): keys, signing at the end of a run,
export carrying signatures, verify --trust, and every forgery failing with a finding."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import rfc8785
from typer.testing import CliRunner

from nscas.cli.root import app
from nscas.errors import DestinationExists, InvalidInput
from nscas.objects.digests import Digest
from nscas.runs.runner import run_file
from nscas.signing.signatures import KeySigner, load_key, new_key, signature_record, statement
from nscas.store.writer import Store, init_store
from nscas.upkeep.fsck import fsck, gc
from tests.pipelines import tiny_pipeline

BIN = Path(sys.executable).parent


@dataclass(frozen=True, slots=True, kw_only=True)
class Signed:
    root: Path
    store: Store
    key: Path
    receipts: dict[str, Digest]

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def signatures_of(self, receipt: Digest) -> list[Digest]:
        return [link.parent for link in self.store.links_to(receipt) if link.path == "$.receipt"]


def nscas(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), prog_name="nscas")
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Signed:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("signed")
    key = new_key(root / "keys" / "alice.key").private
    (root / "p.toml").write_text(tiny_pipeline())
    store = init_store(root)
    results = run_file(store, root / "p.toml", signer=KeySigner(load_key(key)))
    return Signed(root=root, store=store, key=key, receipts={r.step: r.receipt for r in results})


@pytest.fixture(scope="module")
def bundle(signed: Signed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("bundle") / "b"
    code, out = nscas("--store", str(signed.store_dir), "export", str(signed.receipts["commit"]),
                      str(dest), "--model-signing", str(signed.key))
    assert code == 0, out
    return dest


def test_key_files_modes_and_no_overwrite(tmp_path: Path) -> None:
    made = new_key(tmp_path / "k" / "a.key")
    assert made.private.stat().st_mode & 0o777 == 0o600
    assert made.public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(DestinationExists):
        new_key(made.private)
    for args in (("--out", str(made.private)), (str(made.private),)):
        code, out = nscas("key", "new", *args)
        assert code == 2 and "already exists" in out and len(out.strip().splitlines()) == 1
    made.private.chmod(0o640)
    with pytest.raises(InvalidInput, match="accessible by group or others"):
        load_key(made.private)


def test_key_new_takes_the_file_as_an_argument_or_as_out(tmp_path: Path) -> None:
    code, out = nscas("key", "new", str(tmp_path / "a.key"), "--json")
    assert code == 0, out
    assert json.loads(out)["public"] == str(tmp_path / "a.key.pub")
    code, out = nscas("key", "new", "--out", str(tmp_path / "b.key"))
    assert code == 0 and (tmp_path / "b.key.pub").is_file(), out
    code, out = nscas("key", "new", str(tmp_path / "c.key"), "--out", str(tmp_path / "d.key"))
    assert code == 2 and "not both" in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "c.key").exists() and not (tmp_path / "d.key").exists()


def test_exposed_key_is_refused_and_nothing_is_written(signed: Signed, tmp_path: Path) -> None:
    exposed = tmp_path / "exposed.key"
    shutil.copy(signed.key, exposed)
    exposed.chmod(0o644)
    before = len(list(signed.store.iter_objects()))
    code, out = nscas("--store", str(signed.store_dir), "sign", str(signed.receipts["init"]),
                      "--key", str(exposed))
    assert code == 2 and "chmod 600" in out and len(out.strip().splitlines()) == 1
    code, out = nscas("--store", str(signed.store_dir), "run", str(signed.root / "p.toml"),
                      "--rerun", "--sign-key", str(exposed))
    assert code == 2 and "accessible by group or others" in out
    assert len(list(signed.store.iter_objects())) == before


def test_run_signs_every_receipt_deterministically(signed: Signed) -> None:
    key = load_key(signed.key)
    for receipt in signed.receipts.values():
        (sig,) = signed.signatures_of(receipt)
        record = signed.store.get_record(sig)
        assert record["envelope"]["signatures"][0]["keyid"] == key.keyid
        payload = json.loads(base64.b64decode(record["envelope"]["payload"]))
        assert payload["subject"][0]["name"] == str(receipt)
        assert KeySigner(key).sign(signed.store, receipt) == sig  # RFC 6979: the same record
        assert signed.store.info(receipt).kind == "receipt/1"  # the receipt is untouched
    assert fsck(signed.store).ok


def test_export_carries_signatures_identically_and_never_the_key(signed: Signed, bundle: Path,
                                                                tmp_path: Path) -> None:
    commit = signed.receipts["commit"]
    (sig,) = signed.signatures_of(commit)
    assert (bundle / "signatures" / f"{sig.hex}.json").read_bytes() == signed.store.get_bytes(sig)
    again = tmp_path / "again"
    assert nscas("--store", str(signed.store_dir), "export", str(commit), str(again))[0] == 0
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    others = {p.relative_to(again).as_posix() for p in again.rglob("*") if p.is_file()}
    assert files - others == {"model-signatures/seed.sig"}  # signed afresh: outside the property
    for rel in others:
        assert (bundle / rel).read_bytes() == (again / rel).read_bytes(), rel
    secret = signed.key.read_bytes().splitlines()[1]  # a line of the private key's base64
    for root in (bundle, signed.store_dir):
        for path in root.rglob("*"):
            assert not path.is_file() or secret not in path.read_bytes(), path
    sums = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle)
    assert sums.returncode == 0
    assert "model-signatures" not in (bundle / "SHA256SUMS").read_text()


def test_verify_offline_with_the_public_key(signed: Signed, bundle: Path) -> None:
    pub = f"{signed.key}.pub"
    code, out = nscas("verify", str(bundle), "--trust", pub)
    assert code == 0, out
    commit = signed.receipts["commit"]
    assert f"self-reported facts of receipt {commit}: signed by key" in out
    assert f"(trusted key {pub})" in out
    code, out = nscas("verify", str(bundle), "--json")
    report = json.loads(out)
    assert code == 0 and any(c["name"].startswith("signatures.") and c["status"] == "passed"
                             for c in report["checks"])
    assert report["signers"] and "an untrusted key" in report["signers"][0]


def test_import_takes_signatures(signed: Signed, bundle: Path, tmp_path: Path) -> None:
    store = init_store(tmp_path)
    code, out = nscas("--store", str(tmp_path / ".nscas"), "import", str(bundle))
    assert code == 0, out
    (sig,) = signed.signatures_of(signed.receipts["commit"])
    assert store.has(sig)
    code, out = nscas("--store", str(tmp_path / ".nscas"), "verify",
                      str(signed.receipts["commit"]), "--trust", f"{signed.key}.pub")
    assert code == 0, out


def test_another_key_is_not_trusted(signed: Signed, bundle: Path, tmp_path: Path) -> None:
    other = new_key(tmp_path / "bob.key")
    code, out = nscas("verify", str(bundle), "--trust", str(other.public))
    assert code == 1 and "no valid signature by a trusted key" in out
    code, out = nscas("verify", str(bundle), "--trust", str(other.private))
    assert code == 2 and "is a private key" in out


def test_dropped_signature_fails_under_trust(signed: Signed, bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "dropped"
    shutil.copytree(bundle, copy)
    for path in (copy / "signatures").iterdir():
        path.unlink()
    code, out = nscas("verify", str(copy), "--trust", f"{signed.key}.pub")
    assert code == 1 and "(unsigned)" in out


def _verify_store(signed: Signed, receipt: Digest, *trust: str) -> tuple[int, str]:
    args = [a for k in trust for a in ("--trust", k)]
    return nscas("--store", str(signed.store_dir), "verify", str(receipt), *args)


def test_tampered_signed_field_fails(signed: Signed) -> None:
    commit = signed.receipts["commit"]
    record = signed.store.get_record(commit)
    record["finished"] = "2031-01-01T00:00:00.000000+00:00"  # a self-reported fact
    forged = signed.store.put_record(record)
    (sig,) = signed.signatures_of(commit)
    moved = signed.store.get_record(sig)
    moved["receipt"] = str(forged)  # the old envelope, now linking the rewritten receipt
    signed.store.put_record(moved)
    code, out = _verify_store(signed, forged, f"{signed.key}.pub")
    assert code == 1 and "replayed" in out
    # The statement rewritten for the new receipt, the old signature kept: it does not verify.
    moved["envelope"]["payload"] = base64.b64encode(rfc8785.dumps(
        statement(forged, signed.store.get_bytes(forged)))).decode()
    bad = signed.store.put_record(moved)
    code, out = _verify_store(signed, forged)
    assert code == 1 and "does not verify" in out
    assert any(f.problem == "bad-signature" and f.object == str(bad)
               for f in fsck(signed.store).findings)


def test_replayed_signature_fails(signed: Signed) -> None:
    (sig,) = signed.signatures_of(signed.receipts["prepare"])
    replay = signed.store.get_record(sig)
    replay["receipt"] = str(signed.receipts["tokenizer"])
    signed.store.put_record(replay)
    code, out = _verify_store(signed, signed.receipts["tokenizer"], f"{signed.key}.pub")
    assert code == 1 and f"replayed: the statement is about {signed.receipts['prepare']}" in out


def test_swapped_key_fails(signed: Signed, tmp_path: Path) -> None:
    other = load_key(new_key(tmp_path / "mallory.key").private)
    init = signed.receipts["init"]
    (sig,) = signed.signatures_of(init)
    swapped = signed.store.get_record(sig)
    swapped["public_key"] = other.public_pem
    swapped["envelope"]["signatures"][0]["keyid"] = other.keyid
    signed.store.put_record(swapped)
    code, out = _verify_store(signed, init, str(tmp_path / "mallory.key.pub"))
    assert code == 1 and "does not verify" in out
    # Mallory's own signature of the receipt is valid, but Alice's key is the one trusted.
    signed.store.put_record(signature_record(other, init, signed.store.get_bytes(init)))
    code, out = _verify_store(signed, init, f"{signed.key}.pub")
    assert code == 1 and "does not verify" in out  # the swapped record still fails


def test_gc_keeps_signatures(signed: Signed) -> None:
    sigs = [s for r in signed.receipts.values() for s in signed.signatures_of(r)]
    gc(signed.store, min_age=0)
    assert all(signed.store.has(s) for s in sigs)


def test_model_signature_passes_the_stock_model_signing_cli(signed: Signed, bundle: Path,
                                                            tmp_path: Path) -> None:
    cli = BIN / "model_signing"
    if not cli.exists():
        pytest.fail("the model_signing command is missing: pip install -e '.[dev]'")

    def model_signing(pub: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cli), "verify", "key", str(bundle / "models" / "seed"),
                               "--signature", str(bundle / "model-signatures" / "seed.sig"),
                               "--public_key", pub], capture_output=True, text=True,
                              env={**os.environ, "MODEL_SIGNING_LOG_LEVEL": "ERROR"})
    ok = model_signing(f"{signed.key}.pub")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert model_signing(str(new_key(tmp_path / "eve.key").public)).returncode != 0
    code, out = nscas("verify", str(bundle), "--strict")
    assert code == 0, out
    code, out = nscas("--store", str(signed.store_dir), "export", str(signed.receipts["commit"]),
                      str(tmp_path / "nw"), "--no-weights", "--model-signing", str(signed.key))
    assert code == 2 and "need the weights" in out and not (tmp_path / "nw").exists()
