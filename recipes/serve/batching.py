"""Dynamic batching and the bounded retry cache of a replica (both live on the event loop).

Requests that arrive together are generated together: the batcher takes the first waiting
request, then keeps collecting until ``max_batch`` are in hand or no request has come for
``max_wait`` seconds, and runs that batch in its one worker thread while the loop keeps
accepting requests.
Greedy batched generation gives each row the tokens it would get alone, so batching changes
throughput, never answers. A request may bring a control (``decoding.RowControl``) that steers
its row token by token: the generation thread calls it as the row's tokens are chosen, so a
stream hears of each one while the batch is still decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from nscas.errors import InvalidInput

Generate = Callable[[Sequence[Sequence[int]], int, Sequence[Any]], list[Any]]
"""(prompts, max_new_tokens, the control of each prompt or None) -> one generation per prompt
(its generated ids in ``output_ids``), in order, or an exception in the place of a row that
failed alone; blocking."""


class RequestConflict(InvalidInput):
    """A request id already names another request (another task or another prompt)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request id {request_id!r} was already used for another request")
        self.request_id = request_id


@dataclass(slots=True)
class BatchStats:
    """Counters a test or an operator can read back (``GET /stats``)."""

    batches: int = 0
    rows: int = 0
    largest: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    """Batch size -> how many batches had it."""
    seconds: float = 0.0
    """Wall seconds spent inside generation calls (the worker thread's own clock), so that
    service time can be told apart from time a request spent queued or on the wire."""
    tokens: int = 0
    """Tokens generated, over all rows that were answered: what a row cost, in a count that
    no load on the machine changes (a row ended early shows here as fewer tokens)."""

    def record(self, size: int, seconds: float, tokens: int) -> None:
        self.batches += 1
        self.rows += size
        self.largest = max(self.largest, size)
        self.sizes[size] = self.sizes.get(size, 0) + 1
        self.seconds += seconds
        self.tokens += tokens

    @classmethod
    def total(cls, parts: Sequence[BatchStats]) -> BatchStats:
        """The counters of several batchers (a replica's instances) taken together: seconds
        add up, so they may exceed the wall time while instances generate side by side."""
        whole = cls()
        for part in parts:
            whole.batches += part.batches
            whole.rows += part.rows
            whole.largest = max(whole.largest, part.largest)
            for size, count in part.sizes.items():
                whole.sizes[size] = whole.sizes.get(size, 0) + count
            whole.seconds += part.seconds
            whole.tokens += part.tokens
        return whole

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "rows": self.rows, "largest_batch": self.largest,
                "batch_sizes": {str(k): v for k, v in sorted(self.sizes.items())},
                "generate_seconds": self.seconds, "generated_tokens": self.tokens}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pending:
    prompt: tuple[int, ...]
    max_new_tokens: int
    control: Any
    future: asyncio.Future[Any]


class Batcher:
    """Collects concurrent generation requests into batches; one batch runs at a time."""

    def __init__(self, generate: Generate, *, max_batch: int, max_wait_s: float,
                 name: str = "nscas-generate") -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise InvalidInput(f"max_batch must be >= 1 and max_wait >= 0, got {max_batch}, "
                               f"{max_wait_s}")
        self._generate = generate
        self._max_batch = max_batch
        self._max_wait = max_wait_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        # One thread: the model is not shared between threads, and batches run one at a time.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._task: asyncio.Task[None] | None = None
        self.stats = BatchStats()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nscas-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, prompt: Sequence[int], max_new_tokens: int,
                     control: Any = None) -> Any:
        """The generation of ``prompt``, produced in whatever batch it lands in (steered by
        ``control`` if given)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(prompt=tuple(prompt), max_new_tokens=max_new_tokens,
                                       control=control, future=future))
        return await future

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            # The batch stays open while requests keep coming: each arrival grants the next
            # one max_wait. Replies to a finished batch go out one by one, so the requests
            # that follow them arrive spread out; a fixed window would split them.
            while len(batch) < self._max_batch:
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), self._max_wait))
                except TimeoutError:
                    break
            # Whatever queued while we waited joins too (never more than max_batch).
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._generate_batch([p for p in batch if not p.future.done()])

    async def _generate_batch(self, batch: list[_Pending]) -> None:
        # One generate call takes a single max_new_tokens; rows with other limits run apart.
        groups: dict[int, list[_Pending]] = {}
        for pending in batch:
            groups.setdefault(pending.max_new_tokens, []).append(pending)
        loop = asyncio.get_running_loop()
        for limit, rows in groups.items():
            try:
                results, seconds = await loop.run_in_executor(
                    self._executor, self._timed, [r.prompt for r in rows], limit,
                    [r.control for r in rows])
            except Exception as exc:  # every row learns of it; the batcher serves on
                self.stats.record(len(rows), 0.0, 0)
                for row in rows:
                    if not row.future.done():
                        row.future.set_exception(exc)
                continue
            self.stats.record(len(rows), seconds, sum(
                len(r.output_ids) for r in results if not isinstance(r, Exception)))
            for row, result in zip(rows, results, strict=True):
                if row.future.done():
                    continue
                if isinstance(result, Exception):  # this row alone failed
                    row.future.set_exception(result)
                else:
                    row.future.set_result(result)

    def _timed(self, prompts: list[tuple[int, ...]], limit: int,
               controls: list[Any]) -> tuple[list[Any], float]:
        started = time.perf_counter()
        results = self._generate(prompts, limit, controls)
        return results, time.perf_counter() - started


class RetryCache:
    """Request id -> the answer (or the in-flight work) of its first request, LRU-bounded.

    A retry with the same id and the same fingerprint (what was asked) gets the first answer,
    computed once; the same id with another fingerprint is a conflict. Only finished entries
    are evicted, oldest first, once more than ``size`` are held.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InvalidInput(f"the retry cache needs a size of at least 1, got {size}")
        self._size = size
        self._entries: OrderedDict[str, tuple[Hashable, asyncio.Future[Any]]] = OrderedDict()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def run(self, request_id: str, fingerprint: Hashable,
                  compute: Callable[[], Any]) -> tuple[Any, bool]:
        """(result, cached): the stored result of ``request_id`` or a fresh ``await compute()``.

        Raises ``RequestConflict`` if ``request_id`` was used with another fingerprint.
        A failed computation is not kept, so a retry computes again.
        """
        entry = self._entries.get(request_id)
        if entry is not None:
            if entry[0] != fingerprint:
                raise RequestConflict(request_id)
            self._entries.move_to_end(request_id)
            self.hits += 1
            return await asyncio.shield(entry[1]), True
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._entries[request_id] = (fingerprint, future)
        try:
            result = await compute()
        except BaseException as exc:
            del self._entries[request_id]
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # retrieved here: waiters, if any, get it raised
            else:
                future.cancel()
            raise
        future.set_result(result)
        self._evict()
        return result, False

    def _evict(self) -> None:
        excess = len(self._entries) - self._size
        for key in [k for k, (_, f) in self._entries.items() if f.done()][:max(0, excess)]:
            del self._entries[key]
