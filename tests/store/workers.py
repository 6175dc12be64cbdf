"""Subprocess entry points for the crash, concurrency and memory tests (real processes).

Run as ``python -m tests.store.workers COMMAND ...`` from the repository root. Each command
prints one JSON line on stdout; ``add`` first prints ``ready`` once the store is open, so the
parent can time a kill from the moment the put starts rather than from interpreter start-up.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from nscas.errors import RefConflict
from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.writer import Store


def add(store: Path, file: Path) -> None:
    s = open_store(store)
    print("ready", flush=True)
    oid = s.put_file(file)
    print(json.dumps({"id": str(oid)}), flush=True)


def _hwm() -> int:
    """Peak RSS of this process image (VmHWM, bytes).

    ``ru_maxrss`` survives execve on Linux, so in a child of a large pytest process it starts at
    the parent's size; VmHWM belongs to the address space that exec created.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_rss(store: Path, file: Path) -> None:
    """Peak resident memory (bytes) before and after putting ``file``."""
    s = open_store(store)
    before = _hwm()
    oid = s.put_file(file)
    print(json.dumps({"id": str(oid), "before": before, "after": _hwm(),
                      "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}),
          flush=True)


def increment(s: Store, name: str) -> int:
    """One compare-and-swap increment of a counter ref; returns the number of retries it took."""
    retries = 0
    while True:
        current = s.ref_get(name)
        n = int(s.get_bytes(current)) if current is not None else 0
        new = s.put_bytes(b"%d" % (n + 1))
        try:
            s.ref_set(name, new, expect=current, message=f"{n} -> {n + 1}")
            return retries
        except RefConflict:
            retries += 1


def counter(store: Path, name: str, times: int, tag: str, shared: Path, go: Path) -> None:
    """Increment ``name`` ``times`` times while also adding shared and own objects.

    Prints ``ready``, then waits for the file ``go`` so that both processes start together.
    """
    s = open_store(store)
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.001)
    retries = 0
    own = []
    for i in range(times):
        retries += increment(s, name)
        own.append(str(s.put_bytes(f"{tag} object {i}".encode() * (1 + i % 300))))
        s.put_bytes(b"shared object %d" % i)
        if i % 50 == 0:
            s.put_file(shared)
    print(json.dumps({"retries": retries, "own": own}), flush=True)


def hold_area(store: Path, action: str) -> None:
    """Claim the work area of ``action``, say where it is, and hold it until killed."""
    s = open_store(store)
    area = s.work_area(Digest.parse(action))
    (area.persistent / "progress").write_text("half done\n")
    print(json.dumps({"root": str(area.root)}), flush=True)
    while True:
        time.sleep(60)


COMMANDS = {"add": add, "peak-rss": peak_rss, "counter": counter, "hold-area": hold_area}

if __name__ == "__main__":
    command, *args = sys.argv[1:]
    fn = COMMANDS[command]
    if fn is hold_area:
        hold_area(Path(args[0]), args[1])
    elif fn is counter:
        counter(Path(args[0]), args[1], int(args[2]), args[3], Path(args[4]), Path(args[5]))
    else:
        fn(*(Path(a) for a in args))
