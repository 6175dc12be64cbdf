"""The Ray executor: each step of a scheduled run as a task on a Ray cluster (``nscas run FILE
--executor ray``).

A task asks Ray for the step's declared resources (``num_cpus`` its cores, ``num_gpus`` its
GPUs, 1/K of one under ``--gpu-share K``) and runs the one step through the job's own code
(nscas.runs.job ``run_in``), against the store the run uses, opened on the node by its path
(a local store every node of one host sees) or its config (a team store: PostgreSQL + S3). So
the actions, outputs and IDs are those of a sequential run, and the store is the only state
steps share: a task returns its step's result (IDs and claims, pickled) and its output text,
never object data. A worker that dies mid-step is retried by Ray (``MAX_RETRIES``); the
action's claim (nscas.store.claims) died with it, so the retry runs the same action again.
Ray is imported here only, and only when a run asks for it (the extra ``nscas[ray]``).
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
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import NscasError
from nscas.runs.executor import Post, Running
from nscas.runs.job import Events, JobSpec, Outcome, run_in
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
    return RayCluster(store=store, gpu_share=gpu_share)


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

        self._ray: Any = ray  # untyped: its calls are not checked
        self._task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(run_on_node)
        self._store = str(store.root.resolve())
        self._config = store.config
        self._gpu_share = gpu_share

    def machine(self) -> Machine:
        """The cluster's CPUs and GPUs, as the scheduler's pool hands them out; Ray places each
        task on a node that has what it asks for. Ray knows no GPU memory: a shared GPU's
        memory estimates are not checked (``inf``)."""
        total = self._ray.cluster_resources()
        return Machine(cores=tuple(range(int(total.get("CPU", 0)))),
                       gpus=tuple(Gpu(index=i, memory_gb=math.inf)
                                  for i in range(int(total.get("GPU", 0)))))

    def start(self, spec: JobSpec, *, needs: Needs, grant: Grant, log: Path,
              post: Post) -> Running:
        gpus: float = needs.gpus
        if needs.gpus == 1 and self._gpu_share > 1:
            gpus = 1 / self._gpu_share
        spec = replace(spec, store=self._store, file=str(Path(spec.file).resolve()), cores=())
        threads = max(1, needs.cores // max(1, needs.world))
        ref = self._task.options(num_cpus=needs.cores, num_gpus=gpus).remote(
            spec.to_json(), self._config, threads)
        task = _Task(self._ray, ref)
        threading.Thread(target=task.follow, args=(log, post), name=f"ray-{spec.step}",
                         daemon=True).start()
        return task

    def close(self) -> None:
        self._ray.shutdown()


class _Task:
    def __init__(self, ray: Any, ref: Any) -> None:
        self._ray, self._ref = ray, ref
        self._why = "the Ray task ended"
        self._ended = threading.Event()

    def follow(self, log: Path, post: Post) -> None:
        """Wait for the task; its output to ``log``, its outcome to ``post`` (this thread's
        only output)."""
        try:
            outcome, text = self._ray.get(self._ref)
        except Exception as exc:  # Ray's own errors: the task failed, was cancelled, or lost
            self._why = f"the Ray task failed ({_first_line(exc)})"
        else:
            with log.open("ab") as out:
                out.write(text)
            post({"event": "outcome", "pickle": base64.b64encode(outcome).decode("ascii")})
        self._ended.set()
        post(None)

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
        self._ended.wait()

    def why_ended(self) -> str:
        return self._why


def run_on_node(spec_json: str, config: StoreConfig | None, threads: int) -> tuple[bytes, bytes]:
    """A step, on the node Ray chose: (its outcome pickled, the end of its output)."""
    spec = JobSpec.from_json(spec_json)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    with _output_captured() as output:
        try:
            store = open_on_node(spec.store, config)
        except StoreUnreachable as exc:
            outcome = Outcome(error=exc.message, exit_code=exc.exit_code)
        else:
            with store, open(os.devnull, "w") as sink:
                outcome = run_in(store, spec, Events(sink))
        text = output.read()
    return pickle.dumps(outcome), text


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
