"""Bad input and failing ranks end in one clear error, and no rank is left running."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from nscas.errors import InvalidInput, RecipeError
from nscas.recipes.common.tokenise import DocumentTooLong
from nscas.recipes.train.config import TrainParams, WorkerSpec
from nscas.recipes.train.documents import TrainDocument, read_documents, write_documents
from nscas.recipes.train.launch import StepProgress, check_devices, run_training
from nscas.recipes.train.worker import select_device
from tests.recipes.test_train_fixtures import THREADS, make_documents, make_spec, tiny  # noqa: F401
from tests.waiting import GENEROUS


def _doc(**changes: object) -> TrainDocument:
    values: dict = {"id": "d", "input_ids": (5, 6, 7, 8), "labels": (-100, -100, 7, 8), "weight": 8}
    return TrainDocument(**{**values, **changes})


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(weight=0), "document 'd' (DOCS line 1) has weight 0; weights must be integers 1..16"),
        (_doc(weight=17), "has weight 17"),
        (_doc(labels=(-100, -100, 7)), "has 4 input ids but 3 labels"),
        (_doc(labels=(5, -100, 7, 8)), "labels its first position"),
        (_doc(labels=(-100,) * 4), "has no labelled tokens"),
    ],
)
def test_bad_documents_are_refused(tmp_path: Path, doc: TrainDocument, message: str) -> None:
    path = tmp_path / "docs.jsonl"
    write_documents(path, [doc])
    with pytest.raises(InvalidInput) as caught:
        read_documents([path], max_length=16)
    assert message.replace("DOCS", str(path)) in str(caught.value)


def test_long_documents_are_never_truncated(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    write_documents(path, [_doc()])
    with pytest.raises(DocumentTooLong, match="4 tokens, longer than max_length 3"):
        read_documents([path], max_length=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_where_there_is_none(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    with pytest.raises(InvalidInput, match="device is 'cuda' but no CUDA device is available"):
        check_devices(TrainParams(device="cuda"))
    root, tokenizer, base = tiny
    spec = make_spec(root, docs=make_documents(4, seed=0), base=base, tokenizer=tokenizer,
                     out="cuda", device="cuda", steps=1, batch=2, checkpoint_steps=())
    with pytest.raises(InvalidInput, match="no CUDA device"):
        run_training(spec, env=THREADS)
    assert not (root / "cuda").exists()  # refused before anything was written


def test_a_refused_document_stops_the_run_with_its_name(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    root, tokenizer, base = tiny
    docs = make_documents(4, seed=0)
    docs[2] = TrainDocument(id="bad-weight", input_ids=docs[2].input_ids, labels=docs[2].labels,
                            weight=20)
    spec = make_spec(root, docs=docs, base=base, tokenizer=tokenizer, out="weight",
                     steps=1, batch=2, checkpoint_steps=())
    with pytest.raises(InvalidInput) as caught:
        run_training(spec, env=THREADS)
    assert "training failed on rank 0: document 'bad-weight'" in str(caught.value)
    assert "has weight 20; weights must be integers 1..16" in str(caught.value)
    assert "Traceback" not in str(caught.value)


def _worker_pid(spec_file: Path, rank: int) -> int | None:
    """The pid of the worker of ``rank`` started for ``spec_file`` (a process this test
    started, found through /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"nscas.recipes.train.worker" in cmdline and str(spec_file).encode() in cmdline
                and f"RANK={rank}".encode() in environ):
            return int(entry.name)
    return None


DEAD_RANK_TIMEOUT = 3 * int(GENEROUS)
"""A process-group timeout no stop of the survivors comes near, even on a loaded 2-core box
(they are stopped in seconds): a failure before it is the launcher's doing."""


def assert_killing_rank_one_stops_the_run(spec: WorkerSpec, *, timeout: float,
                                          from_step: int = 0) -> None:
    """SIGKILL rank 1 at the first progress report of ``from_step`` or later: the run must fail
    naming the dead rank and leave no worker behind, before ``timeout`` (the run's
    process-group timeout): the survivors were stopped because a rank died, not because
    their collectives ran out of time. Give a timeout far beyond any stop (``DEAD_RANK_TIMEOUT``)
    so that a loaded machine cannot reach it."""
    spec_file = Path(spec.output_dir) / "spec.json"
    killed: list[float] = []

    def kill_rank_one(progress: StepProgress) -> None:
        if not killed and progress.step >= from_step:
            pid = _worker_pid(spec_file, 1)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(time.monotonic())

    with pytest.raises(RecipeError) as caught:
        run_training(spec, on_progress=kill_rank_one, env=THREADS)
    assert killed and time.monotonic() - killed[0] < timeout
    assert "training rank 1 died (signal SIGKILL)" in str(caught.value)
    assert _worker_pid(spec_file, 0) is None and _worker_pid(spec_file, 1) is None


def test_a_dead_rank_stops_the_others_and_is_named(tiny: tuple[Path, Path, Path]) -> None:  # noqa: F811
    root, tokenizer, base = tiny
    spec = make_spec(root, docs=make_documents(16, seed=2), base=base, tokenizer=tokenizer,
                     out="dies", world=2, steps=5000, batch=2, checkpoint_steps=(),
                     timeout_seconds=DEAD_RANK_TIMEOUT)
    assert_killing_rank_one_stops_the_run(spec, timeout=DEAD_RANK_TIMEOUT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
@pytest.mark.parametrize("deterministic", [True, False])
def test_a_worker_restricts_the_cublas_workspace_only_for_deterministic_runs(
        deterministic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The small fixed workspace deterministic cuBLAS needs also slows its products down.
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.raises(InvalidInput, match="no CUDA device is available here"):
        select_device("cuda", 0, deterministic=deterministic)
    assert ("CUBLAS_WORKSPACE_CONFIG" in os.environ) is deterministic


def test_the_rank_the_launcher_did_not_stop_is_named(tmp_path: Path) -> None:
    """The launcher lists its exits in no fixed order: the rank it stopped with SIGTERM is
    not the one that failed, whichever comes first."""
    from nscas.recipes.train.launch import _failure

    tail = ("[0]:\n  time : x\n  host : h\n  rank : 0 (local_rank: 0)\n  exitcode : -15\n"
            "[1]:\n  time : x\n  host : h\n  rank : 1 (local_rank: 1)\n  exitcode : -9\n")
    error = _failure(tmp_path, 2, 1, tail)
    assert "training rank 1 died (signal SIGKILL)" in str(error)
