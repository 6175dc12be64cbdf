"""A SIGKILLed launcher leaves no training process behind: not torchrun, which lives in a
session of its own, and not the ranks under it (their parent is torchrun, their owner is the
process that started the run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.recipes.test_train_fixtures import THREADS, make_documents, make_spec, tiny  # noqa: F401
from tests.waiting import GENEROUS, wait_until

LAUNCHER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from nscas.recipes.train.config import WorkerSpec
    from nscas.recipes.train.launch import run_training
    spec = WorkerSpec.read(Path(sys.argv[1]))
    def progress(event):
        print("progress", event.step, flush=True)
    run_training(spec, on_progress=progress, env={"OMP_NUM_THREADS": "1"})
""")


def _processes_naming(needle: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_no_rank_outlives_a_sigkilled_launcher(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    root, tokenizer, base = tiny
    docs = make_documents(16, seed=5, lengths=(40, 90))
    spec = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="killed",
                     steps=10_000, batch=4, world=2, warmup=2, checkpoint_steps=(10_000,))
    spec_file = root / "killed-spec.json"
    spec.write(spec_file)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(spec_file)],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, **THREADS})
    try:
        assert launcher.stdout is not None
        assert launcher.stdout.readline().startswith("progress")  # the ranks are training
        children = _processes_naming(spec.output_dir)
        assert len(children) >= 3, children  # torchrun and two ranks
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=GENEROUS)
        wait_until(lambda: not _processes_naming(spec.output_dir), "the ranks to exit")
    finally:
        launcher.kill()
        for pid in _processes_naming(spec.output_dir):
            os.kill(pid, signal.SIGKILL)


def test_training_runs_from_a_directory_holding_a_checkout(
        tiny: tuple[Path, Path, Path], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `python -m` puts the working directory first on sys.path: a checkout's nscas/ (which has
    # no nscas.recipes) would shadow the installed package in every rank.
    from nscas.recipes.train.launch import run_training

    root, tokenizer, base = tiny
    (tmp_path / "nscas").mkdir()
    (tmp_path / "nscas" / "__init__.py").write_text(
        'raise ImportError("a checkout\'s nscas/ shadowed the installed package")\n')
    monkeypatch.chdir(tmp_path)
    docs = make_documents(4, seed=6, lengths=(20, 30))
    spec = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="from-checkout",
                     steps=1, batch=2, world=1, warmup=0, checkpoint_steps=(1,))
    outcome = run_training(spec, env=THREADS)
    assert [c.step for c in outcome.checkpoints] == [1]


def test_one_cpu_rank_trains_in_the_callers_process(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    # No launcher and no rank interpreter to start: the rank runs here, as it would there.
    from nscas.recipes.train.launch import run_training

    root, tokenizer, base = tiny
    docs = make_documents(4, seed=7, lengths=(20, 30))
    spec = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="here",
                     steps=2, batch=2, world=1, warmup=0, checkpoint_steps=(2,))
    others: list[list[int]] = []
    outcome = run_training(spec, env=THREADS,
                           on_progress=lambda _: others.append(_processes_naming(spec.output_dir)))
    assert others == [[], []]  # at each update, no process but this one works on the run
    assert [r.rank for r in outcome.results] == [0]
    assert [c.step for c in outcome.checkpoints] == [2]
