"""Warm job processes: one server per scheduled run that imports the heavy modules once and
forks a job per step.

A cold job (``python -m nscas.runs.job``) starts an interpreter and imports torch and
transformers before its step does anything: seconds on every step of a pipeline, on the
critical path too. ``WarmJobs`` starts one server (``python -m nscas.runs.warm``) as a run
begins (its imports overlap the run's planning); the server imports what jobs import (the
run's recipes with the modules of their own package in their code closures, which their
``run`` imports, each after the library modules it imports, one at a time; then
``PRELOAD``), having found those closures (so that a job's ``code_tree`` parses nothing
again), and forks one job per step. The child takes a session
of its own (its pid is its process group, as a cold job's), its log as stdout and stderr, the
step's environment and thread count, and runs ``nscas.runs.job.serve``, as a cold job does.

Fork safety: the server starts no thread and only imports (it runs no torch operation, so no
torch thread pool exists, and never touches CUDA; the threads imports start, the OpenBLAS
pools of numpy and of scipy (which transformers' model classes load), stop themselves around a
fork), so every child starts as a process of one thread with no device state;
CUDA_VISIBLE_DEVICES and the thread count are the child's own. A job asked for while the
server imports is forked once that one import is done. A child that ends while the server
imports is reaped and told ended at once, from the server's SIGCHLD handler (SIGCHLD is
blocked from a fork until its answer is sent, so a job's exit is never told before its fork).

Over a SOCK_SEQPACKET socket pair the scheduler sends one message a job: JSON (the job's
number, its spec, its environment) with three descriptors (the write end of its events pipe,
the read end of its watch pipe, its log). The server answers ``{"job": n, "pid": p}`` once it
has forked it, and ``{"pid": p, "status": s}`` once that child has exited (``s`` as
``subprocess`` gives a return code: negative for a signal). The server ends at ``close``
(SIGTERM), or when its stdin (a pipe the scheduler holds) reaches end-of-file: when the
scheduler dies.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections import deque
from dataclasses import replace
from typing import Any

PRELOAD = ("torch", "transformers")
"""Imported by the server where installed, beside the registered recipes: the recipes import
them inside ``run`` (so that planning a run does not), and they are most of a cold start."""
JOB_MODULES = ("nscas.runs.job", "nscas.runs.plans", "nscas.runs.runner",
               "nscas.signing.signatures", "nscas.store.writer")
"""What every job imports to run its step, whatever its recipe."""
_MESSAGE_BYTES = 1 << 20
_FIRST_PARTY = "nscas"


class WarmJobs:
    """The scheduler's side: starts the server (``open``, else on first use), forks jobs
    through it, and follows their exits. Used from the scheduler's thread and its jobs' reader threads."""

    def __init__(self, recipes: tuple[str, ...] = ()) -> None:
        """``recipes``: the names of the recipes the run's steps use, in run order (the
        server imports those first, and no other recipe)."""
        self._recipes = recipes
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._gone = False
        self._numbers = itertools.count()
        self._waiting: dict[int, WarmJob] = {}  # by job number, until forked
        self._running: dict[int, WarmJob] = {}  # by pid, until reaped

    def open(self) -> None:
        """Start the server now (else with the first job): its imports run while this process
        does other work."""
        with self._lock:
            if self._socket is None and not self._gone:
                self._start_server()

    def start(self, spec_json: str, *, env: dict[str, str], events: int, watch: int,
              log: int) -> WarmJob | None:
        """Fork the job ``spec_json`` with these descriptors (they stay open here); it, once
        forked, or None if the server is not there (the caller starts a cold job)."""
        with self._lock:
            if self._gone:
                return None
            sock = self._socket or self._start_server()
            number = next(self._numbers)
            job = WarmJob()
            self._waiting[number] = job
        message = json.dumps({"job": number, "spec": spec_json, "env": env}).encode()
        try:
            socket.send_fds(sock, [message], [events, watch, log])
        except OSError:
            self._server_gone()
        job.forked.wait()
        return job if job.pid is not None else None

    def close(self) -> None:
        """End the server, at once (the jobs it forked are the scheduler's to end, each by
        its group, and are not the server's to wait for)."""
        with self._lock:
            server, sock, self._gone = self._server, self._socket, True
        if server is None or sock is None:
            return
        server.terminate()  # it may be importing still: no need to wait for that
        if server.stdin is not None:
            server.stdin.close()
        server.wait()
        sock.close()

    def _start_server(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The server imports what this process does (its recipes above all), however this
        # process's path was made, as a cold job does.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # Its own output is nothing a run shows: a module it could not import is the job's to
        # report, and without the server a job starts cold. Each job's output is its log.
        self._server = subprocess.Popen(
            [sys.executable, "-m", "nscas.runs.warm", str(theirs.fileno()), *self._recipes],
            env=env,
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self._socket = ours
        threading.Thread(target=self._listen, args=(ours,), name="warm-jobs",
                         daemon=True).start()
        return ours

    def _listen(self, sock: socket.socket) -> None:
        """The server's answers (this thread's only work), until it is gone. However this
        thread ends, the server then counts as gone: a job waiting for its fork is told so
        (and starts cold) rather than waiting for an answer nobody reads."""
        try:
            while True:
                try:
                    data = sock.recv(_MESSAGE_BYTES)
                except OSError:
                    break
                if not data:
                    break
                try:
                    self._answer(json.loads(data))
                except (KeyError, TypeError, ValueError):
                    break  # an answer for no job of ours: the server is not to be trusted
        finally:
            self._server_gone()

    def _answer(self, message: dict[str, Any]) -> None:
        """One answer: a job forked (its pid), or a forked job's exit (its status)."""
        with self._lock:
            if "job" in message:
                job = self._waiting.pop(message["job"])
                job.pid = message["pid"]
                self._running[job.pid] = job
                job.forked.set()
            else:
                job = self._running.pop(message["pid"])
                job.returncode = message["status"]
                job.ended.set()

    def _server_gone(self) -> None:
        """No more answers: a job not forked never will be, and a forked one's exit will not
        be told (its events pipe still says when it has ended)."""
        with self._lock:
            self._gone = True
            left = [*self._waiting.values(), *self._running.values()]
            self._waiting.clear()
            self._running.clear()
        for job in left:
            job.forked.set()
            job.ended.set()


class WarmJob:
    """One forked job, as ``WarmJobs`` follows it."""

    def __init__(self) -> None:
        self.forked = threading.Event()
        self.ended = threading.Event()
        self.pid: int | None = None
        self.returncode: int | None = None


def main(argv: list[str]) -> int:
    """The server (``argv``: its socket's descriptor, then the run's recipes): import, then
    fork a job per message until stdin reaches end-of-file. A job asked for while it is still
    importing is forked between two imports (it imports what it needs that is not loaded yet
    itself): a first step that needs no torch waits for none."""
    sock = socket.socket(fileno=int(argv[1]))
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    # Only the server's own jobs are reaped and told: an import may run a child process of
    # its own (ctypes.util.find_library runs ldconfig), which its caller waits for.
    jobs: set[int] = set()
    signal.signal(signal.SIGCHLD, lambda signum, frame: _reap(sock, jobs))
    poller = select.poll()
    for fd in (sock.fileno(), sys.stdin.fileno(), wake_read):
        poller.register(fd, select.POLLIN)
    keep = (sock.fileno(), wake_read, wake_write)
    # Lightest first: the job's own modules, then each recipe (its module, then the modules
    # of its own package in its code closure), then ``PRELOAD``.
    loads = deque([*((False, m) for m in JOB_MODULES), *((True, r) for r in argv[2:]),
                   *((False, m) for m in PRELOAD)])
    while loads:
        is_recipe, name = loads.popleft()
        # Not preloaded is only slower: the job imports the module itself, and reports it if
        # it cannot (a module not installed, or one whose import fails).
        with contextlib.suppress(Exception):
            if is_recipe:
                loads.extendleft((False, m) for m in reversed(_recipe_modules(name)))
            else:
                _load(name)
        if not _serve(poller, sock, keep, jobs, timeout=0):
            return 0
    while _serve(poller, sock, keep, jobs, timeout=None):
        pass
    return 0


def _recipe_modules(name: str) -> list[str]:
    """Import the recipe ``name`` and find its code closure (nscas.runs.codetree, whose parses
    the forked jobs inherit); the modules of the closure in the recipe's own package
    (``nscas.recipes``), which its ``run`` imports, each after the other libraries' modules it
    imports (one at a time: a job waits for at most one import to end before its fork)."""
    from nscas.runs.codetree import imported_modules, recipe_files
    from nscas.runs.registry import registered_recipe

    recipe = registered_recipe(name)
    if recipe is None:
        return []
    own = recipe.run.__module__.split(".")[:2]
    modules: list[str] = []
    for path, file in recipe_files(recipe).items():
        parts = path.removesuffix(".py").removesuffix("/__init__").split("/")
        if not path.endswith(".py") or parts[:2] != own:
            continue
        package = ".".join(parts if path.endswith("/__init__.py") else parts[:-1])
        modules += (m for m in imported_modules(file, package)
                    if m.partition(".")[0] not in (_FIRST_PARTY, *sys.stdlib_module_names))
        modules.append(".".join(parts))
    return list(dict.fromkeys(modules))


def _load(name: str) -> None:
    """Import ``name``, or, where it names no module (``from a import b``), take ``a.b``: a
    lazy package (transformers) imports what its attribute needs then."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        parent, _, attribute = name.rpartition(".")
        if parent not in sys.modules:
            raise
        getattr(sys.modules[parent], attribute)


def _serve(poller: select.poll, sock: socket.socket, keep: tuple[int, ...], jobs: set[int],
           *, timeout: int | None) -> bool:
    """Fork what is asked for (adding it to ``jobs``), tell which of ``jobs`` exited (waiting
    up to ``timeout`` ms for either); whether to go on (the scheduler is still there)."""
    wake_read = keep[1]
    for fd, _ in poller.poll(timeout):
        if fd == sys.stdin.fileno() and not os.read(fd, 4096):
            return False  # the scheduler is gone
        if fd == wake_read:
            os.read(wake_read, 4096)
        if fd == sock.fileno():
            message, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 3)
            if not message:
                return False
            request = json.loads(message)
            # No exit told (by the SIGCHLD handler) before the fork's own answer.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            try:
                try:
                    pid = _fork(request, fds, keep=keep)
                finally:
                    for received in fds:
                        os.close(received)
                jobs.add(pid)
                sock.send(json.dumps({"job": request["job"], "pid": pid}).encode())
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    _reap(sock, jobs)
    return True


def _reap(sock: socket.socket, jobs: set[int]) -> None:
    """Tell each of ``jobs`` that has exited, and forget it (from the loop, and from the
    SIGCHLD handler, in the middle of an import); a scheduler gone is seen by the loop, on
    stdin. Never ``waitpid(-1)``: that would take an import's own child from its caller."""
    for pid in list(jobs):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            jobs.discard(pid)
            continue
        if done == 0:
            continue
        jobs.discard(pid)
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"pid": pid,
                                  "status": os.waitstatus_to_exitcode(status)}).encode())


def _fork(request: dict[str, Any], fds: list[int], *, keep: tuple[int, ...]) -> int:
    """Fork the request's job; its pid (here). The child never returns."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        for fd in keep:
            os.close(fd)
        events, watch, log = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (null, log):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        _apply_thread_count(os.environ.get("OMP_NUM_THREADS"))
        from nscas.runs.job import JobSpec, serve

        code = serve(replace(JobSpec.from_json(request["spec"]), events=events), watch=watch)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the child's last word, in its log, as a cold job's traceback
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # what this process's interpreter would run at its exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _apply_thread_count(threads: str | None) -> None:
    """The step's thread count, which a cold job's torch reads from OMP_NUM_THREADS as it
    loads: the server's torch loaded before this child's environment existed."""
    torch: Any = sys.modules.get("torch")
    if torch is not None and threads and threads.isdigit():
        torch.set_num_threads(int(threads))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
