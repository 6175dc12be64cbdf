"""``verify``: the whole independent verification of one target (docs/format.md §7).

TARGET is a receipt ID (or unique prefix of at least 8 hex digits), a ref name of the store,
or a bundle directory (its ``manifest.json`` names the target). What is verified is always a
receipt, known by its bytes: when TARGET names an object a receipt produced (an output ref),
the earliest succeeded receipt naming it as an output is verified instead, and an object no
receipt produced has no evidence (exit 3). The report holds, in order: the verified receipt
(``target``), the ``--expect`` pin if given, the bundle's own file checks (bundles only), the
integrity of the target's closure, every receipt of the closure with each claim recomputed,
every task set regenerated, and every checkpoint's parameter digest rebuilt. Nothing stops
at the first finding.

Exit codes (``exit_code``): 0 all checks hold; 1 a check failed (or, strict, was skipped);
3 cannot verify because objects are missing. Bad usage raises a ``VerifierError`` (exit 2).
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

from .bundle.files import bundle_checks
from .bundle.layoutcheck import layout_checks
from .bundle.loading import loader_checks
from .bundle.source import MANIFEST, BundleSource, is_bundle
from .core.errors import VerifierCrash, VerifierError
from .core.results import SELF_REPORTED, Check, Report
from .evaluation.ordering import parse_time
from .receipts import check_receipt
from .records.closure import MISSING_CHECK, Objects, Unusable, walk
from .records.objects import is_object_id
from .records.sources import BadTarget, Source
from .records.store import StoreSource, find_store_dir, open_store_source
from .replay.options import ReplayOptions
from .replay.receipts import replay_receipts
from .signatures.checks import TrustedKey, signature_checks, signer_lines
from .tasks.tasksets import check_task_set
from .training.checkpoints import checkpoint_checks

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSING = 3


class NoEvidence(VerifierError):
    """TARGET is an object no receipt produced: there is no evidence to verify (exit 3)."""

    exit_code = EXIT_MISSING

    def __init__(self, oid: str, kind: str | None, where: str) -> None:
        super().__init__(f"cannot verify {oid}: it is {'a ' + kind if kind else 'a blob'} that "
                         f"no succeeded receipt in {where} names as an output, so there is no "
                         "evidence to recheck")
        self.object_id = oid


class BadExpect(VerifierError):
    """``--expect`` is neither a full object ID nor a SHA-256 hex digest (exit 2)."""

    def __init__(self, value: str, why: str) -> None:
        super().__init__(f"--expect {value!r}: {why}")


def open_target(target: str, *, store: Path | None) -> tuple[Source, str]:
    """The source to read and the full ID of the object TARGET names."""
    path = Path(target)
    try:
        bundle_dir, directory = is_bundle(path), path.is_dir()
    except (OSError, ValueError) as exc:  # a name too long, a NUL: no such path can exist
        raise BadTarget(target[:80], f"not usable as a path ({exc})") from None
    if bundle_dir:
        bundle = BundleSource(path)
        return bundle, bundle.target
    if directory:
        raise BadTarget(target, f"a directory without {MANIFEST} is not a bundle")
    source = open_store_source(find_store_dir(store))
    return source, source.resolve(target)


def verify(target: str, *, store: Path | None = None, strict: bool = False,
           expect: str | None = None, progress: Progress | None = None,
           trust: tuple[TrustedKey, ...] | None = None,
           replay: ReplayOptions | None = None) -> Report:
    """Verify ``target`` read-only; every finding as a check. Raises ``VerifierError`` only
    for unusable input (exit 2), a missing target (``MissingObject``, exit 3) or a target no
    receipt produced (``NoEvidence``, exit 3).

    ``progress``: called with each check as soon as it is made, in report order (the report
    holds the same checks); nothing else is reported through it. ``trust``
    (``signatures.load_trusted``): every receipt of the closure must be signed by one of
    those keys. ``replay``: also rerun the model on a sample of every evaluation's answers
    and its retention probes (``replay.py``), and K training updates after each published
    optimizer state (``replay/training.py``, docs/format.md §7.8)."""
    pin = _parse_expect(expect)
    try:
        source, oid = open_target(target, store=store)
        try:
            return _verify(source, oid, strict=strict, pin=pin, progress=progress,
                           trust=trust, replay=replay)
        finally:
            if isinstance(source, StoreSource):
                source.close()
    except VerifierError:
        raise
    except Exception as exc:  # a bug of the verifier: never a verdict, always one line
        raise VerifierCrash(exc, _where(exc)) from exc


def _where(error: BaseException) -> str:
    """``module.py:line`` of the innermost frame of ``error``'s traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _parse_expect(expect: str | None) -> str | None:
    if expect is None:
        return None
    if is_object_id(expect) or _SHA256.fullmatch(expect):
        return expect
    raise BadExpect(expect, "expected a full object ID (blake3: and 64 lowercase hex digits) "
                            "or the 64-hex SHA-256 of a published SHA256SUMS file")


_SHA256 = re.compile(r"[0-9a-f]{64}")


def producing_receipt(objects: Objects, oid: str) -> str | None:
    """The earliest succeeded receipt (by its ``started`` time, then ID: the rule by which the
    cache picks, docs/format.md §6.5) that names ``oid`` among its outputs, judged by the
    receipts' bytes."""
    found = []
    for parent in objects.source.parents(oid) or []:
        if objects.kind(parent) != "receipt/1":
            continue
        try:
            receipt = objects.record(parent)
        except Unusable:
            continue
        if receipt.get("status") == "succeeded" and oid in receipt["outputs"].values():
            started = parse_time(receipt.get("started"))
            found.append((started if started is not None else float("inf"), parent))
    return min(found)[1] if found else None


Progress = Callable[[Check], None]
"""Told of each check as it is made (``verify(progress=...)``)."""


class _Checks(list[Check]):
    """The report's checks so far, each told to ``progress`` as it is added."""

    def __init__(self, progress: Progress | None) -> None:
        super().__init__()
        self._progress = progress

    def append(self, check: Check) -> None:
        super().append(check)
        if self._progress is not None:
            self._progress(check)

    def extend(self, checks: Iterable[Check]) -> None:
        for check in checks:
            self.append(check)


def _verify(source: Source, oid: str, *, strict: bool, pin: str | None,
            progress: Progress | None = None,
            trust: tuple[TrustedKey, ...] | None = None,
            replay: ReplayOptions | None = None) -> Report:
    objects = Objects(source)
    named: str | None = None
    kind = objects.kind(oid)
    if kind != "receipt/1":
        producer = producing_receipt(objects, oid)
        if producer is None:
            raise NoEvidence(oid, kind, source.label)
        named, oid = oid, producer
    # What is verified, first, so a reader sees what the rest is about.
    what = f"receipt in {source.label}" + (
        f", the earliest succeeded one that output {named}" if named else "")
    checks = _Checks(progress)
    checks.append(Check.passed("target", recomputed=oid, message=what))
    if pin is not None:
        checks.append(_expect_check(objects, pin, oid))
    if isinstance(source, BundleSource):
        checks.extend(bundle_checks(source))
    closure, integrity = walk(objects, oid)
    checks.extend(integrity)
    signed = signature_checks(objects, closure, trust)
    if isinstance(source, BundleSource):
        checks.append(_unreached(source, {*closure.order, *([named] if named else []),
                                          *signed.seen}))
        checks.extend(layout_checks(source, objects, closure, signed.seen))
    checks.extend(signed.checks)
    checkers: tuple[tuple[str, Checker], ...] = (
        ("receipt/1", check_receipt), ("tasks/1", check_task_set),
        ("checkpoint/1", checkpoint_checks))
    for kind, checker in checkers:
        for member in closure.of_kind(kind):
            checks.extend(_guarded(checker, objects, member))
    checks.extend(loader_checks(objects, closure))
    final: list[Check] = checks
    if replay is not None:
        replayed = replay_receipts(objects, list(closure.of_kind("receipt/1")), replay)
        checks.extend(replayed)
        # A retention loss the replay recomputed is no longer "not rechecked".
        covered = {c.name.removesuffix(".replay.retention") + ".retention.losses"
                   for c in replayed
                   if c.name.endswith(".replay.retention") and c.status != "skipped"}
        final = [c for c in checks if not (c.status == "skipped" and c.name in covered)]
    return Report.of(final, strict=strict, target=oid, named=named,
                     self_reported=SELF_REPORTED, signers=signer_lines(signed.signers))


def _expect_check(objects: Objects, pin: str, oid: str) -> Check:
    """``--expect``: the pinned ID is the verified receipt, or an output the verified receipt
    itself produced (a member of its ``outputs``, the receipt succeeded); or the pinned
    SHA-256 is that of the bundle's SHA256SUMS file. Anything else fails, saying what the pin
    names."""
    source = objects.source
    if is_object_id(pin):
        return _pinned_id(objects, pin, oid)
    if not isinstance(source, BundleSource):
        return Check.failed("expect", "a SHA-256 pin names a published SHA256SUMS file, and "
                            "only a bundle has one; pin a store target by its full ID",
                            claimed=pin)
    digest = source.sums_sha256()
    return Check.verdict("expect", digest == pin, claimed=pin, recomputed=digest,
                         message="the bundle's SHA256SUMS is not the pinned one: this is not "
                                 "the bundle that was published")


def _pinned_id(objects: Objects, pin: str, oid: str) -> Check:
    if pin == oid:
        return Check.passed("expect", claimed=pin, recomputed=oid,
                            message="the pin is the verified receipt")
    try:
        receipt = objects.record(oid)
    except Unusable:
        receipt = {}
    outputs = receipt.get("outputs")
    if not isinstance(outputs, dict):
        outputs = {}
    produced = sorted(name for name, value in outputs.items() if value == pin)
    if produced and receipt.get("status") == "succeeded":
        return Check.passed("expect", claimed=pin, recomputed=oid,
                            message=f"the pin is output {produced[0]!r} of the verified receipt")
    if produced:
        what = f"output {produced[0]!r} of the verified receipt, which did not succeed"
    else:
        what = _what_pin_names(objects, pin)
    return Check.failed("expect", f"the pin names {what}; it must be the verified receipt "
                        f"{oid} or an output that receipt produced: this is not the evidence "
                        "that was published", claimed=pin, recomputed=oid)


def _what_pin_names(objects: Objects, pin: str) -> str:
    """The pinned object as a reader would want it named: its kind, and how it relates to
    the verified evidence."""
    try:
        meta = objects.source.meta(pin)
    except VerifierError:
        meta = None
    if meta is None:
        return f"{pin}, which is not in {objects.source.label}"
    kind = objects.kind(pin) if objects.state(pin).problem is None else meta.kind
    article = f"{'a ' + kind if kind else 'a blob'} {pin}"
    if kind == "receipt/1":
        return f"another receipt, {pin}"
    return f"{article}, which the verified receipt does not name among its outputs"


def _unreached(bundle: BundleSource, reached: set[str]) -> Check:
    """A bundle holds the target's closure, and the signatures of its receipts, and nothing
    else: an object no link reaches is something the exporter never wrote (import refuses it
    too)."""
    stray = sorted(bundle.listed_ids() - reached)
    return Check.verdict("bundle.closure", not stray, claimed=len(bundle.listed_ids()),
                         recomputed=len(reached),
                         message=f"{len(stray)} object(s) in the manifest that the target does "
                                 f"not reach: {', '.join(stray[:3])}")


Checker = Callable[[Objects, str], list[Check]]


def _guarded(checker: Checker, objects: Objects, oid: str) -> list[Check]:
    """A checker's findings; content it cannot read at all is a failed check, not a crash
    (skipped only when what it lacks is an omitted weight)."""
    name = f"{objects.kind(oid) or 'object'}".partition("/")[0] + f".{oid[7:15]}"
    try:
        return checker(objects, oid)
    except Unusable as exc:
        why = f"{exc.object_id} is unusable: {exc.why}"
        if exc.needs is not None:
            return [Check.skipped(name, why, needs=exc.needs)]
        return [Check.failed(name, why)]
    except VerifierError as exc:
        return [Check.failed(name, exc.message)]


def exit_code(report: Report) -> int:
    """docs/format.md §7 exit code of a finished report: 3 when objects are missing; but a bundle whose
    manifest is malformed (an entry of the wrong type hides its object) has failed a check,
    which is 1, not a reason to say it cannot be verified."""
    if report.ok:
        return EXIT_OK
    failed = {c.name for c in report.checks if c.status == "failed"}
    return (EXIT_MISSING if MISSING_CHECK in failed and "bundle.manifest" not in failed
            else EXIT_FAILED)


def error_exit_code(error: VerifierError) -> int:
    """Exit code of an error raised instead of a report (2 bad input, 3 missing target)."""
    return error.exit_code if error.exit_code in (EXIT_MISSING, EXIT_FAILED) else EXIT_USAGE
