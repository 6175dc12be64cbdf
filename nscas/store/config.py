"""A store's config file, ``store.toml``: where a team store keeps its metadata and its data.

A store directory holds either ``nscas.db`` (SQLite, chunk files in ``data/``) or ``store.toml``
naming a PostgreSQL database and an object location (an S3 prefix or a shared directory); the
directory itself keeps what is this machine's own: work areas (docs/format.md §5.8) and, for a
local object directory, its temporary files. The standard library only: readers start here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from nscas.errors import ConfigError, InvalidInput
from nscas.redacting import redact
from nscas.store.locating import CONFIG_NAME

_KEYS = {"database", "objects", "s3"}
_S3_KEYS = {"endpoint_url", "region", "access_key_id", "secret_access_key"}


class S3Settings(NamedTuple):
    """Where an S3-compatible service is and how to sign in; any field left out comes from the
    usual AWS environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...)."""

    endpoint_url: str | None = None
    """The service's URL (MinIO, Ceph, moto); None: AWS itself or ``AWS_ENDPOINT_URL``."""
    region: str | None = None
    """The region to sign for; None: ``AWS_DEFAULT_REGION``, else ``us-east-1``."""
    access_key_id: str | None = None
    secret_access_key: str | None = None


class StoreConfig(NamedTuple):
    """What ``store.toml`` says: the database URL and where object data lives."""

    database: str
    """``postgresql://user:password@host:port/dbname`` (libpq's URL form)."""
    objects: str
    """``s3://bucket/prefix``, or an absolute directory (a cluster filesystem)."""
    s3: S3Settings = S3Settings()


def check_database_url(url: str) -> str:
    """A PostgreSQL URL as given; anything else is refused in one line."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not (parts.hostname or parts.path.strip("/")
                                                              or "host=" in parts.query):
        raise InvalidInput(f"invalid database URL {redact(url)!r}: expected "
                           "postgresql://user:password@host:port/dbname")
    if parts.netloc.count("@") > 1:  # libpq would read the rest of the password as a host name
        raise InvalidInput(f"invalid database URL {redact(url)!r}: an '@' in the user name or "
                           "password must be written %40")
    return url


def check_objects_url(url: str) -> str:
    """An ``s3://bucket/prefix`` URL or an absolute directory, as given."""
    if url.startswith("s3://"):
        bucket = urlsplit(url).netloc
        if not bucket or "/" in bucket:
            raise InvalidInput(f"invalid object storage URL {redact(url)!r}: expected s3://bucket/prefix")
        return url.rstrip("/")
    if "://" in url or not os.path.isabs(url):
        raise InvalidInput(f"invalid object storage location {redact(url)!r}: expected s3://bucket/prefix "
                           "or an absolute directory")
    return url


def read_config(root: Path) -> StoreConfig | None:
    """The config of the store directory ``root``, or None for an SQLite store."""
    path = root / CONFIG_NAME
    if not path.is_file():
        return None
    return parse_config(path)


def parse_config(path: Path) -> StoreConfig:
    import tomllib  # only a team store has a config: an SQLite store's reads skip its 4 ms

    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, f"cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, f"not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(where, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    for key in ("database", "objects"):
        if not isinstance(raw.get(key), str):
            raise ConfigError(where, f"{key!r} must be a string")
    s3 = raw.get("s3", {})
    if not isinstance(s3, dict):
        raise ConfigError(where, "'s3' must be a table")
    bad = sorted(set(s3) - _S3_KEYS)
    if bad:
        raise ConfigError(where, f"unknown key 's3.{bad[0]}' (known: {', '.join(sorted(_S3_KEYS))})")
    if any(not isinstance(v, str) for v in s3.values()):
        raise ConfigError(where, "every 's3' value must be a string")
    try:
        return StoreConfig(database=check_database_url(raw["database"]),
                           objects=check_objects_url(raw["objects"]), s3=S3Settings(**s3))
    except InvalidInput as exc:
        raise ConfigError(where, exc.message) from None


def render_config(config: StoreConfig) -> str:
    """The TOML text of ``config`` (what ``nscas init --database`` writes)."""
    lines = ["# An nscas team store: metadata in PostgreSQL, object data in `objects`.",
             f"database = {toml_string(config.database)}",
             f"objects = {toml_string(config.objects)}"]
    s3 = {k: getattr(config.s3, k) for k in sorted(_S3_KEYS) if getattr(config.s3, k)}
    if s3:
        lines += ["", "[s3]", *(f"{k} = {toml_string(v)}" for k, v in s3.items())]
    return "\n".join(lines) + "\n"


def toml_string(value: str) -> str:
    """A TOML basic string holding ``value`` (JSON's escapes, non-ASCII as it is, are TOML's)."""
    import json  # only writing a config needs it: reading one is on every team read's path

    return json.dumps(value, ensure_ascii=False)
