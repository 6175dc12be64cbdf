"""Pins mean provenance, every input is parsed by its grammar, and what a reader loads from a
model folder is what the records name: ``--expect`` with an output's ID, duplicate
SHA256SUMS lines, signed Statements with another predicate or a duplicate member, trust files
of several keys, lone surrogates, code-loading hints and a trained checkpoint's rewritten
tokenizer.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from nscas.bundle.exporting import export_bundle
from nscas.objects.digests import Digest
from nscas.signing.signatures import load_key, new_key, pae, statement
from nscas.store.opening import open_store
from nscas.verifiers.core.errors import RecordParseError
from nscas.verifiers.core.results import Report
from nscas.verifiers.records.reading import parse_json
from nscas.verifiers.signatures.checks import BadTrustKey, load_trusted
from nscas.verifiers.verify import verify
from tests.verifiers.conftest import Demo, nscas_verify
from tests.verifiers.mutations import reseal
from tests.verifiers.rewrite import object_id


def failed(report: Report) -> dict[str, str]:
    return {c.name: c.message for c in report.checks if c.status == "failed"}


# ------------------------------------------------------------------ --expect


def test_a_pin_on_the_receipt_or_its_own_output_passes(demo: Demo) -> None:
    report_tree = demo.output("report", "report")
    for pin in (demo.report, report_tree):
        got = verify(str(demo.bundle), strict=True, expect=pin)
        assert got.ok, failed(got)
        (check,) = [c for c in got.checks if c.name == "expect"]
        assert check.status == "passed"


@pytest.mark.parametrize(("pin", "says"), [
    ("checkpoint", "does not name among its outputs"),
    ("receipt", "another receipt"),
    ("absent", "which is not in"),
])
def test_a_pin_that_the_receipt_did_not_produce_fails_saying_what_it_names(
        demo: Demo, pin: str, says: str) -> None:
    value = {"checkpoint": demo.output("train-single", "checkpoint"),
             "receipt": demo.receipt("evaluate-single"),
             "absent": "blake3:" + "0" * 64}[pin]
    got = verify(str(demo.bundle), strict=True, expect=value)
    assert failed(got).keys() == {"expect"}
    assert says in failed(got)["expect"] and value in failed(got)["expect"]


def test_an_output_pin_does_not_vouch_for_another_receipt(demo: Demo) -> None:
    """The serve receipt's log pinned, the bundle of a receipt that did not produce it."""
    log = demo.output("serve", "requests")
    got = verify(str(demo.parts["train-single"]), expect=log)
    assert "expect" in failed(got)


# ------------------------------------------------------------------ grammars


def _copy(bundle: Path, tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(bundle, root)
    return root


def test_a_path_listed_twice_in_sha256sums_is_a_finding(demo: Demo, tmp_path: Path) -> None:
    root = _copy(demo.parts["serve"], tmp_path)
    lines = (root / "SHA256SUMS").read_bytes().splitlines(keepends=True)
    (root / "SHA256SUMS").write_bytes(b"".join([lines[0], *lines]))
    message = failed(verify(str(root)))["bundle.sha256sums"]
    assert "listed again" in message and lines[0].decode().split()[1] in message


def test_crlf_sha256sums_is_a_finding_naming_the_line(demo: Demo, tmp_path: Path) -> None:
    root = _copy(demo.parts["serve"], tmp_path)
    data = (root / "SHA256SUMS").read_bytes()
    (root / "SHA256SUMS").write_bytes(data.replace(b"\n", b"\r\n"))
    assert "line 1 ends in CR LF" in failed(verify(str(root)))["bundle.sha256sums"]


@pytest.mark.parametrize("text", [b'{"a":"\\ud800"}', b'{"\\udfff":1}', b'["x","\\udc00"]',
                                  b'{"a":1,"a":2}', b'{"a":NaN}'])
def test_the_strict_reader_refuses(text: bytes) -> None:
    with pytest.raises(RecordParseError):
        parse_json(text)


def test_the_strict_reader_keeps_a_surrogate_pair() -> None:
    assert parse_json(b'["\\ud83d\\ude00"]') == ["\U0001F600"]


# ------------------------------------------------------------------ signatures and trust


def _sign(root: Path, key_file: Path, receipt: str, edit: Any = None, raw: bytes | None = None
          ) -> None:
    """A signature/1 record of ``receipt`` by ``key_file`` whose Statement is the honest one
    changed by ``edit`` (or is ``raw``), added to the bundle and resealed."""
    key = load_key(key_file)
    data = next((root / p).read_bytes() for p in json.loads((root / "manifest.json")
                .read_bytes())["objects"] if p.startswith("receipts/")
                and object_id((root / p).read_bytes()) == receipt)
    value = statement(Digest.parse(receipt), data)
    if edit is not None:
        edit(value)
    payload = raw if raw is not None else rfc8785.dumps(value)
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    sig = key.private.sign(pae("application/vnd.in-toto+json", payload),
                           ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    record = rfc8785.dumps({
        "nscas": "signature/1", "receipt": receipt, "public_key": key.public_pem,
        "envelope": {"payloadType": "application/vnd.in-toto+json",
                     "payload": base64.b64encode(payload).decode(),
                     "signatures": [{"keyid": key.keyid,
                                     "sig": base64.b64encode(sig).decode()}]}})
    path = f"signatures/{object_id(record)[7:]}.json"
    (root / "signatures").mkdir(exist_ok=True)
    (root / path).write_bytes(record)
    reseal(root, added={path: "signature/1"})


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("keys")
    return new_key(root / "alice.key").private, new_key(root / "bob.key").private


def test_an_honest_signature_is_trusted(demo: Demo, tmp_path: Path,
                                        keys: tuple[Path, Path]) -> None:
    root = _copy(demo.parts["serve"], tmp_path)
    _sign(root, keys[0], demo.receipt("serve"))
    got = verify(str(root), strict=True,
                 trust=load_trusted([keys[0].with_name("alice.key.pub")]))
    assert got.ok, failed(got)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda s: s.update(predicate={"kind": "report/1"}), "predicate"),
    (lambda s: s.update(predicate={}), "predicate"),
    (lambda s: s.update(extra=1), "members beyond"),
    (lambda s: s["subject"][0].update(note="x"), "members beyond name and digest"),
])
def test_a_statement_is_checked_against_the_receipt_it_signs(
        demo: Demo, tmp_path: Path, keys: tuple[Path, Path], edit: Any, says: str) -> None:
    root = _copy(demo.parts["serve"], tmp_path)
    _sign(root, keys[0], demo.receipt("serve"), edit=edit)
    got = failed(verify(str(root), trust=load_trusted([keys[0].with_name("alice.key.pub")])))
    (name,) = [n for n in got if n.startswith("signatures.")]
    assert says in got[name]


def test_a_statement_with_a_duplicate_member_is_refused(demo: Demo, tmp_path: Path,
                                                         keys: tuple[Path, Path]) -> None:
    root = _copy(demo.parts["serve"], tmp_path)
    honest = rfc8785.dumps(statement(Digest.parse(demo.receipt("serve")),
                                     (demo.parts["serve"] / next(
                                         p for p in json.loads((root / "manifest.json")
                                                               .read_bytes())["objects"]
                                         if p.startswith("receipts/"))).read_bytes()))
    doubled = honest[:-1] + b',"predicate":{"kind":"receipt/1"}}'
    _sign(root, keys[0], demo.receipt("serve"), raw=doubled)
    got = failed(verify(str(root)))
    (name,) = [n for n in got if n.startswith("signatures.")]
    assert "duplicate key" in got[name]


def test_a_trust_file_of_two_keys_trusts_each(demo: Demo, tmp_path: Path,
                                              keys: tuple[Path, Path]) -> None:
    alice, bob = (k.with_name(k.name + ".pub") for k in keys)
    both = tmp_path / "both.pub"
    both.write_bytes(alice.read_bytes() + b"\n" + bob.read_bytes())
    trusted = load_trusted([both])
    assert len({k.keyid for k in trusted}) == 2
    root = _copy(demo.parts["serve"], tmp_path)
    _sign(root, keys[1], demo.receipt("serve"))  # signed by the second key of the file
    assert verify(str(root), trust=trusted).ok
    assert "signatures." + demo.receipt("serve")[7:19] in failed(
        verify(str(root), trust=load_trusted([alice])))


@pytest.mark.parametrize(("content", "says", "with_key"), [
    (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a PUBLIC KEY", True),
    (b"hello\n", "text outside", True),
    (b"hello\n", "no PEM block", False),
])
def test_an_unusable_trust_file_is_refused(tmp_path: Path, keys: tuple[Path, Path],
                                           content: bytes, says: str, with_key: bool) -> None:
    bad = tmp_path / "bad.pub"
    key = keys[0].with_name("alice.key.pub").read_bytes() if with_key else b""
    bad.write_bytes(key + content)
    with pytest.raises(BadTrustKey, match=says):
        load_trusted([bad])


# ------------------------------------------------------------------ what a reader loads


def _forged(demo: Demo, tmp_path: Path, step: str, folder_file: str,
            change: Any) -> tuple[Path, str]:
    """A copy of the store in which ``step``'s checkpoint file ``folder_file`` is changed, the
    tree, the checkpoint and the receipt re-put to name it; that receipt exported."""
    store = open_store(demo.copy_store(tmp_path) )
    try:
        receipt = store.get_record(Digest.parse(demo.receipt(step)))
        ck_id = Digest.parse(receipt["outputs"]["checkpoint"])
        ck = store.get_record(ck_id)
        tree = store.get_record(Digest.parse(ck["files"]))
        entry = tree["entries"][folder_file]
        data = change(store.get_bytes(Digest.parse(entry["id"])))
        new = store.put_bytes(data)
        tree["entries"][folder_file] = {"id": str(new), "size": len(data),
                                        "sha256": store.sha256(new)}
        ck["files"] = str(store.put_record(tree))
        forged_ck = store.put_record(ck)
        receipt["outputs"]["checkpoint"] = str(forged_ck)
        forged = store.put_record(receipt)
        out = tmp_path / "forged"
        export_bundle(store, forged, out)
    finally:
        store.close()
    return out, str(forged_ck)


def test_a_trained_checkpoints_rewritten_tokenizer_is_a_finding(demo: Demo,
                                                                tmp_path: Path) -> None:
    def decoder(data: bytes) -> bytes:
        value = json.loads(data)
        value["decoder"] = {"type": "Replace", "pattern": {"String": "a"}, "content": "b"}
        return json.dumps(value).encode()

    bundle, ck = _forged(demo, tmp_path, "train-single", "tokenizer.json", decoder)
    message = failed(verify(str(bundle)))[f"checkpoint.{ck[7:15]}.files"]
    assert "tokenizer.json differs from the parent's" in message


@pytest.mark.parametrize("member", ["auto_map", "trust_remote_code"])
def test_a_code_loading_hint_is_refused(demo: Demo, tmp_path: Path, member: str) -> None:
    def hint(data: bytes) -> bytes:
        value = json.loads(data)
        value[member] = {"AutoModelForCausalLM": "evil.Model"} if member == "auto_map" else True
        return json.dumps(value).encode()

    bundle, ck = _forged(demo, tmp_path, "train-single", "config.json", hint)
    got = failed(verify(str(bundle)))
    assert member in got[f"checkpoint.{ck[7:15]}.loader"]
    assert "config.json member" in got[f"checkpoint.{ck[7:15]}.files"]


def test_a_swapped_weight_folder_fails_strict_with_pin_and_trust_on_the_cli(
        demo: Demo, tmp_path: Path) -> None:
    """The first forgery of its kind: two model folders' weights exchanged, every manifest entry,
    the tar and SHA256SUMS rewritten to match."""
    root = _copy(demo.bundle, tmp_path)
    a, b = "models/clean-single/model.safetensors", "models/seed/model.safetensors"
    data = (root / a).read_bytes()
    shutil.copyfile(root / b, root / a)
    (root / b).write_bytes(data)
    reseal(root)
    v = nscas_verify(root, "--strict", "--expect", demo.report)
    assert v.code == 1
    assert "bundle.layout" in v.failed()
    message = v.check("bundle.layout")["message"]
    assert a in message and b in message
