"""Leaf objects' bytes on S3-compatible object storage (``s3://bucket/prefix``), through boto3.

Keys mirror a store's directories: ``<prefix>/data/<2 hex>/<62 hex>`` and ``<prefix>/tmp/...``.
A write goes to a temporary key with its MD5 (the service refuses bytes that arrive otherwise,
and its ETag must echo it), is then copied to its final key on the service (no second upload)
and the temporary key deleted: a reader sees a complete object or none. What is uploaded is
checked against the ID first; every read re-hashes what it returns.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

import blake3

from nscas.errors import IntegrityError, StoreError
from nscas.objects.codecs import Base
from nscas.objects.decoding import check_plain, decode, decode_stream, plain_digest, read_capped
from nscas.objects.digests import Digest, is_hex_id
from nscas.store.config import S3Settings

_T = TypeVar("_T")
_POOL = 16  # connections: the put pipeline writes from several threads


def client(settings: S3Settings) -> Any:
    """A boto3 S3 client for ``settings`` (fields left out: the AWS environment variables);
    Any, because boto3 ships no types."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=settings.endpoint_url, region_name=settings.region or None,
        aws_access_key_id=settings.access_key_id, aws_secret_access_key=settings.secret_access_key,
        config=Config(max_pool_connections=_POOL, retries={"max_attempts": 3, "mode": "standard"},
                      connect_timeout=10, read_timeout=60))


class S3Chunks:
    """The ``data/`` and ``tmp/`` of a store under an S3 prefix (a :class:`ChunkBackend`)."""

    def __init__(self, url: str, settings: S3Settings) -> None:
        parts = urlsplit(url)
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self._settings = settings
        self._made: Any = None  # the boto3 client, made on first use (see _client)
        self._mtimes: dict[str, float] = {}  # last listing's LastModified by key
        self._lock = threading.Lock()

    @property
    def _client(self) -> Any:
        """The boto3 client, made when first needed: importing boto3 and building a client
        takes about 0.5 s, which a command that reads only metadata (log, lineage) never pays."""
        if self._made is None:
            with self._lock:
                if self._made is None:
                    self._made = client(self._settings)
        return self._made

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def key(self, oid: Digest) -> str:
        return self._key("data", oid.hex[:2], oid.hex[2:])

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            raise _S3Missing(code) if code in ("NoSuchKey", "404", "NotFound") else StoreError(
                f"object storage {self.url} refused {what}: {code or exc}") from None
        except BotoCoreError as exc:
            raise StoreError(f"cannot reach object storage {self.url} ({what}): {exc}") from None

    def ensure(self) -> None:
        """Check that the bucket is there and these credentials may use it."""
        try:
            self._call("a bucket check", lambda: self._client.head_bucket(Bucket=self.bucket))
        except _S3Missing:
            raise StoreError(f"object storage {self.url}: no bucket {self.bucket!r}") from None

    def exists(self, oid: Digest) -> bool:
        return self.stored_size(oid) is not None

    def stored_size(self, oid: Digest) -> int | None:
        try:
            head = self._call("a lookup", lambda: self._client.head_object(
                Bucket=self.bucket, Key=self.key(oid)))
        except _S3Missing:
            return None
        return int(head["ContentLength"])

    def location(self, oid: Digest) -> str:
        return f"chunk object s3://{self.bucket}/{self.key(oid)}"

    def write(self, oid: Digest, stored: bytes | memoryview, codec: str, *, size: int,
              written: Callable[[], object] = lambda: None, sha256: bool = True,
              base: Base | None = None) -> str | None:
        """Check, upload to a temporary key (MD5-verified), copy to the final key, delete the
        temporary one. Returns the plain bytes' SHA-256 (None without ``sha256``)."""
        import hashlib  # here: opening a team store for reading loads neither (4 ms)
        import uuid

        body = bytes(stored)
        written()
        plain = decode(body, codec, oid, size, base=base)
        got = blake3.blake3(plain).hexdigest()
        if got != oid.hex:
            raise IntegrityError(f"chunk written for {oid}", str(oid), f"blake3:{got}")
        sha = hashlib.sha256(plain).hexdigest() if sha256 else None
        md5 = hashlib.md5(body, usedforsecurity=False)
        tmp = self._key("tmp", f"{oid.hex[:16]}.{uuid.uuid4().hex}")
        try:
            put = self._call("an upload", lambda: self._client.put_object(
                Bucket=self.bucket, Key=tmp, Body=body,
                ContentMD5=base64.b64encode(md5.digest()).decode()))
            if put["ETag"].strip('"') != md5.hexdigest():
                raise IntegrityError(f"chunk uploaded for {oid}", md5.hexdigest(),
                                     put["ETag"])
            self._call("a copy", lambda: self._client.copy_object(
                Bucket=self.bucket, Key=self.key(oid),
                CopySource={"Bucket": self.bucket, "Key": tmp}))
        finally:
            # Should the delete fail, gc removes temporary keys older than its minimum age.
            with contextlib.suppress(StoreError, _S3Missing):
                self._call("a delete", lambda: self._client.delete_object(Bucket=self.bucket, Key=tmp))
        return sha

    def _get(self, oid: Digest) -> Any:
        """The chunk object's body, a stream: its bytes are read as they are decoded."""
        try:
            got = self._call("a read", lambda: self._client.get_object(
                Bucket=self.bucket, Key=self.key(oid)))
        except _S3Missing:
            raise IntegrityError(f"object {oid}", str(oid),
                                 f"no {self.location(oid)}") from None
        return got["Body"]

    def read(self, oid: Digest, codec: str, size: int, *, base: Base | None = None) -> bytes:
        with contextlib.closing(self._get(oid)) as body:
            data = self._reading(lambda: decode_stream(body, codec, oid, size,
                                                       where=self.location(oid), base=base))
        check_plain(data, oid, base)
        return data

    def read_stored(self, oid: Digest, size: int) -> bytes:
        with contextlib.closing(self._get(oid)) as body:
            return self._reading(lambda: read_capped(body, oid, size, where=self.location(oid)))

    def verify(self, oid: Digest, codec: str, size: int, *,
               base: Base | None = None) -> tuple[Digest, int]:
        with contextlib.closing(self._get(oid)) as body:
            return self._reading(lambda: plain_digest(body, codec, oid, size,
                                                      where=self.location(oid), base=base))

    def _reading(self, fn: Callable[[], _T]) -> _T:
        """``fn``, which reads a body: a connection lost part-way is the store's one-line error."""
        from botocore.exceptions import BotoCoreError

        try:
            return fn()
        except (BotoCoreError, OSError) as exc:
            raise StoreError(f"cannot reach object storage {self.url} (a read): {exc}") from None

    def _list(self, under: str) -> Iterator[tuple[str, float]]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(under) + "/")
        it = iter(pages)
        while True:
            page = self._call("a listing", lambda: next(it, None))
            if page is None:
                return
            for item in page.get("Contents", []):
                mtime = item["LastModified"].timestamp()
                with self._lock:
                    self._mtimes[item["Key"]] = mtime
                yield item["Key"], mtime

    def iter_ids(self) -> Iterator[Digest]:
        """The IDs chunk keys are named by; a key named otherwise is no chunk (left alone)."""
        base = self._key("data") + "/"
        for key, _ in self._list("data"):
            rest = key[len(base):]
            if len(rest) == 65 and rest[2] == "/" and is_hex_id(rest[:2] + rest[3:]):
                yield Digest(rest[:2] + rest[3:])

    def _modified(self, key: str) -> float | None:
        with self._lock:
            if key in self._mtimes:
                return self._mtimes[key]
        try:
            head = self._call("a lookup", lambda: self._client.head_object(Bucket=self.bucket, Key=key))
        except _S3Missing:
            return None
        modified: float = head["LastModified"].timestamp()
        return modified

    def chunk_written_before(self, oid: Digest, before: float) -> bool:
        mtime = self._modified(self.key(oid))
        return mtime is not None and mtime <= before

    def temporary_files(self) -> list[Path]:
        """Temporary keys (as paths relative to the bucket): uploads in progress or abandoned."""
        return sorted(Path(PurePosixPath(key)) for key, _ in self._list("tmp"))

    def written_before(self, path: Path, before: float) -> bool:
        mtime = self._modified(PurePosixPath(path).as_posix())
        return mtime is not None and mtime <= before

    def remove(self, oid: Digest, *, before: float | None = None) -> bool:
        return self._remove(self.key(oid), before)

    def remove_temporary(self, path: Path, *, before: float | None = None) -> bool:
        key = PurePosixPath(path).as_posix()
        if not key.startswith(self._key("tmp") + "/"):
            raise StoreError(f"{key} is not a temporary key of this store")
        return self._remove(key, before)

    def _remove(self, key: str, before: float | None) -> bool:
        if before is not None:
            mtime = self._modified(key)
            if mtime is None or mtime > before:
                return False
        self._call("a delete", lambda: self._client.delete_object(Bucket=self.bucket, Key=key))
        with self._lock:
            self._mtimes.pop(key, None)
        return True


class _S3Missing(Exception):
    """A key (or bucket) that is not there; callers turn it into what it means for them."""
