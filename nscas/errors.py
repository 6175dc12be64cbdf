"""One exception tree for the library; the CLI alone maps it to messages and exit codes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nscas.redacting import redact

if TYPE_CHECKING:
    from nscas.objects.digests import Digest


class NscasError(Exception):
    """Root of every error nscas raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        message = redact(message)  # a URL or key in any message never prints (nscas.redacting)
        super().__init__(message)
        self.message = message


class InvalidInput(NscasError):
    """The caller handed in something malformed (a bad ID, bad TOML, a bad record)."""


class InvalidDigest(InvalidInput):
    def __init__(self, text: str, why: str = "expected 'blake3:' followed by 64 lowercase hex digits") -> None:
        shown = text if len(text) <= 80 else text[:77] + "..."
        super().__init__(f"invalid object ID {shown!r}: {why}")
        self.text = text


class RecordError(InvalidInput):
    """A record is not canonical, not valid JSON, or violates the schema of its kind."""

    def __init__(self, message: str, *, kind: str | None = None, path: str | None = None) -> None:
        where = f" at {path}" if path else ""
        prefix = f"{kind} record" if kind else "record"
        super().__init__(f"{prefix}{where}: {message}")
        self.kind = kind
        self.path = path


class StrictJSONError(InvalidInput, ValueError):
    """Text is not strict JSON: not UTF-8, malformed, a repeated key, NaN/Infinity, too big or
    too deeply nested. A ValueError too, so parsers that catch ValueError keep working."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotFound(NscasError):
    """An object, ref or prefix that the store does not hold."""

    def __init__(self, what: str) -> None:
        super().__init__(f"not found: {what}")
        self.what = what


class AmbiguousPrefix(InvalidInput):
    def __init__(self, prefix: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:10]) + (" ..." if len(candidates) > 10 else "")
        super().__init__(f"ambiguous ID prefix {prefix!r} matches {len(candidates)} objects: {shown}")
        self.prefix = prefix
        self.candidates = candidates


class ClosureError(InvalidInput):
    """A record links to objects the store does not hold."""

    def __init__(self, missing: list[str]) -> None:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        super().__init__(f"record links to {len(missing)} object(s) the store does not hold: {shown}")
        self.missing = missing


class IntegrityError(NscasError):
    """Stored bytes do not hash to what they should: never hand out wrong bytes."""

    exit_code = 1

    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(f"corrupt data in {what}: expected {expected}, got {actual}")
        self.what = what
        self.expected = expected
        self.actual = actual


class DecodeBoundExceeded(IntegrityError):
    """A stored leaf decodes to more bytes than its record says: a corrupt or hostile chunk."""

    def __init__(self, oid: Digest, size: int, where: str) -> None:
        super().__init__(f"object {oid}", f"at most {size} bytes, as its record says",
                         f"more from {where}")
        self.oid = oid
        self.size = size
        self.where = where


class CodecError(IntegrityError):
    """A leaf's codec, base or chain breaks the limits of docs/format.md §5.5.1 (an unknown
    codec, a delta whose base is missing, of another size or named otherwise by its header, a
    chain too deep or cyclic, a plane stream of another length): refused before decoding."""

    exit_code = 2

    def __init__(self, oid: Digest, expected: str, actual: str, *,
                 problem: str = "bad-codec") -> None:
        super().__init__(f"object {oid}", expected, actual)
        self.oid = oid
        self.problem = problem
        """What fsck calls it: ``bad-base``, ``bad-chain``, ``bad-codec`` or ``size-mismatch``."""


class RefConflict(NscasError):
    """A compare-and-swap ref update found another value than expected."""

    def __init__(self, name: str, expected: str | None, actual: str | None) -> None:
        super().__init__(
            f"ref {name!r} is {actual or 'unset'}, not {expected or 'unset'} as expected; "
            "re-read it and retry"
        )
        self.name = name
        self.expected = expected
        self.actual = actual


class TagImmutable(NscasError):
    def __init__(self, name: str, current: str) -> None:
        super().__init__(f"tag {name!r} is already set to {current}; tags never move")
        self.name = name
        self.current = current


class StoreError(NscasError):
    """The store itself is missing, unreadable or of an unknown schema version."""


class ReadOnlyStore(StoreError):
    """A write was asked of a store on a read-only mount (or one this user may not write)."""

    def __init__(self, root: str) -> None:
        super().__init__(f"the store at {root} is read-only")
        self.root = root


class NoSpace(StoreError):
    """The filesystem holding ``path`` is full (ENOSPC, SQLITE_FULL)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no space left on device at {path}")
        self.path = path


class DamagedStore(StoreError):
    """The store's database lacks a table, column or trigger it must have, or is corrupt."""

    def __init__(self, root: str, problem: str) -> None:
        super().__init__(f"the store database at {root} is damaged ({problem}); run 'nscas fsck'")
        self.root = root
        self.problem = problem


class DestinationExists(InvalidInput):
    def __init__(self, path: str) -> None:
        super().__init__(f"destination {path} already exists; nscas never overwrites")
        self.path = path


class RecipeError(NscasError):
    """A recipe refused its inputs or params, or failed while running."""


class ConfigError(InvalidInput):
    """A recipe or pipeline file is malformed."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file
