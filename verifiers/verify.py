"""``verify``: the whole independent verification of one target (SPEC 7).

TARGET is a receipt ID (or unique prefix of at least 8 hex digits), a ref name of the store,
or a bundle directory (its ``manifest.json`` names the target). The report holds, in order:
what TARGET resolved to (``target``), the bundle's own file checks (bundles only), the
integrity of the target's closure, every receipt of the closure with each claim recomputed,
every task set regenerated, and every checkpoint's parameter digest rebuilt. Nothing stops
at the first finding.

Exit codes (``exit_code``): 0 all checks hold; 1 a check failed (or, strict, was skipped);
3 cannot verify because objects are missing. Bad usage raises a ``VerifierError`` (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .bundle import bundle_checks
from .closure import MISSING_CHECK, Objects, Unusable, walk
from .errors import VerifierError
from .receipts import check_receipt
from .report import Check, Report
from .sources import (
    MANIFEST,
    BadTarget,
    BundleSource,
    Source,
    StoreSource,
    find_store_dir,
    is_bundle,
)
from .taskchecks import check_task_set
from .training import checkpoint_checks

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSING = 3


def open_target(target: str, *, store: Path | None) -> tuple[Source, str]:
    """The source to read and the target's full ID."""
    path = Path(target)
    if is_bundle(path):
        bundle = BundleSource(path)
        return bundle, bundle.target
    if path.is_dir():
        raise BadTarget(target, f"a directory without {MANIFEST} is not a bundle")
    source = StoreSource(find_store_dir(store))
    return source, source.resolve(target)


def verify(target: str, *, store: Path | None = None, strict: bool = False) -> Report:
    """Verify ``target`` read-only; every finding as a check. Raises ``VerifierError`` only
    for unusable input (exit 2) or a missing target (``MissingObject``, exit 3)."""
    source, oid = open_target(target, store=store)
    try:
        return _verify(source, target, oid, strict=strict)
    finally:
        if isinstance(source, StoreSource):
            source.close()


def _verify(source: Source, target: str, oid: str, *, strict: bool) -> Report:
    objects = Objects(source)
    # What TARGET named, first, so a reader sees what the rest is about.
    checks: list[Check] = [Check.passed("target", claimed=target, recomputed=oid,
                                        message=f"{objects.kind(oid) or 'blob'} in "
                                                f"{source.label}")]
    if isinstance(source, BundleSource):
        checks.extend(bundle_checks(source))
    closure, integrity = walk(objects, oid)
    checks.extend(integrity)
    if isinstance(source, BundleSource):
        checks.append(_unreached(source, closure.order))
    checkers: tuple[tuple[str, Checker], ...] = (
        ("receipt/1", check_receipt), ("tasks/1", check_task_set),
        ("checkpoint/1", checkpoint_checks))
    for kind, checker in checkers:
        for member in closure.of_kind(kind):
            checks.extend(_guarded(checker, objects, member))
    return Report.of(checks, strict=strict)


def _unreached(bundle: BundleSource, reached: tuple[str, ...]) -> Check:
    """A bundle holds the target's closure and nothing else: an object no link reaches is
    something the exporter never wrote (import refuses it too)."""
    stray = sorted(bundle.listed_ids() - set(reached))
    return Check.verdict("bundle.closure", not stray, claimed=len(bundle.listed_ids()),
                         recomputed=len(reached),
                         message=f"{len(stray)} object(s) in the manifest that the target does "
                                 f"not reach: {', '.join(stray[:3])}")


Checker = Callable[[Objects, str], list[Check]]


def _guarded(checker: Checker, objects: Objects, oid: str) -> list[Check]:
    """A checker's findings; content it cannot read at all is a finding too, not a crash."""
    name = f"{objects.kind(oid) or 'object'}".partition("/")[0] + f".{oid[7:15]}"
    try:
        return checker(objects, oid)
    except Unusable as exc:
        return [Check.skipped(name, f"{exc.object_id} is unusable: {exc.why}")]
    except VerifierError as exc:
        return [Check.failed(name, exc.message)]


def exit_code(report: Report) -> int:
    """SPEC 7 exit code of a finished report."""
    if report.ok:
        return EXIT_OK
    missing = any(c.name == MISSING_CHECK and c.status == "failed" for c in report.checks)
    return EXIT_MISSING if missing else EXIT_FAILED


def error_exit_code(error: VerifierError) -> int:
    """Exit code of an error raised instead of a report (2 bad input, 3 missing target)."""
    return error.exit_code if error.exit_code in (EXIT_MISSING, EXIT_FAILED) else EXIT_USAGE
