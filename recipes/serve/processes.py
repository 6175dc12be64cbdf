"""Replica processes: start them, wait until each is ready, stop them; none outlives its group.

A replica is ``python -m nscas.recipes.serve.replica_main`` on port 0. It is ready once it has printed
``listening URL`` on stdout and ``GET URL/health`` answers ready with the expected model
digest. A ``ReplicaGroup`` stops every process it started when it closes, also on error:
SIGTERM first (the replica drains and exits 0), SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from nscas.errors import RecipeError
from nscas.recipes.common.lifetime import child_env

REPLICA_MODULE = "nscas.recipes.serve.replica_main"
"""What a replica process runs (``python -m``)."""
READY_PREFIX = "listening "
"""How a replica's ready line starts; the URL follows."""


class ReplicaStartError(RecipeError):
    """Replica ``index`` did not become ready; ``log_tail`` holds the end of its stderr."""

    def __init__(self, index: int, reason: str, log_tail: str) -> None:
        tail = f"; its log ends: {log_tail}" if log_tail else ""
        super().__init__(f"replica {index} did not become ready: {reason}{tail}")
        self.index = index
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaOptions:
    """How each replica of a group serves (the ``serve-model`` options)."""

    threads: int = 1
    """torch threads per instance of a replica."""
    instances: int = 1
    """Model instances per replica process (``serve-model --instances``)."""
    max_batch: int = 8
    """Most requests per generated batch."""
    max_wait_ms: float = 5.0
    """How long an open batch waits for its next request, in milliseconds."""
    max_new_tokens: int = 96
    """New tokens per answer."""
    device: str = "cpu"
    """``cpu``, or ``cuda`` (each replica's GPU: ``replica_environment``)."""
    precision: str = "bf16"
    """On CUDA: ``bf16`` autocast or ``fp32`` (batch-shape-independent tokens, slower)."""
    cuda_graphs: bool = True
    """On CUDA with FP32: replay each decoding step as a CUDA graph (``serve-model
    --cuda-graphs``)."""
    cpus: str | None = None
    """CPUs to keep the replica on (``serve-model --cpus``), or None for anywhere."""


def replica_environment(device: str, index: int, environ: Mapping[str, str]) -> dict[str, str]:
    """What replica ``index`` starts with on ``device``: on CUDA, the ``index``-th of the GPUs
    this process may use (``CUDA_VISIBLE_DEVICES`` in ``environ``, as a scheduler gives them;
    where it is not set, every GPU of the machine, by index), round again where there are more
    replicas than GPUs."""
    if device != "cuda":
        return {}
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return {"CUDA_VISIBLE_DEVICES": str(index)}
    given = [v.strip() for v in visible.split(",") if v.strip()]
    if not given:
        raise RecipeError("device = cuda, but CUDA_VISIBLE_DEVICES names no GPU")
    return {"CUDA_VISIBLE_DEVICES": given[index % len(given)]}


def replica_command(checkpoint: str, *, store_path: Path, tasks: str | None,
                    options: ReplicaOptions) -> list[str]:
    """The argv of one replica process serving ``checkpoint`` from the store at ``store_path``."""
    argv = [sys.executable, "-m", REPLICA_MODULE, checkpoint, "--store",
            str(store_path), "--host", "127.0.0.1", "--port", "0",
            "--threads", str(options.threads), "--instances", str(options.instances),
            "--max-batch", str(options.max_batch),
            "--max-wait-ms", str(options.max_wait_ms),
            "--max-new-tokens", str(options.max_new_tokens), "--device", options.device,
            "--precision", options.precision,
            "--cuda-graphs" if options.cuda_graphs else "--no-cuda-graphs"]
    argv += ["--cpus", options.cpus] if options.cpus is not None else []
    return argv + (["--tasks", tasks] if tasks is not None else [])


@dataclass(slots=True, kw_only=True)
class ReplicaProcess:
    """One started replica. ``endpoint`` is set once it has printed its ready line."""

    index: int
    process: subprocess.Popen[str]
    log_path: Path
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    endpoint: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " | ".join(line for line in text.splitlines()[-lines:] if line.strip())


class ReplicaGroup:
    """Starts replica processes and stops all of them on ``close`` (or leaving ``with``)."""

    def __init__(self, workdir: Path, *, grace: float = 15.0) -> None:
        self._workdir = workdir
        self._grace = grace
        self.replicas: list[ReplicaProcess] = []

    def __enter__(self) -> ReplicaGroup:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
              ) -> ReplicaProcess:
        """Start one process (it is stopped by ``close`` whatever happens next)."""
        index = len(self.replicas)
        log_path = self._workdir / f"replica-{index}.log"
        with log_path.open("w", encoding="utf-8") as log_file:
            process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file,
                text=True, env={**os.environ, **child_env(), **(env or {})})
        replica = ReplicaProcess(index=index, process=process, log_path=log_path)
        self.replicas.append(replica)
        assert process.stdout is not None
        threading.Thread(target=_pump, args=(process.stdout, replica.lines), daemon=True,
                         name=f"nscas-replica-{index}-stdout").start()
        return replica

    def wait_ready(self, replicas: Sequence[ReplicaProcess], *, timeout: float,
                   model_digest: str | None) -> list[str]:
        """Endpoints of ``replicas`` once every one is ready; ``ReplicaStartError`` if one is
        not within ``timeout`` seconds in all, exits, or serves another model digest."""
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            return [self._wait_one(r, deadline, timeout, model_digest, client) for r in replicas]

    def _wait_one(self, replica: ReplicaProcess, deadline: float, timeout: float,
                  model_digest: str | None, client: httpx.Client) -> str:
        def fail(reason: str) -> ReplicaStartError:
            return ReplicaStartError(replica.index, reason, replica.log_tail())

        while replica.endpoint is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise fail(f"no ready line within {timeout:g} s")
            try:
                line = replica.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                line = ""
            if line is None:  # stdout closed: the process has ended or is ending
                replica.process.wait(timeout=max(0.1, min(5.0, left)))
                raise fail(f"it exited with status {replica.process.returncode}")
            if line.startswith(READY_PREFIX):
                replica.endpoint = line[len(READY_PREFIX):].strip()
        while True:
            if replica.process.poll() is not None:
                raise fail(f"it exited with status {replica.process.returncode}")
            try:
                answer = client.get(f"{replica.endpoint}/health")
                body = answer.json() if answer.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                body = None
            if isinstance(body, dict) and body.get("ready") is True:
                if model_digest is not None and body.get("model_digest") != model_digest:
                    raise fail(f"it serves model digest {body.get('model_digest')!r}, "
                               f"not {model_digest}")
                return replica.endpoint
            if time.monotonic() >= deadline:
                raise fail(f"{replica.endpoint}/health did not answer ready within {timeout:g} s")
            time.sleep(0.1)

    def stop(self, replica: ReplicaProcess, *, grace: float | None = None) -> int:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; the exit status."""
        process = replica.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self._grace if grace is None else grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        return process.returncode

    def kill(self, replica: ReplicaProcess) -> None:
        """SIGKILL now (a crash, for fault tests); ``close`` still reaps it."""
        if replica.process.poll() is None:
            replica.process.kill()

    def close(self) -> None:
        """Stop every process this group started: all get SIGTERM first, then each is waited for."""
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self.replicas:
            self.stop(replica)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Forward a replica's stdout lines (the ready line) until it closes; None marks the end."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):  # closed under us by ``stop``
        pass
    finally:
        lines.put(None)
