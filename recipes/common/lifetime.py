"""Child processes that do not outlive the ``nscas run`` that started them.

A process group or a session of its own does not die with a SIGKILLed parent, so a replica or a
training rank left behind would keep its port and its memory until someone stopped it. The
starter puts its own pid in the child's environment (``owner_env``); the child, first thing,
calls ``exit_with_owner``, which waits on a pidfd of that process in a daemon thread and ends
the child the moment the owner is gone, however it went. The owner is named by pid rather than
taken as the parent because a training rank's parent is torchrun, which a SIGKILL of
``nscas run`` does not reach either.

A pidfd, not ``PR_SET_PDEATHSIG``: the death signal fires when the *thread* that forked the
child exits, and it does not reach a grandchild; a pidfd names one process and cannot be
confused by pid reuse once open.
"""

from __future__ import annotations

import os
import select
import threading
import time

OWNER_ENV = "NSCAS_OWNER_PID"
# The exit status of a child whose owner died: 128 + SIGKILL, as if it had been killed with it.
ORPHANED = 137


def child_env() -> dict[str, str]:
    """The environment entries of every child process nscas starts: its owner, and
    ``PYTHONSAFEPATH``, so that ``python -m`` run in a directory holding a checkout of nscas
    imports the installed package and not the checkout's ``nscas/`` folder (which has no
    ``nscas.recipes``: that lives in ``recipes/``). The flag is inherited by the processes a
    child starts in turn (torchrun's ranks)."""
    return {**owner_env(), "PYTHONSAFEPATH": "1"}


def owner_env() -> dict[str, str]:
    """The environment entry that ties a child started now to this process."""
    return {OWNER_ENV: str(os.getpid())}


def exit_with_owner(environ: dict[str, str] | None = None) -> int | None:
    """End this process as soon as the process named by ``$NSCAS_OWNER_PID`` is gone.

    Returns the owner's pid, or None where no owner is named (a command run by hand). A child
    whose owner is already gone when it starts exits at once.
    """
    text = (os.environ if environ is None else environ).get(OWNER_ENV)
    if not text:
        return None
    try:
        owner = int(text)
    except ValueError:
        raise ValueError(f"${OWNER_ENV} is not a process id: {text!r}") from None
    try:
        fd = os.pidfd_open(owner) if hasattr(os, "pidfd_open") else None
        os.kill(owner, 0)
    except ProcessLookupError:
        os._exit(ORPHANED)
    threading.Thread(target=_wait_then_exit, args=(owner, fd), daemon=True,
                     name="nscas-owner-watch").start()
    return owner


def _wait_then_exit(owner: int, fd: int | None) -> None:
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():  # a pidfd turns readable when its process has exited
            pass
    else:  # no pidfds (not Linux): ask twice a second whether the owner is still there
        while True:
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                break
            except PermissionError:  # alive, and someone else's
                pass
            time.sleep(0.5)
    # No cleanup: whoever would read this process's results is gone, and a replica's drain
    # or a rank's barrier would only wait for peers that are going too.
    os._exit(ORPHANED)
