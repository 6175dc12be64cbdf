"""Putting bytes and files into the store: hashing, lookups and durable writes (docs/format.md §1, 5).

``Store.put_file`` hands a file here and gets back every row to insert, which it inserts in one
transaction once every chunk file is durable. A piece the store already holds costs one BLAKE3
pass and a lookup; only new bytes get their SHA-256, their codec (docs/format.md §5.5.2: the
smallest of the candidates a :class:`Hint` allows) and the durable write.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import blake3

from nscas.errors import StoreError
from nscas.objects import codecs
from nscas.objects.chunks import INLINE_MAX, ChunkBackend
from nscas.objects.codecs import Base
from nscas.objects.digests import Digest, Readable, sha256_hex
from nscas.objects.segments import Segment, split_ranges

# Pieces whose read buffers are in flight, each up to TENSOR_SPLIT bytes: this bounds memory.
WINDOW = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    """An object about to be stored: rows are inserted after every chunk file is durable."""

    hex: str
    size: int
    sha256: str | None  # None: a tensor object whose SHA-256 is left for later (format.md §1.2)
    storage: str  # "inline", "file" or "parts"
    codec: str = "raw"
    stored_size: int = 0
    data: bytes | None = None
    kind: str | None = None
    reused: bool = False  # already stored: its row must still be there when this put commits
    base: str | None = None  # the base leaf of a delta (codec xorW)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hint:
    """What the writer may try for a new piece (docs/format.md §5.5.2): its dtype's width
    (planes) and a stored leaf of its size to XOR it with."""

    width: int = 1
    base: Base | None = None


NO_HINT = Hint()

@dataclass(frozen=True, slots=True, kw_only=True)
class Assembly:
    """What storing a large file adds: its ID, every leaf and every whole, and the parts rows."""

    hex: str
    leaves: list[Leaf]
    part_rows: list[dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Putter:
    """The put pipeline, with what it needs of a store."""

    chunks: ChunkBackend
    lookup: Callable[[str], Leaf | None]
    """The stored object with this BLAKE3 hex, if it can be reused as it is."""
    hint: Callable[[Segment, int, int], Hint] = lambda seg, off, length: NO_HINT
    """What to try for the piece (offset, length) of a segment: its base and width."""

    def leaf(self, data: memoryview, hint: Hint = NO_HINT) -> Leaf:
        """Hash, look up, and only for new bytes compute SHA-256, encode and write durably."""
        return self._leaf(data, hint=hint)

    def segments(self, f: Readable, segments: list[Segment]) -> Assembly:
        """Stream ``f`` (at offset 0) cut into ``segments``: every piece a leaf, every tensor
        stored as several pieces and the file itself a whole of parts."""
        return _Pipeline(self, f).run(segments)

    def _leaf(self, data: memoryview, release: Callable[[], None] = lambda: None, *,
              lazy_sha256: bool = False, hint: Hint = NO_HINT) -> Leaf:
        # BLAKE3 comes first because it names the leaf: bytes the store already holds (most
        # tensors of a second checkpoint) then cost one hash pass and one lookup. One thread per
        # hash: the pipeline's own threads fill the cores. ``release`` says this task no longer
        # reads ``data``. With ``lazy_sha256`` (a piece of a tensor) a new chunk's SHA-256 is
        # left for later; an inline leaf's costs next to nothing and is always computed.
        try:
            hex_id = blake3.blake3(data).hexdigest()
            if len(data) <= INLINE_MAX:
                return Leaf(hex=hex_id, size=len(data), sha256=sha256_hex(data),
                            storage="inline", stored_size=len(data), data=bytes(data))
            known = self.lookup(hex_id)
            if known is not None:
                return known
            base = None
            if hint.base is not None and hint.base.id.hex != hex_id:
                plain = hint.base.load()  # checked against the base's ID
                base = Base(id=hint.base.id, load=lambda: plain)
            codec, stored = codecs.choose(data, w=hint.width,
                                          base=None if base is None else (base.id, base.load()))
            if not codecs.is_delta(codec):
                base = None
            # Once its bytes are in the temporary file the read buffer may take the next piece:
            # fsync and the re-read do not hold it up. The SHA-256, where wanted, comes from that
            # re-read (which checks the bytes against the ID, decoding a delta with its base).
            sha = self.chunks.write(Digest(hex_id), stored, codec, size=len(data), written=release,
                                    sha256=not lazy_sha256, base=base)
        finally:
            release()
        return Leaf(hex=hex_id, size=len(data), sha256=sha, storage="file", codec=codec,
                    stored_size=len(stored), base=None if base is None else base.id.hex)


class _Buffers:
    """Read buffers, handed out as they come back (not in turn: a piece being written may keep
    one while the others go round and keep the hashing chains fed).

    Reused rather than allocated per piece: a fresh 32 MiB bytes object per piece left freed
    memory in glibc's per-thread arenas, so peak RSS grew with thread timing.
    """

    def __init__(self, count: int) -> None:
        self._free = [bytearray() for _ in range(count)]
        self._cond = threading.Condition()

    def take(self, length: int) -> bytearray:
        with self._cond:
            while not self._free:
                self._cond.wait()
            buf = self._free.pop()  # the one given back last: most likely still in the cache
        return buf if len(buf) >= length else bytearray(length)

    def give(self, buf: bytearray) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify()


class _Piece:
    """A piece in flight: its bytes, given back to the buffers once every reader is done."""

    __slots__ = ("_buffers", "_lock", "_readers", "_slot", "view")

    def __init__(self, buffers: _Buffers, length: int) -> None:
        self._buffers = buffers
        self._slot = buffers.take(length)
        self.view = memoryview(self._slot)[:length]
        self._lock = threading.Lock()
        self._readers = 1  # the reading thread's, until every task is handed out

    def reader(self) -> Callable[[], None]:
        """Count one more reader of the buffer; it calls what this returns when done (again
        is harmless)."""
        with self._lock:
            self._readers += 1
        done = False

        def release() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
            self._release_one()
        return release

    def handed_out(self) -> None:
        """The reading thread has given the piece to every reader: its own count goes."""
        self._release_one()

    def _release_one(self) -> None:
        with self._lock:
            self._readers -= 1
            last = self._readers == 0
        if last:
            self._buffers.give(self._slot)


class _Pipeline:
    """One put of a large file: its threads, its read buffers and what is in flight.

    This thread reads piece after piece into one of ``WINDOW`` buffers. Each piece goes to the
    SHA-256 chain (the file's SHA-256, and a large new tensor's, in file order), to the BLAKE3
    chain (the file's ID, and a large tensor's) and to a worker that makes its leaf; its buffer
    is read into again once all of them are done with it.
    """

    # Why this shape: the file's SHA-256 is the longest chain of work that cannot be split
    # (0.6 s/GiB here), so whatever starves it sets the wall time of a put that finds most
    # pieces stored. With buffers reused strictly in turn and held until a new piece's write
    # was durable, one write (up to 40 ms for 16 MiB while the kernel found pages) held up
    # reading and the chain sat idle 0.3 s per GiB; now a buffer comes back once its bytes are
    # in the temporary file, to whichever piece is next. Keeping a core for the chain (a gate
    # on the other threads' steps) was tried and measured slower than the OS's own scheduling.

    def __init__(self, putter: Putter, f: Readable) -> None:
        self.putter = putter
        self.f = f
        self.cores = _cores()
        self.whole_b3 = blake3.blake3()
        self.whole_sha = hashlib.sha256()
        self.buffers = _Buffers(WINDOW)
        self.tasks: list[Future[Any]] = []

    def run(self, segments: list[Segment]) -> Assembly:
        plan: list[tuple[Segment, list[tuple[int, Future[Leaf]]], Any]] = []
        # Workers: one per core, and one more to compute while another waits for fsync. (On an
        # error the pools' shutdown waits for every task, so no thread reads a buffer after
        # this returns.)
        with (ThreadPoolExecutor(self.cores + 1, thread_name_prefix="nscas-put") as workers,
              ThreadPoolExecutor(1, thread_name_prefix="nscas-sha") as sha_chain,
              ThreadPoolExecutor(1, thread_name_prefix="nscas-b3") as b3_chain):
            for seg in segments:
                ranges = (split_ranges(seg.length) if seg.tensor is not None
                          else [(0, seg.length)])
                # A tensor cut into pieces is a whole of parts, named by its own BLAKE3.
                split = blake3.blake3() if len(ranges) > 1 else None
                leaves: list[tuple[int, Future[Leaf]]] = []
                for off, length in ranges:
                    self._raise_failed()
                    piece = _Piece(self.buffers, length)
                    got = _read_exactly(self.f, piece.view)
                    if got != length:
                        raise StoreError("file changed size while it was being added")
                    self._chain(sha_chain, piece, self.whole_sha.update)
                    self._chain(b3_chain, piece, self.whole_b3.update)
                    # A tensor's pieces (and the tensor) get no SHA-256 now: the file's, on
                    # the chain above, is the only one an add computes (docs/format.md §1.2).
                    leaf = workers.submit(self.putter._leaf, piece.view, piece.reader(),
                                          lazy_sha256=seg.tensor is not None,
                                          hint=self.putter.hint(seg, off, length))
                    self.tasks.append(leaf)
                    if split is not None:
                        self._chain(b3_chain, piece, split.update)
                    piece.handed_out()
                    leaves.append((off, leaf))
                plan.append((seg, leaves, split))
            if self.f.read(1):
                raise StoreError("file grew while it was being added")
        for task in self.tasks:
            task.result()
        return self._assemble(plan)

    def _chain(self, chain: ThreadPoolExecutor, piece: _Piece,
               update: Callable[[memoryview], object]) -> None:
        """Queue ``update`` of ``piece`` on a chain (a one-thread pool: updates in file order)."""
        release = piece.reader()

        def run() -> None:
            try:
                update(piece.view)
            finally:
                release()
        self.tasks.append(chain.submit(run))

    def _raise_failed(self) -> None:
        """Stop reading as soon as a task has failed."""
        for task in self.tasks[-4 * WINDOW:]:
            if task.done() and task.exception() is not None:
                task.result()

    def _assemble(self, plan: list[tuple[Segment, list[tuple[int, Future[Leaf]]], Any]]
                  ) -> Assembly:
        leaves: list[Leaf] = []
        part_rows: list[dict[str, Any]] = []
        top: list[tuple[int, str]] = []
        size = 0
        for seg, futures, split in plan:
            done = [(off, leaf.result()) for off, leaf in futures]
            leaves.extend(leaf for _, leaf in done)
            size += seg.length
            if split is None:
                top.append((seg.offset, done[0][1].hex))
                continue
            seg_hex = split.hexdigest()
            part_rows += [{"object_id": seg_hex, "idx": i, "offset": off, "part_id": leaf.hex}
                          for i, (off, leaf) in enumerate(done)]
            leaves.append(Leaf(hex=seg_hex, size=seg.length, sha256=None, storage="parts"))
            top.append((seg.offset, seg_hex))
        whole_hex = self.whole_b3.hexdigest()
        if not (len(top) == 1 and top[0][1] == whole_hex):  # a one-part file is that part
            part_rows += [{"object_id": whole_hex, "idx": i, "offset": off, "part_id": hex_}
                          for i, (off, hex_) in enumerate(top)]
            leaves.append(Leaf(hex=whole_hex, size=size, sha256=self.whole_sha.hexdigest(),
                               storage="parts"))
        return Assembly(hex=whole_hex, leaves=leaves, part_rows=part_rows)


def _read_exactly(f: Readable, buf: memoryview) -> int:
    """Fill ``buf`` from ``f``; fewer bytes only at end of file."""
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
