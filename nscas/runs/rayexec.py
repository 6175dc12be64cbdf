"""The Ray executor: each step of a scheduled run as a task on a Ray cluster (``nscas run FILE
--executor ray``).

A task asks Ray for the step's declared resources (``num_cpus`` its cores, ``num_gpus`` its
GPUs, 1/K of one under ``--gpu-share K``) and runs the one step through the job's own code
(nscas.runs.job ``run_in``), against the store the run uses, opened on the node by its path
(a local store every node of one host sees) or its config (a team store: PostgreSQL + S3). So
the actions, outputs and IDs are those of a sequential run, and the store is the only state
steps share: a task returns its step's result (IDs and claims, pickled) and its output text,
never object data. While it runs, its events (progress, notes) come back through one queue
actor per run, as a local job's come through its pipe. A worker that dies mid-step is retried
by Ray (``MAX_RETRIES``); the action's claim (nscas.store.claims) died with it, so the retry
runs the same action again, and takes over the dead run's work area. Ray is imported here
only, and only when a run asks for it (the extra ``nscas[ray]``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import math
import os
import pickle
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import NscasError
from nscas.runs.executor import Post, Running
from nscas.runs.job import JobSpec, Outcome, run_in
from nscas.runs.resources import Gpu, Grant, Machine, Needs
from nscas.store.config import StoreConfig
from nscas.store.locating import DB_NAME

if TYPE_CHECKING:
    from nscas.store.writer import Store

MAX_RETRIES = 3
"""How often Ray runs a step again whose worker or node died under it."""
CONNECT_S = 10.0
"""How long the cluster's address has to accept a connection."""
LOG_TAIL_BYTES = 1 << 20
"""The most of a task's output brought back to its log (its end)."""
RELAY_WAIT_S = 1.0
"""How long the scheduler's side waits for one event before it looks whether the run ended."""
KILL_WAIT_S = 60.0
"""How long ``kill`` waits for a force-cancelled task to end before it reports it and moves on."""


class RayMissing(NscasError):
    """``--executor ray`` without Ray installed."""

    def __init__(self) -> None:
        super().__init__("--executor ray needs Ray: install nscas[ray] "
                         "(pip install 'nscas[ray]')")


class ClusterUnreachable(NscasError):
    """No Ray cluster answered at the address given."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(f"no Ray cluster at {address}: {why}")
        self.address = address


class StoreUnreachable(NscasError):
    """A node cannot open the store a step is to run against."""

    def __init__(self, store: str, node: str, why: str) -> None:
        super().__init__(f"the store {store} cannot be opened on Ray node {node}: {why}")
        self.store = store
        self.node = node


def connect(address: str | None, *, store: Store, gpu_share: int = 1) -> RayCluster:
    """Join the Ray cluster at ``address`` (else ``RAY_ADDRESS``, else one started on this
    host with ``ray start``) as a driver, for runs against ``store``."""
    try:
        import ray
    except ImportError:
        raise RayMissing() from None
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    _answers(where)
    try:
        ray.init(address=where, log_to_driver=False, configure_logging=False,
                 include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterUnreachable(where, _first_line(exc)) from None
    _cluster_messages_to_stderr(ray)
    return RayCluster(store=store, gpu_share=gpu_share)


def _cluster_messages_to_stderr(ray: Any) -> None:
    """Ray's driver prints what the cluster reports to it (a worker died, a task is retried)
    to stdout, even with ``log_to_driver`` off; stdout is nscas's own (``--json``), so they go
    to stderr. Ray has no setting for it: its printer is wrapped, where this Ray has one."""
    module = ray._private.worker
    printer: Callable[..., None] | None = getattr(module, "print_to_stdstream", None)
    if printer is None or getattr(printer, "to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_stderr


def _answers(address: str) -> None:
    """Refuse at once an address ``HOST:PORT`` where nothing listens (Ray itself would keep
    retrying for minutes); ``auto`` and ``ray://`` addresses are left to Ray."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        raise ClusterUnreachable(address, exc.strerror or _first_line(exc)) from None


class RayCluster:
    """Starts steps as Ray tasks (an ``Executor``); ``close`` leaves the cluster."""

    def __init__(self, *, store: Store, gpu_share: int) -> None:
        import ray
        from ray.util.queue import Queue

        self._ray: Any = ray  # untyped: its calls are not checked
        self._task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(run_on_node)
        self._store = str(store.root.resolve())
        self._config = store.config
        self._gpu_share = gpu_share
        # The tasks' events, each tagged with its task's key; an actor that asks for no CPU,
        # so it never waits for (or holds) a step's.
        self._queue: Any = Queue(actor_options={"num_cpus": 0})
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._relay = threading.Thread(target=self._relay_events, name="ray-events",
                                       daemon=True)
        self._relay.start()

    def machine(self) -> Machine:
        """The cluster's CPUs and GPUs, as the scheduler's pool hands them out; Ray places each
        task on a node that has what it asks for. Ray knows no GPU memory: a shared GPU's
        memory estimates are not checked (``inf``)."""
        total = self._ray.cluster_resources()
        return Machine(cores=tuple(range(int(total.get("CPU", 0)))),
                       gpus=tuple(Gpu(index=i, memory_gb=math.inf)
                                  for i in range(int(total.get("GPU", 0)))))

    def _gpus(self, needs: Needs) -> float:
        """What a task asks Ray for: 1/K of a GPU for a one-GPU step under ``--gpu-share K``."""
        return 1 / self._gpu_share if needs.gpus == 1 and self._gpu_share > 1 else needs.gpus

    def never_fits(self, needs: Needs) -> str | None:
        """A task runs on one node: a step that no node's CPUs and GPUs hold would wait in
        Ray for ever (Ray calls it infeasible), so it fails before the run starts."""
        nodes = [n.get("Resources", {}) for n in self._ray.nodes() if n.get("Alive")]
        gpus = self._gpus(needs)
        if any(n.get("CPU", 0) >= needs.cores and n.get("GPU", 0) >= gpus for n in nodes):
            return None
        cpus = max((n.get("CPU", 0) for n in nodes), default=0)
        most = max((n.get("GPU", 0) for n in nodes), default=0)
        return (f"it needs {needs.describe()} on one node; no node of the Ray cluster has "
                f"them (its nodes have at most {cpus:g} CPUs and {most:g} GPUs each)")

    def devices(self, needs: Needs, grant: Grant) -> str:
        """What the task asked Ray for (the grant's cores only count the cluster's CPUs; Ray
        picks the node, which the task's first note names)."""
        gpus = self._gpus(needs)
        return f"ray: {needs.cores} CPU{'s' if needs.cores != 1 else ''}" + (
            f", {gpus:g} GPU{'s' if gpus > 1 else ''}" if gpus else "")

    def start(self, spec: JobSpec, *, needs: Needs, grant: Grant, log: Path,
              post: Post) -> Running:
        gpus = self._gpus(needs)
        spec = replace(spec, store=self._store, file=str(Path(spec.file).resolve()), cores=())
        threads = max(1, needs.cores // max(1, needs.world))
        key = uuid.uuid4().hex
        ref = self._task.options(num_cpus=needs.cores, num_gpus=gpus).remote(
            spec.to_json(), self._config, threads, self._queue.actor, key)
        task = _Task(self._ray, ref, post)
        with self._lock:
            self._tasks[key] = task
        threading.Thread(target=task.follow, args=(log,), name=f"ray-{spec.step}",
                         daemon=True).start()
        return task

    def _relay_events(self) -> None:
        """The tasks' events, to the task each names (this thread's only output)."""
        from ray.util.queue import Empty

        while not self._closing.is_set():
            try:
                key, event = self._queue.get(timeout=RELAY_WAIT_S)
            except Empty:
                continue
            except self._ray.exceptions.RayError:  # the queue's actor is gone: no more events
                return
            with self._lock:
                task = self._tasks.get(key)
            if task is not None and isinstance(event, dict):
                task.relay(event)

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(self._ray.exceptions.RayError):
            self._ray.kill(self._queue.actor)  # ends a wait for an event at once
        self._relay.join(timeout=RELAY_WAIT_S + CONNECT_S)
        self._ray.shutdown()


class _Task:
    def __init__(self, ray: Any, ref: Any, post: Post, *,
                 kill_wait_s: float = KILL_WAIT_S) -> None:
        self._ray, self._ref, self._post = ray, ref, post
        self._kill_wait_s = kill_wait_s
        self._why = "the Ray task ended"
        self._ended = threading.Event()
        self._posting = threading.Lock()  # no event after the end
        self._attempts = 0

    def relay(self, event: dict[str, Any]) -> None:
        """One event the task sent while it ran (from the cluster's event thread). Its start
        becomes a note of where it runs; a second start is Ray running the step again."""
        if event.get("event") == "started":
            self._attempts += 1
            where = f"on Ray node {event.get('node')}, worker pid {event.get('pid')}"
            event = {"event": "note", "message": where if self._attempts == 1 else
                     f"Ray runs the step again (attempt {self._attempts}, {where}): the worker "
                     f"of its last attempt died"}
        with self._posting:
            if not self._ended.is_set():
                self._post(event)

    def follow(self, log: Path) -> None:
        """Wait for the task; its output to ``log``, its outcome, then its end, to the
        scheduler (this thread's only output)."""
        try:
            outcome, text = self._ray.get(self._ref)
        except Exception as exc:  # Ray's own errors: the task failed, was cancelled, or lost
            self._why = f"the Ray task failed ({_first_line(exc)})"
            outcome = None
        else:
            with log.open("ab") as out:
                out.write(text)
        with self._posting:
            if self._ended.is_set():
                return  # given up on by ``kill``: the scheduler has moved on
            if outcome is not None:
                self._post({"event": "outcome",
                            "pickle": base64.b64encode(outcome).decode("ascii")})
            self._ended.set()
            self._post(None)

    # Ray must not be asked to cancel a task that has ended (its core worker aborts the
    # driver on a finished task's retried attempt): both ask only while it runs.
    def stop(self) -> None:
        if not self._ended.is_set():
            self._ray.cancel(self._ref)  # a KeyboardInterrupt in the task: a failed receipt

    def wait(self, timeout: float) -> None:
        self._ended.wait(timeout)

    def kill(self) -> None:
        if not self._ended.is_set():
            self._ray.cancel(self._ref, force=True)  # ends its worker
        if self._ended.wait(self._kill_wait_s):
            return
        # Ray did not answer for the cancelled task (a lost node, a stuck raylet): the run
        # does not wait on it for ever. Say so, and end the step here.
        with self._posting:
            if self._ended.is_set():
                return
            self._why = (f"the Ray task did not end within {self._kill_wait_s:g} s of its "
                         "forced cancel; left to Ray")
            self._post({"event": "note", "message": self._why})
            self._ended.set()
            self._post(None)

    def why_ended(self) -> str:
        return self._why


def run_on_node(spec_json: str, config: StoreConfig | None, threads: int, queue: Any,
                key: str) -> tuple[bytes, bytes]:
    """A step, on the node Ray chose: (its outcome pickled, the end of its output); its
    events go to the run's queue actor ``queue`` tagged ``key``, its start first."""
    spec = JobSpec.from_json(spec_json)
    events = _QueueEvents(queue, key)
    events.send({"event": "started", "node": socket.gethostname(), "pid": os.getpid()})
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    with _output_captured() as output:
        try:
            store = open_on_node(spec.store, config)
        except StoreUnreachable as exc:
            outcome = Outcome(error=exc.message, exit_code=exc.exit_code)
        else:
            with store:
                outcome = run_in(store, spec, events)
        text = output.read()
    return pickle.dumps(outcome), text


class _QueueEvents:
    """A task's events, to the run's queue actor: sent without waiting for it (an actor
    runs one caller's calls in order), so a step never waits on its progress report."""

    def __init__(self, queue: Any, key: str) -> None:
        self._queue, self._key = queue, key

    def send(self, event: dict[str, Any]) -> None:
        self._queue.put_nowait.remote((self._key, event))


def open_on_node(root: str, config: StoreConfig | None) -> Store:
    """The run's store as this node sees it: a local store at its path; a team store by its
    config, its node-local directory (work areas) at its path, else under the temp dir."""
    from nscas.store.writer import Store

    node = socket.gethostname()
    where = root if config is None else config.database
    path = Path(root)
    try:
        if config is None:
            if not (path / DB_NAME).is_file():
                raise StoreUnreachable(where, node, f"no store at {root} on this node")
            return Store(path)
        if not path.is_dir():
            key = hashlib.sha256(config.database.encode()).hexdigest()[:16]
            path = Path(tempfile.gettempdir()) / "nscas-ray" / key / ".nscas"
            path.mkdir(parents=True, exist_ok=True)
        return Store(path, config=config)
    except StoreUnreachable:
        raise
    except (NscasError, OSError) as exc:
        raise StoreUnreachable(where, node, _first_line(exc)) from None


class _Captured:
    def __init__(self, file: Any) -> None:
        self._file = file

    def read(self) -> bytes:
        sys.stdout.flush()
        sys.stderr.flush()
        size = self._file.seek(0, os.SEEK_END)
        self._file.seek(max(0, size - LOG_TAIL_BYTES))
        return bytes(self._file.read())


@contextlib.contextmanager
def _output_captured() -> Iterator[_Captured]:
    """This process's stdout and stderr (file descriptors 1 and 2, so what the step's own
    subprocesses write too) into a temp file while the block runs."""
    with tempfile.TemporaryFile() as file:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(file.fileno(), 1)
            os.dup2(file.fileno(), 2)
            yield _Captured(file)
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
