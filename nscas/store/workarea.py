"""Work areas: the store-managed directories a recipe run may write outside the store's objects.

Only this module touches ``work/`` (docs/format.md §5.8). Each action that runs gets
``work/<action hex>/`` holding ``owner.json`` (the action, the owning process's pid, host and
start time, when it was claimed), ``area/`` (``RunContext.work_area``: kept across a crash, so a
run of the same action resumes from it) and ``scratch/`` (``RunContext.workdir``: emptied when a
run claims the area, removed when it ends). One live process holds an area at a time. Creating,
claiming and removing an area happen under an exclusive lock on ``work/.lock``, so ``gc`` never
removes an area a run is claiming, and an area appears whole (made in ``work/.tmp-*`` and renamed).

``work/shared/<object hex>/`` holds a tree/1 materialised once, read-only, for every run that
reads it from a file path (``shared_tree``: a train's seed checkpoint), so that runs of one
seed at once hold one copy, not one each. ``users/`` names the actions that asked for it; it
goes when none of their areas is left (``release``, ``collect``), or when the last of them is
done with it (``unshare``: a train, once its ranks have loaded the seed).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from nscas.errors import StoreError
from nscas.objects.digests import Digest
from nscas.objects.durable import fsync_dir

WORK_DIR = "work"
OWNER_FILE = "owner.json"
SHARED_DIR = "shared"
_LOCK = ".lock"
_PENDING = (".tmp-", ".trash-")  # an area being made, an area being removed


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """Who holds an area: ``pid`` is ``None`` once the run that held it ended (area kept)."""

    action: Digest
    pid: int | None
    host: str
    process_start: int | None  # the process's start time in clock ticks (Linux), against pid reuse
    claimed: str  # ISO 8601 UTC, as a receipt's ``started``

    def to_json(self) -> dict[str, object]:
        return {"action": str(self.action), "pid": self.pid, "host": self.host,
                "process_start": self.process_start, "claimed": self.claimed}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkArea:
    """A claimed area: ``persistent`` survives a crash, ``scratch`` is this run's only."""

    action: Digest
    root: Path

    @property
    def persistent(self) -> Path:
        return self.root / "area"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"


@dataclass(frozen=True, slots=True, kw_only=True)
class AreaVerdict:
    """What ``gc`` did (or would do) with one area, and why."""

    path: Path
    action: Digest | None
    removed: bool
    reason: str  # "succeeded", "process-gone", "unowned", "incomplete", "alive", "other-host"


class WorkAreaBusy(StoreError):
    """Another live process holds the work area of this action."""

    def __init__(self, action: Digest, owner: Owner) -> None:
        super().__init__(f"the work area of action {action} is held by process {owner.pid} on "
                         f"{owner.host} (since {owner.claimed}); is that run still going?")
        self.action = action
        self.owner = owner


class WorkAreas:
    """The ``work/`` directory of one store."""

    def __init__(self, store_root: Path) -> None:
        self.dir = store_root / WORK_DIR

    def claim(self, action: Digest, *, action_claimed: bool = False) -> WorkArea:
        """Hold the area of ``action`` for this process: made if new, taken over if its last
        holder is gone, refused (``WorkAreaBusy``) if a live process holds it. Its scratch
        directory starts empty; what its persistent directory holds is kept.

        A holder on another host cannot be asked whether it lives, so its area is refused,
        unless ``action_claimed``: the caller holds the action's claim (nscas.store.claims),
        which that holder held while it ran and lost when it ended, so it has ended."""
        area = WorkArea(action=action, root=self.dir / action.hex)
        with self._locked():
            if area.root.is_dir():
                owner = read_owner(area.root)
                if owner is not None and owner.pid is not None and (
                        is_alive(owner) or (owner.host != _HOST and not action_claimed)):
                    raise WorkAreaBusy(action, owner)
                _write_owner(area.root, _me(action))
            else:
                fresh = self.dir / f"{_PENDING[0]}{secrets.token_hex(8)}"
                fresh.mkdir()
                (fresh / "area").mkdir()
                _write_owner(fresh, _me(action))
                os.rename(fresh, area.root)
                fsync_dir(self.dir)
        shutil.rmtree(area.scratch, ignore_errors=True)
        area.scratch.mkdir()
        area.persistent.mkdir(exist_ok=True)
        return area

    def release(self, area: WorkArea, *, keep: bool) -> None:
        """End this process's hold: the scratch directory goes; with ``keep`` the persistent
        directory stays for a later run of the action, otherwise the whole area goes."""
        shutil.rmtree(area.scratch, ignore_errors=True)
        with self._locked():
            owner = read_owner(area.root)
            if owner is None or owner.pid != os.getpid():
                return  # gc removed it (its action succeeded), or another run took it over
            if keep:
                _write_owner(area.root, Owner(action=area.action, pid=None, host=_HOST,
                                              process_start=None, claimed=owner.claimed))
                return
            self._remove(area.root)
            self._drop_unused_shared()

    def shared_tree(self, area: WorkArea, tree: Digest, fill: Callable[[Path], None]) -> Path:
        """The directory of the tree/1 ``tree``, materialised once (``fill`` writes it into a
        new directory) and shared read-only by the runs that ask for it; ``area``'s action is
        recorded as a user, so it stays while that area does."""
        shared = self.dir / SHARED_DIR / tree.hex
        with self._locked():
            (shared / "users").mkdir(parents=True, exist_ok=True)
            (shared / "users" / area.action.hex).touch()
        done = shared / "tree"
        fd = os.open(shared / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one run fills it; the others wait, then read it
            if not done.is_dir():
                fresh = shared / f"{_PENDING[0]}{secrets.token_hex(8)}"
                shutil.rmtree(fresh, ignore_errors=True)
                fill(fresh)
                for path in fresh.rglob("*"):
                    if path.is_file():
                        path.chmod(0o444)
                os.rename(fresh, done)
                fsync_dir(shared)
        finally:
            os.close(fd)
        return done

    def unshare(self, area: WorkArea, tree: Digest) -> None:
        """``area``'s action is done with the shared tree ``tree``: it is no longer a user, and
        the tree goes if no other user with an area is left (a later ``shared_tree`` makes it
        again)."""
        with self._locked():
            (self.dir / SHARED_DIR / tree.hex / "users" / area.action.hex).unlink(missing_ok=True)
            self._drop_unused_shared()

    def _drop_unused_shared(self) -> None:
        """Remove each shared tree none of whose users has an area left (under the lock)."""
        root = self.dir / SHARED_DIR
        if not root.is_dir():
            return
        for shared in sorted(root.iterdir()):
            users = shared / "users"
            names = [u.name for u in users.iterdir()] if users.is_dir() else []
            if not any((self.dir / name).is_dir() for name in names):
                trash = self.dir / f"{_PENDING[1]}{secrets.token_hex(8)}"
                os.rename(shared, trash)
                shutil.rmtree(trash, ignore_errors=True)
        if not any(root.iterdir()):
            root.rmdir()

    def collect(self, succeeded_since: Callable[[Digest, str], bool], *,
                dry_run: bool = False) -> list[AreaVerdict]:
        """Remove every area whose action has a succeeded receipt that finished after the area
        was claimed, or whose holder is gone (ended, or a dead process on this host); keep
        those a live process holds, or a process on another host (it cannot be asked)."""
        if not self.dir.is_dir():
            return []
        out: list[AreaVerdict] = []
        with nullcontext() if dry_run else self._locked():  # a dry run writes nothing, not even the lock
            for path in sorted(self.dir.iterdir()):
                if path.name in (_LOCK, SHARED_DIR):
                    continue
                verdict = _judge(path, succeeded_since)
                if verdict.removed and not dry_run:
                    self._remove(path)
                out.append(verdict)
            if not dry_run:
                self._drop_unused_shared()
        return out

    def _remove(self, path: Path) -> None:
        # Renamed first, so a crash mid-removal leaves a .trash- directory, never half an area.
        trash = self.dir / f"{_PENDING[1]}{secrets.token_hex(8)}"
        os.rename(path, trash)
        fsync_dir(self.dir)
        shutil.rmtree(trash, ignore_errors=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(exist_ok=True)
        fd = os.open(self.dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def _judge(path: Path, succeeded_since: Callable[[Digest, str], bool]) -> AreaVerdict:
    if path.name.startswith(_PENDING) or not path.is_dir():
        # Made or removed under the lock, which gc holds: whoever left it is gone.
        return AreaVerdict(path=path, action=None, removed=True, reason="incomplete")
    owner = read_owner(path)
    if owner is None:
        return AreaVerdict(path=path, action=None, removed=True, reason="incomplete")
    if succeeded_since(owner.action, owner.claimed):
        return AreaVerdict(path=path, action=owner.action, removed=True, reason="succeeded")
    if owner.pid is None:
        return AreaVerdict(path=path, action=owner.action, removed=True, reason="unowned")
    if owner.host != _HOST:
        return AreaVerdict(path=path, action=owner.action, removed=False, reason="other-host")
    if is_alive(owner):
        return AreaVerdict(path=path, action=owner.action, removed=False, reason="alive")
    return AreaVerdict(path=path, action=owner.action, removed=True, reason="process-gone")


def read_owner(root: Path) -> Owner | None:
    """The owner file of an area, or ``None`` if it is missing or unreadable."""
    try:
        raw = json.loads((root / OWNER_FILE).read_text(encoding="utf-8"))
        return Owner(action=Digest.parse(raw["action"]), pid=raw["pid"], host=raw["host"],
                     process_start=raw["process_start"], claimed=raw["claimed"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_alive(owner: Owner) -> bool:
    """Whether the owner's process still runs on this host (the same process, not a reused pid)."""
    if owner.pid is None or owner.host != _HOST:
        return False
    start = process_start(owner.pid)
    if start is not None:
        return owner.process_start is None or start == owner.process_start
    if Path("/proc/self/stat").exists():
        return False  # /proc works here and has no such (live) process
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot (Linux ``/proc``), else ``None``
    (no such process, a zombie, or no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


_HOST = platform.node()


def _me(action: Digest) -> Owner:
    return Owner(action=action, pid=os.getpid(), host=_HOST, process_start=process_start(os.getpid()),
                 claimed=datetime.now(UTC).isoformat(timespec="microseconds"))


def _write_owner(root: Path, owner: Owner) -> None:
    tmp = root / f"{OWNER_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, (json.dumps(owner.to_json(), sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, root / OWNER_FILE)
    fsync_dir(root)
