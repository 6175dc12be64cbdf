"""One replica process: load a checkpoint, check its parameter digest, serve it until SIGTERM.

``python -m nscas.recipes.serve.replica_main ID --store PATH [options]`` is what the serve
recipe starts (``processes.replica_command``); ``nscas serve-model`` is the same server with
the CLI's store lookup and help. Once ready it prints one line, ``listening URL`` (``--json``:
an object with ``url`` and ``model_digest``), and flushes stdout: its starter waits for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.errors import InvalidInput, NscasError
from nscas.recipes.common.lifetime import exit_with_owner
from nscas.recipes.serve.replica import MAX_INSTANCES

SWITCH_INTERVAL_S = 0.0005
"""How long a thread may keep the interpreter lock while another waits for it (Python's
default: 5 ms); see ``run_replica``."""

ERROR_PREFIX = "nscas: error: "  # as the CLI writes errors: a replica's log reads the same
MAX_NAME = 256
"""Longest served model name in characters."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSettings:
    """What one replica serves and how (``nscas serve-model --help`` documents each)."""

    checkpoint: str
    """The checkpoint to serve, by ID or ref."""
    tasks: str | None = None
    """A tasks/1 set (ID or ref) whose task ids ``/infer`` answers."""
    name: str | None = None
    """The served model name (OpenAI's ``model``); None: the checkpoint as given."""
    host: str = "127.0.0.1"
    port: int = 0
    max_batch: int = 8
    max_wait_ms: float = 5.0
    threads: int = 1
    """torch threads of each instance's generation thread."""
    instances: int = 1
    """Model instances in this process, each a copy of the model with its own generation
    thread (and CUDA stream); a request goes to the one with the fewest in flight."""
    max_new_tokens: int = 96
    cache_size: int = 1024
    device: str = "cpu"
    precision: str = "bf16"
    cuda_graphs: bool = True
    cpus: str | None = None
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 256

    def check(self) -> None:
        """Refuse bad settings before anything is loaded, naming the option."""
        for name, value in (("--max-batch", self.max_batch), ("--threads", self.threads),
                            ("--max-new-tokens", self.max_new_tokens),
                            ("--cache-size", self.cache_size),
                            ("--max-connections", self.max_connections)):
            if value < 1:
                raise InvalidInput(f"{name} must be at least 1, got {value}")
        for name, seconds in (("--header-timeout", self.header_timeout),
                              ("--body-timeout", self.body_timeout)):
            if not 0 < seconds <= 86_400:  # also refuses nan
                raise InvalidInput(f"{name} must be more than 0 and at most 86400 seconds, "
                                   f"got {seconds}")
        if not 1 <= self.instances <= MAX_INSTANCES:
            raise InvalidInput(f"--instances must be from 1 to {MAX_INSTANCES}, "
                               f"got {self.instances}")
        if self.max_wait_ms < 0:
            raise InvalidInput(f"--max-wait-ms must not be negative, got {self.max_wait_ms}")
        if self.device not in ("cpu", "cuda"):
            raise InvalidInput(f"--device must be cpu or cuda, got {self.device!r}")
        if self.precision not in ("bf16", "fp32"):
            raise InvalidInput(f"--precision must be bf16 or fp32, got {self.precision!r}")
        if not 0 <= self.port <= 65535:
            raise InvalidInput(f"--port must be from 0 to 65535, got {self.port}")
        if self.name is not None and not (0 < len(self.name) <= MAX_NAME
                                          and self.name.isprintable()):
            raise InvalidInput(f"--name must be 1 to {MAX_NAME} printable characters, got "
                               f"{self.name[:80]!r}")

    @property
    def served_name(self) -> str:
        """What OpenAI answers call the model: ``name``, or the checkpoint as given."""
        return self.name if self.name is not None else self.checkpoint


def run_replica(settings: ReplicaSettings, open_store: Callable[[], AbstractContextManager[Any]],
                *, on_ready: Callable[[str, str], None]) -> None:
    """Check the settings, pin the CPUs, load and check the checkpoint, serve until SIGTERM.

    ``open_store`` is called once the CPUs are pinned; ``on_ready(url, model_digest)`` once
    the socket listens.
    """
    from nscas.recipes.serve.replica import pin_to_cpus

    settings.check()
    if settings.cpus is not None:  # first, so that every thread started from here on inherits it
        pin_to_cpus(settings.cpus)
    _check_cpu_threads(settings)
    exit_with_owner()  # started by `nscas run`: end with it, even when that is SIGKILLed

    from nscas.recipes.serve.replica import load_replica
    from nscas.recipes.serve.server import ServerConfig, serve

    config = ServerConfig(host=settings.host, port=settings.port, max_batch=settings.max_batch,
                          max_wait_ms=settings.max_wait_ms,
                          max_new_tokens=settings.max_new_tokens, cache_size=settings.cache_size,
                          served_name=settings.served_name,
                          header_timeout=settings.header_timeout,
                          body_timeout=settings.body_timeout,
                          max_connections=settings.max_connections)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open_store() as store, tempfile.TemporaryDirectory(prefix="nscas-serve-") as workdir:
        checkpoint = store.resolve(settings.checkpoint)
        task_set = store.resolve(settings.tasks) if settings.tasks is not None else None
        instances = load_replica(store, checkpoint, task_set, device=settings.device,
                                 workdir=Path(workdir), threads=settings.threads,
                                 precision=settings.precision,
                                 cuda_graphs=settings.cuda_graphs,
                                 instances=settings.instances)
        digest = instances[0].model_digest
        # A generation thread holds the interpreter lock only between waits on its device; when
        # a wait ends while the event loop (or another instance's prefill) runs Python, it gets
        # the lock back only after the switch interval. The default 5 ms would stall a GPU step
        # of about 4 ms (SmolLM2-135M on an H200; benchmarks/serve.py's arm 1b went from 1.48 x
        # one instance to 1.57 x with this).
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        asyncio.run(serve(instances, config, on_ready=lambda url: on_ready(url, digest)))


def _check_cpu_threads(settings: ReplicaSettings) -> None:
    """On the CPU every instance's generation thread runs ``threads`` torch threads of its
    own: refuse more of them than the CPUs this process may use."""
    import os

    if settings.device != "cpu" or not hasattr(os, "sched_getaffinity"):
        return
    cpus = len(os.sched_getaffinity(0))
    needed = settings.instances * settings.threads
    if needed > cpus:
        raise InvalidInput(f"--instances {settings.instances} x --threads {settings.threads} "
                           f"needs {needed} CPUs; this process may use {cpus}")


def ready_line(url: str, model_digest: str, *, as_json: bool) -> str:
    """The line a replica prints once ready (``processes.READY_PREFIX`` starts the plain one)."""
    if as_json:
        return json.dumps({"url": url, "model_digest": model_digest}, indent=2)
    return f"listening {url}"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m nscas.recipes.serve.replica_main``: errors as one line on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m nscas.recipes.serve.replica_main",
        description="Serve a stored checkpoint as one replica (see nscas serve-model --help).")
    parser.add_argument("checkpoint")
    parser.add_argument("--store", required=True, type=Path)
    defaults = ReplicaSettings(checkpoint="")
    for name in ("tasks", "name", "host", "cpus", "device", "precision"):
        parser.add_argument(f"--{name}", default=getattr(defaults, name))
    for name, kind in (("port", int), ("max_batch", int), ("max_wait_ms", float),
                       ("threads", int), ("instances", int), ("max_new_tokens", int),
                       ("cache_size", int),
                       ("header_timeout", float), ("body_timeout", float),
                       ("max_connections", int)):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind,
                            default=getattr(defaults, name))
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction,
                        default=defaults.cuda_graphs)
    parser.add_argument("--json", dest="as_json", action="store_true")
    args = vars(parser.parse_args(argv))
    store_path: Path = args.pop("store")
    as_json: bool = args.pop("as_json")

    def open_store() -> AbstractContextManager[Any]:
        from nscas.store.opening import open_store

        return open_store(store_path, readonly=True)

    def ready(url: str, model_digest: str) -> None:
        sys.stdout.write(ready_line(url, model_digest, as_json=as_json) + "\n")
        sys.stdout.flush()

    try:
        run_replica(ReplicaSettings(**args), open_store, on_ready=ready)
    except NscasError as exc:
        sys.stderr.write(ERROR_PREFIX + " ".join(exc.message.split()) + "\n")
        raise SystemExit(exc.exit_code) from None
    except OSError as exc:  # a port in use, an unreadable store
        sys.stderr.write(f"{ERROR_PREFIX}{exc.strerror or exc}\n")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
