"""Receipt signatures (docs/format.md §3.11, docs/verify.md "What a signature adds").

A ``signature/1`` record links the receipt it signs; it holds a DSSE envelope over an in-toto
Statement v1 whose one subject is that receipt (name: its ID; digests: its BLAKE3 and its
SHA-256), and the signer's public key. This module checks each one on its own terms, with its
own DSSE pre-authentication encoding and pyca/cryptography's ECDSA (nothing of nscas core):

- the record is intact (its bytes hash to its ID), canonical and schema-valid, labelled as
  what it is;
- the payload is standard base64 of a JSON statement of type ``STATEMENT_TYPE`` and
  predicate type ``PREDICATE_TYPE`` whose only subject is the linked receipt, by ID, BLAKE3
  and SHA-256 of the receipt's verified bytes (an envelope made for another receipt, replayed
  onto this one, fails here);
- every signature's key id is the SHA-256 of the record's public key (DER
  SubjectPublicKeyInfo), and the signature verifies over PAE(payloadType, payload) with that
  key (ECDSA P-256, SHA-256, DER-encoded).

With ``--trust`` keys, every receipt of the closure must carry a valid signature by one of
them (check ``signatures.<short id>``); a missing, bad, replayed or untrusted-only signature
fails. Without, signatures that are present are checked and reported, none is required.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785

from ..core.errors import RecordParseError, VerifierError
from ..core.results import Check
from ..records.closure import Closure, Objects, Unusable
from ..records.reading import check_record, parse_json

SIGNATURE = "signature/1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://nscas.dev/receipt/v1"
PREDICATE = {"kind": "receipt/1"}
"""The predicate of a receipt's statement (docs/format.md §3.11): exactly this."""
MAX_KEY_BYTES = 64 << 10


class BadTrustKey(VerifierError):
    """A ``--trust`` file that is not a usable public key (exit 2)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"--trust {path}: {why}")
        self.path = path
        self.why = why


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustedKey:
    """A public key the verifier was told to trust."""

    path: str
    keyid: str
    """SHA-256 hex of its DER SubjectPublicKeyInfo."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Signer:
    """Who signed one receipt: a key id, and the ``--trust`` file it matched, if any."""

    receipt: str
    keyid: str
    trusted: str | None

    def line(self) -> str:
        who = f"trusted key {self.trusted}" if self.trusted else "an untrusted key"
        return f"receipt {self.receipt}: signed by key {self.keyid} ({who})"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding, written from the DSSE specification."""
    kind = payload_type.encode("utf-8")
    return b"".join([b"DSSEv1 ", str(len(kind)).encode(), b" ", kind, b" ",
                     str(len(payload)).encode(), b" ", payload])


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise VerifierError("checking signatures needs the 'cryptography' package") from None
    return hashes, serialization, ec


def _keyid(public: Any) -> str:
    _, serialization, _ = _crypto()
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _public_key(pem: bytes) -> Any:
    """An ECDSA P-256 public key from PEM; raises ValueError otherwise."""
    _, serialization, ec = _crypto()
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("not an ECDSA P-256 public key")
    return key


_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----\r?\n?", re.S)


def load_trusted(paths: Sequence[Path]) -> tuple[TrustedKey, ...]:
    """The ``--trust`` public key files (PEM), each refused with one line when unusable. A
    file of several PEM blocks trusts every key in it; anything else in it is refused."""
    keys = []
    for path in paths:
        try:
            if not path.is_file() or path.stat().st_size > MAX_KEY_BYTES:
                raise BadTrustKey(str(path), "not a regular file of a public key")
            data = path.read_bytes()
        except OSError as exc:
            raise BadTrustKey(str(path), exc.strerror or str(exc)) from None
        if b"PRIVATE KEY" in data:
            raise BadTrustKey(str(path), "is a private key; trust the public key (FILE.pub)")
        blocks = list(_PEM_BLOCK.finditer(data))
        if not blocks:
            raise BadTrustKey(str(path), "holds no PEM block (-----BEGIN PUBLIC KEY-----)")
        outside = _PEM_BLOCK.sub(b"", data)
        if outside.strip():
            raise BadTrustKey(str(path), "holds text outside its PEM blocks; a trust file is "
                                         "only PUBLIC KEY blocks")
        for number, block in enumerate(blocks, start=1):
            if block.group(1) != b"PUBLIC KEY":
                raise BadTrustKey(str(path), f"PEM block {number} is a "
                                  f"{block.group(1).decode()!r}, not a PUBLIC KEY")
            try:
                key = _public_key(block.group(0))
            except (ValueError, TypeError) as exc:
                raise BadTrustKey(str(path), f"PEM block {number} is not an ECDSA P-256 "
                                  f"public key ({exc})") from None
            keys.append(TrustedKey(path=str(path) if len(blocks) == 1
                                   else f"{path} (key {number})", keyid=_keyid(key)))
    return tuple(keys)


@dataclass(frozen=True, slots=True, kw_only=True)
class SignatureFindings:
    checks: tuple[Check, ...]
    signers: tuple[Signer, ...]
    seen: frozenset[str]
    """Every signature record found for the closure's receipts (a bundle may hold these)."""


def signature_checks(objects: Objects, closure: Closure,
                     trust: tuple[TrustedKey, ...] | None) -> SignatureFindings:
    """One check per receipt that has signatures, or per receipt when keys are trusted."""
    checks: list[Check] = []
    signers: list[Signer] = []
    seen: set[str] = set()
    trusted = {k.keyid: k.path for k in trust or ()}
    for receipt in closure.of_kind("receipt/1"):
        found = sorted(p for p in objects.source.parents(receipt) or []
                       if _declares_signature(objects, p))
        seen.update(found)
        if not found and trust is None:
            continue
        name = f"signatures.{receipt[7:19]}"
        problems: list[str] = []
        valid: list[str] = []
        for sig in found:
            keyids, problem = _check_one(objects, sig, receipt)
            if problem is not None:
                problems.append(f"{sig[:19]}: {problem}")
            valid += keyids
        valid = sorted(set(valid))
        signers += [Signer(receipt=receipt, keyid=k, trusted=trusted.get(k)) for k in valid]
        if trust is not None and not any(k in trusted for k in valid):
            problems.append("no valid signature by a trusted key" + (
                f" (signed by {', '.join(k[:16] for k in valid)} only)" if valid
                else " (unsigned)" if not found else ""))
        recomputed = [{"keyid": k, "trusted": trusted.get(k)} for k in valid]
        checks.append(Check.verdict(name, not problems, claimed=len(found),
                                    recomputed=recomputed, message="; ".join(problems)))
    return SignatureFindings(checks=tuple(checks), signers=tuple(signers), seen=frozenset(seen))


def _declares_signature(objects: Objects, oid: str) -> bool:
    """Whether a record linking a receipt is (by its bytes) a signature: its kind, or, where
    the bytes do not match the ID, the source's label (so a damaged one is still examined)."""
    try:
        return objects.kind(oid) == SIGNATURE or (
            objects.state(oid).problem is not None and objects.label(oid) == SIGNATURE)
    except VerifierError:
        return False


def _check_one(objects: Objects, oid: str, receipt: str) -> tuple[list[str], str | None]:
    """(key ids whose signatures verify, the first problem or None)."""
    try:
        data = objects.bytes(oid)
    except Unusable as exc:
        return [], exc.why
    failed = [c for c in check_record(data, name="signature") if c.status != "passed"]
    if failed:
        return [], "; ".join(f"{c.name.split('.')[-1]}: {c.message}" for c in failed)
    if objects.label(oid) != SIGNATURE:
        return [], f"labelled {objects.label(oid) or 'a blob'} but its bytes are a {SIGNATURE}"
    record = objects.record(oid)
    if record["receipt"] != receipt:
        return [], f"links {record['receipt']}, not this receipt"
    env = record["envelope"]
    if env["payloadType"] != PAYLOAD_TYPE:
        return [], f"payloadType {env['payloadType']!r} is not {PAYLOAD_TYPE!r}"
    try:
        payload = base64.b64decode(env["payload"], validate=True)
    except (binascii.Error, ValueError) as exc:
        return [], f"the payload is not standard base64 ({exc})"
    try:
        stated = parse_json(payload, what="the signed statement")
    except RecordParseError as exc:
        return [], exc.message
    try:
        receipt_bytes = objects.bytes(receipt)
    except Unusable as exc:
        return [], f"the receipt is unusable: {exc.why}"
    problem = _statement_problem(stated, receipt, receipt_bytes)
    if problem is None and payload != rfc8785.dumps(stated):
        problem = "the signed statement is not in RFC 8785 canonical form"
    if problem is not None:
        return [], problem
    try:
        public = _public_key(record["public_key"].encode("utf-8"))
    except (ValueError, TypeError) as exc:
        return [], f"public_key is unusable ({exc})"
    keyid = _keyid(public)
    hashes, _, ec = _crypto()
    from cryptography.exceptions import InvalidSignature

    good = []
    for entry in env["signatures"]:
        if entry["keyid"] != keyid:
            return [], f"keyid {entry['keyid'][:16]} is not the SHA-256 of the public key"
        try:
            public.verify(base64.b64decode(entry["sig"], validate=True),
                          pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, binascii.Error, ValueError):
            return [], f"the signature by key {keyid[:16]} does not verify"
        good.append(keyid)
    return good, None


def _statement_problem(stated: Any, receipt: str, data: bytes) -> str | None:
    if not isinstance(stated, dict):
        return "the payload is not a JSON object"
    if stated.get("_type") != STATEMENT_TYPE:
        return f"_type is not {STATEMENT_TYPE}"
    if stated.get("predicateType") != PREDICATE_TYPE:
        return f"predicateType is not {PREDICATE_TYPE}"
    subjects = stated.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        return "the statement must have exactly one subject"
    subject = subjects[0]
    want = {"blake3": receipt.removeprefix("blake3:"), "sha256": hashlib.sha256(data).hexdigest()}
    if subject.get("name") != receipt or subject.get("digest") != want or set(subject) != {
            "name", "digest"}:
        named = subject.get("name")
        return (f"replayed: the statement is about {named if isinstance(named, str) else '?'}"
                f", not {receipt}" if subject.get("name") != receipt
                else "the subject's digests are not those of the receipt's bytes"
                if subject.get("digest") != want else "the subject has members beyond "
                "name and digest")
    if stated.get("predicate") != PREDICATE:
        return (f"the predicate is {json.dumps(stated.get('predicate'))[:80]}, not "
                f"{json.dumps(PREDICATE)}: it does not describe the receipt it signs")
    extra = sorted(set(stated) - {"_type", "subject", "predicateType", "predicate"})
    if extra:
        return f"the statement has members beyond an in-toto Statement's: {', '.join(extra)}"
    return None


def signer_lines(signers: Iterable[Signer]) -> tuple[str, ...]:
    """For the summary: who signed each receipt's self-reported facts."""
    return tuple(s.line() for s in signers)
