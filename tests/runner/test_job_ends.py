"""How scheduled jobs end: a job's watch on its scheduler leaves the job's own exit status,
and a Ray task that never answers its kill does not hold the run; and how a warm job starts:
with its step's thread count though torch loaded before it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from nscas.runs.rayexec import _Task
from nscas.runs.warm import WarmJob, WarmJobs, _reap, _recipe_modules
from tests.waiting import GENEROUS, wait_until

WATCHING = ("import sys; from nscas.runs.job import die_with; "
            "die_with(sys.stdin.fileno()); sys.exit(3)")


def test_a_job_watching_its_stdin_pipe_exits_with_its_own_status() -> None:
    # The scheduler holds the pipe open for the job's whole life, so it is open at the exit.
    job = subprocess.Popen([sys.executable, "-c", WATCHING], stdin=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    try:
        code = job.wait(timeout=GENEROUS)
        assert job.stderr is not None
        err = job.stderr.read().decode()
    finally:
        assert job.stdin is not None
        job.stdin.close()
        job.kill()
    assert "Fatal Python error" not in err
    assert code == 3, err


def test_a_job_ends_when_its_scheduler_closes_the_pipe() -> None:
    held = "import sys, time; from nscas.runs.job import die_with; die_with(0); time.sleep(600)"
    job = subprocess.Popen([sys.executable, "-c", held], stdin=subprocess.PIPE)
    try:
        assert job.stdin is not None
        job.stdin.close()  # as when the scheduler dies
        assert job.wait(timeout=GENEROUS) == -15  # SIGTERM: a job stops as a stopped one
    finally:
        job.kill()


class _Unanswering:
    """A Ray whose task never ends, cancelled or not (a lost node, a stuck raylet)."""

    def __init__(self) -> None:
        self.cancelled: list[bool] = []
        self.never = threading.Event()

    def get(self, ref: Any) -> tuple[bytes, bytes]:
        self.never.wait()
        return b"", b""

    def cancel(self, ref: Any, *, force: bool = False) -> None:
        self.cancelled.append(force)


def test_a_ray_task_that_never_ends_is_reported_and_let_go(tmp_path: Path) -> None:
    ray = _Unanswering()
    posted: list[dict[str, Any] | None] = []
    task = _Task(ray, object(), posted.append, kill_wait_s=0.05)
    follower = threading.Thread(target=task.follow, args=(tmp_path / "log",), daemon=True)
    follower.start()
    task.kill()  # returns: the run moves on
    assert ray.cancelled == [True]
    assert posted[-1] is None and isinstance(posted[0], dict)
    assert "did not end within 0.05 s of its forced cancel" in posted[0]["message"]
    assert "did not end" in task.why_ended()
    ray.never.set()  # Ray answers at last: nothing more reaches the scheduler
    follower.join(timeout=GENEROUS)
    assert not follower.is_alive()
    assert posted[-1] is None and len(posted) == 2


def test_a_warm_job_takes_its_steps_thread_count_in_the_torch_it_inherits() -> None:
    # torch loaded (as in the warm server) with two threads, then the step's environment.
    code = ("import torch; torch.set_num_threads(2); from nscas.runs.warm import "
            "_apply_thread_count; _apply_thread_count('1'); print(torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=GENEROUS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_without_its_warm_server_a_job_is_started_cold() -> None:
    # WarmJobs.start answers None where the server is not there: the executor starts the job
    # as ``python -m nscas.runs.job`` then.
    closed = WarmJobs()
    closed.close()
    assert closed.start("{}", env={}, events=-1, watch=-1, log=-1) is None
    killed = WarmJobs()
    killed.open()
    server = killed._server
    assert server is not None
    server.kill()
    server.wait(timeout=GENEROUS)
    read_end, write_end = os.pipe()
    try:
        assert killed.start("{}", env={}, events=write_end, watch=read_end,
                            log=write_end) is None
    finally:
        killed.close()
        os.close(read_end)
        os.close(write_end)


def test_a_warm_server_loads_a_recipes_own_modules_each_after_the_libraries_it_imports() -> None:
    # What the server imports for the run's tokenizer steps: the recipe's package only (not
    # the core modules jobs import anyway, nor another recipe's), one library module at a
    # time and before the module whose import would load it in one go.
    loads = _recipe_modules("tokenizer")
    ours = [m for m in loads if m.startswith("nscas.")]
    assert ours == ["nscas.recipes", "nscas.recipes.tokenizer", "nscas.recipes.tokenizer.bpe",
                    "nscas.recipes.tokenizer.recipe"]
    assert loads.index("transformers") < loads.index("transformers.PreTrainedTokenizerFast") \
        < loads.index("nscas.recipes.tokenizer.bpe")
    assert _recipe_modules("no-such-recipe") == []


def test_a_warm_server_tells_its_own_jobs_only() -> None:
    # A child an import starts (ctypes.util.find_library runs ldconfig) is its caller's to
    # wait for: the server's reaping, which runs from SIGCHLD in the middle of imports, never
    # takes it nor tells the scheduler of it.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        other = subprocess.Popen(["true"])
        job = os.fork()
        if job == 0:
            os._exit(3)
        wait_until(lambda: _state(other.pid) == "Z" and _state(job) == "Z", "both to exit")
        jobs = {job}
        _reap(theirs, jobs)
        assert jobs == set() and json.loads(ours.recv(4096)) == {"pid": job, "status": 3}
        assert other.wait(timeout=GENEROUS) == 0  # still its caller's to reap
        ours.setblocking(False)
        with pytest.raises(BlockingIOError):
            ours.recv(4096)  # nothing told of it


def test_an_answer_for_no_job_counts_the_server_gone_and_the_job_starts_cold() -> None:
    warm = WarmJobs()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    waiting = WarmJob()
    warm._waiting[0] = waiting
    listener = threading.Thread(target=warm._listen, args=(ours,), daemon=True)
    listener.start()
    with ours, theirs:
        theirs.send(json.dumps({"pid": 12345, "status": 0}).encode())
        listener.join(timeout=GENEROUS)
        assert not listener.is_alive()
        assert waiting.forked.is_set() and waiting.pid is None  # WarmJobs.start: None, cold
        assert warm.start("{}", env={}, events=-1, watch=-1, log=-1) is None


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
