"""How scheduled jobs end: a job's watch on its scheduler leaves the job's own exit status."""

from __future__ import annotations

import subprocess
import sys

from tests.waiting import GENEROUS

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
