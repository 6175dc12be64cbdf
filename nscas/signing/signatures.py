"""Signed evidence (docs/format.md §3.11, docs/verify.md "What a signature adds").

A ``signature/1`` record is a DSSE envelope over an in-toto Statement v1 whose one subject is
a receipt (its ``blake3:`` ID as the name, its BLAKE3 and SHA-256 as digests), signed with
ECDSA P-256 / SHA-256 deterministically (RFC 6979), so one key signing one receipt always
gives the same record. The record links the receipt (member ``receipt``), never the other way
round: signing changes no receipt's ID. Private keys live in files of mode 0600 outside the
store; nothing here ever writes one into the store or a bundle.

Model signatures (``nscas export --model-signing KEY``) are made by the ``model-signing``
package (OpenSSF Model Signing v1.0, its private-key mode), imported only then.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import rfc8785

from nscas.errors import DestinationExists, InvalidInput

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

    from nscas.objects.digests import Digest
    from nscas.store.protocol import ObjectStore

KIND = "signature/1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://nscas.dev/receipt/v1"
KEY_ENV = "NSCAS_SIGNING_KEY"
"""The private key file ``nscas run`` signs with, and ``nscas sign``'s default."""
PUBLIC_SUFFIX = ".pub"


def default_key_path() -> Path:
    """Where ``nscas key new`` writes without a FILE: ``$XDG_CONFIG_HOME/nscas/signing.key``
    (``~/.config`` by default), outside every store and bundle."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "nscas" / "signing.key"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@dataclass(frozen=True, slots=True, kw_only=True)
class SigningKey:
    """A loaded private key and the facts a signature names it by."""

    path: Path
    private: ec.EllipticCurvePrivateKey
    public_pem: str
    """The public key, PEM SubjectPublicKeyInfo (what ``FILE.pub`` holds)."""
    keyid: str
    """SHA-256 hex of the public key's DER SubjectPublicKeyInfo."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyFiles:
    private: Path
    public: Path
    keyid: str


class ReceiptSigner(Protocol):
    """What ``nscas run`` signs each receipt it writes with."""

    def sign(self, store: ObjectStore, receipt: Digest) -> Digest:
        """Store the signature record of ``receipt``; its ID."""


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:  # a dependency: only a broken install lacks it
        raise InvalidInput("signing needs the 'cryptography' package (pip install "
                           "'cryptography>=45')") from None
    return hashes, serialization, ec


def keyid_of(public: Any) -> str:
    """SHA-256 hex of a public key's DER SubjectPublicKeyInfo."""
    _, serialization, _ = _crypto()
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def new_key(out: Path) -> KeyFiles:
    """A new ECDSA P-256 key: ``out`` (PKCS#8 PEM, mode 0600) and ``out.pub`` (PEM SPKI).
    Refuses to overwrite either; each file appears whole or not at all."""
    _, serialization, ec = _crypto()
    public_path = out.with_name(out.name + PUBLIC_SUFFIX)
    for path in (out, public_path):
        if path.exists() or path.is_symlink():
            raise DestinationExists(str(path))
    if out.parent != Path() and not out.parent.exists():
        try:
            out.parent.mkdir(parents=True, mode=0o700)
        except OSError as exc:
            raise InvalidInput(f"cannot create {out.parent}: {exc.strerror or exc}") from None
    if not out.parent.is_dir():
        raise InvalidInput(f"cannot write {out}: {out.parent} is not a directory")
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_exclusive(out, private, 0o600)
    try:
        _write_exclusive(public_path, public, 0o644)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return KeyFiles(private=out, public=public_path, keyid=keyid_of(key.public_key()))


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a temporary file of ``mode`` beside ``path``, then link it into place:
    never a partial file, never over an existing one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if path exists: no overwrite, even racing another process
        except FileExistsError:
            raise DestinationExists(str(path)) from None
    finally:
        os.unlink(tmp)


def load_key(path: Path) -> SigningKey:
    """A private key file, refused (one line) if missing, not a regular file, readable or
    writable by group or others, or not an unencrypted ECDSA P-256 PEM key."""
    _, serialization, ec = _crypto()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidInput(f"no such key file: {path}") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"key file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise InvalidInput(f"key file {path} is accessible by group or others (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); run 'chmod 600 {path}'")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read key file {path}: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise InvalidInput(f"key file {path} is not an unencrypted PEM private key "
                           "(make one with 'nscas key new')") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise InvalidInput(f"key file {path} is not an ECDSA P-256 key")
    public = key.public_key()
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return SigningKey(path=path, private=key, public_pem=pem, keyid=keyid_of(public))


def configured_key(option: Path | None) -> SigningKey | None:
    """The key ``nscas run`` signs with: ``--sign-key``, else ``$NSCAS_SIGNING_KEY``, else none
    (there is no store configuration file)."""
    if option is not None:
        return load_key(option)
    env = os.environ.get(KEY_ENV)
    return load_key(Path(env)) if env else None


def statement(receipt: Digest, data: bytes) -> dict[str, Any]:
    """The in-toto Statement v1 a receipt's signature signs."""
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": str(receipt),
                         "digest": {"blake3": receipt.hex,
                                    "sha256": hashlib.sha256(data).hexdigest()}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {"kind": "receipt/1"}}


def signature_record(key: SigningKey, receipt: Digest, data: bytes) -> dict[str, Any]:
    """The ``signature/1`` record of ``receipt`` (whose bytes are ``data``) signed by ``key``."""
    hashes, _, ec = _crypto()
    payload = rfc8785.dumps(statement(receipt, data))
    sig = key.private.sign(pae(PAYLOAD_TYPE, payload),
                           ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    return {"nscas": KIND, "receipt": str(receipt), "public_key": key.public_pem,
            "envelope": {"payloadType": PAYLOAD_TYPE,
                         "payload": base64.b64encode(payload).decode(),
                         "signatures": [{"keyid": key.keyid,
                                         "sig": base64.b64encode(sig).decode()}]}}


@dataclass(frozen=True, slots=True)
class KeySigner:
    """Signs receipts with one key (a ``ReceiptSigner``)."""

    key: SigningKey

    def sign(self, store: ObjectStore, receipt: Digest) -> Digest:
        info = store.info(receipt)
        if info.kind != "receipt/1":
            raise InvalidInput(f"{receipt} is {'a ' + info.kind if info.kind else 'a blob'}, "
                               "not a receipt; sign a receipt or an output a run produced")
        return store.put_record(signature_record(self.key, receipt, store.get_bytes(receipt)))


def sign_model_dir(key_path: Path, model_dir: Path, signature: Path) -> None:
    """An OpenSSF Model Signing v1.0 signature of ``model_dir`` at ``signature``, made by the
    ``model-signing`` package with the private key file ``key_path`` (its own randomised
    ECDSA: the file differs from one signing to the next)."""
    try:
        from model_signing import signing as ms_signing
    except ImportError as exc:
        raise InvalidInput("--model-signing needs the 'model-signing' package (pip install "
                           f"'model-signing>=1.1,<1.2' pyopenssl): {exc}") from None
    load_key(key_path)  # the same refusals as every other use of a key file
    # The default hashing (every file, SHA-256, git files ignored): what the stock
    # ``model_signing verify key`` command hashes by default.
    ms_signing.Config().use_elliptic_key_signer(private_key=key_path).sign(model_dir, signature)


def signature_problem(record: dict[str, Any], receipt_data: bytes | None) -> str | None:
    """What is wrong with a schema-valid ``signature/1`` record (``nscas fsck``), or None: its
    statement must be about the receipt it links (whose bytes are ``receipt_data``; None if
    the store lacks them), its key id that of its public key, and every signature valid."""
    hashes, serialization, ec = _crypto()
    from cryptography.exceptions import InvalidSignature

    from nscas.objects.digests import Digest

    env = record["envelope"]
    if env["payloadType"] != PAYLOAD_TYPE:
        return f"payloadType is {env['payloadType']!r}, not {PAYLOAD_TYPE!r}"
    try:
        payload = base64.b64decode(env["payload"], validate=True)
        stated = json.loads(payload)
    except ValueError:
        return "the payload is not base64 of a JSON statement"
    if receipt_data is None:
        return f"the receipt it signs, {record['receipt']}, is absent"
    if stated != statement(Digest.parse(record["receipt"]), receipt_data):
        return f"its statement is not the one about receipt {record['receipt']}"
    try:
        public = serialization.load_pem_public_key(record["public_key"].encode())
    except (ValueError, TypeError):
        return "public_key is not a PEM public key"
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        return "public_key is not an ECDSA P-256 key"
    for sig in env["signatures"]:
        if sig["keyid"] != keyid_of(public):
            return f"keyid {sig['keyid']} is not the SHA-256 of its public key"
        try:
            public.verify(base64.b64decode(sig["sig"], validate=True),
                          pae(PAYLOAD_TYPE, payload), ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return f"the signature by key {sig['keyid'][:16]} does not verify"
    return None
