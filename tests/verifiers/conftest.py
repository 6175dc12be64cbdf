"""A real pipeline run (prepare, tokenizer, init, commit, two evaluations) for the verify tests,
and helpers to tamper with its store the way a careful tamperer would: through the store API,
so every new object is well formed and integrity holds.

The tests build data with nscas core; only ``verifiers/`` must stay independent of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nscas.objects.digests import Digest
from nscas.runs.runner import StepResult
from nscas.store.writer import Store
from tests.pipelines import evaluate_step, run_pipeline, tiny_pipeline
from tests.sharing import built_once

PIPELINE = (tiny_pipeline(test=16, dev=8, train=32, replay=8)
            + evaluate_step("eval-seed", max_new_tokens=16)
            + evaluate_step("eval-again", baseline="eval-seed", max_new_tokens=16, batch_size=4))


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """The store of one pipeline run and what each step made."""

    root: Path
    """The directory holding ``.nscas``."""
    store: Store
    steps: dict[str, StepResult]

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def receipt(self, step: str) -> str:
        return str(self.steps[step].receipt)

    def output(self, step: str, name: str) -> str:
        return str(self.steps[step].outputs[name])

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))

    def jsonl(self, oid: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in
                self.store.get_bytes(Digest.parse(oid)).decode().splitlines()]

    def put_jsonl(self, lines: list[dict[str, Any]]) -> str:
        text = "".join(json.dumps(x, separators=(",", ":"), ensure_ascii=False) + "\n"
                       for x in lines)
        return str(self.store.put_bytes(text.encode()))

    def reput(self, oid: str, **changes: Any) -> str:
        """A copy of record ``oid`` with members replaced, stored (a new ID)."""
        record = self.record(oid)
        record.update(changes)
        return str(self.store.put_record(record))

    def copy(self, dest: Path) -> Path:
        """A copy of the whole store directory, for tests that damage it."""
        shutil.copytree(self.store_dir, dest / ".nscas")
        return dest / ".nscas"


def _run_pipeline(root: Path) -> dict[str, StepResult]:
    import torch

    torch.set_num_threads(1)
    store, steps = run_pipeline(root, PIPELINE, name="eval.toml")
    store.close()
    return steps


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """One run of ``PIPELINE`` per test run; a copy of its store for each worker."""
    root, steps = built_once(tmp_path_factory, "verify-pipeline", _run_pipeline)
    store = Store(root / ".nscas")
    yield Pipeline(root=root, store=store, steps=steps)
    store.close()


# ------------------------------------------------------------------ the tamper suite's experiment

_TRAIN = ('recipe = "train"\ninputs = { base = "step.init.checkpoint", documents = '
          '"step.prepare.train", replay = "step.prepare.replay" }\n')
_EVALUATE = 'recipe = "evaluate"\nparams = { max_new_tokens = 8, threads = 1 }\n'
_TESTS = ('tasks = "step.prepare.test", commitment = "step.commit.commitment", retention = '
          '"step.prepare.retention"')
EXPERIMENT = f"""
[[step]]
name = "prepare"
recipe = "prepare"
[step.params]
counts = {{ test = 16, dev = 8, train = 32 }}
replay_count = 8
retention_count = 4
[[step]]
name = "tokenizer"
recipe = "tokenizer"
inputs = {{ prepared = "step.prepare.prepared" }}
params = {{ vocab_size = 512 }}
[[step]]
name = "init"
recipe = "init"
inputs = {{ tokenizer = "step.tokenizer.tokenizer" }}
[[step]]
name = "train-single"
{_TRAIN}params = {{ steps = 4, checkpoint_steps = [2, 4], lr = 1e-3 }}
[[step]]
name = "train-pair"
{_TRAIN}params = {{ steps = 4, checkpoint_steps = [2, 4], lr = 1e-3, world = 2 }}
[[step]]
name = "commit"
recipe = "commit"
[step.inputs]
prepared = "step.prepare.prepared"
seed = "step.init.checkpoint"
clean-single = "step.train-single.checkpoint"
clean-pair = "step.train-pair.checkpoint"
[[step]]
name = "evaluate-seed"
{_EVALUATE}inputs = {{ model = "step.init.checkpoint", {_TESTS} }}
[[step]]
name = "evaluate-single"
{_EVALUATE}inputs = {{ model = "step.train-single.checkpoint", {_TESTS}, baseline = "step.evaluate-seed.receipt" }}
[[step]]
name = "evaluate-pair"
{_EVALUATE}inputs = {{ model = "step.train-pair.checkpoint", {_TESTS}, baseline = "step.evaluate-seed.receipt" }}
[[step]]
name = "serve"
recipe = "serve"
inputs = {{ model = "step.train-pair.checkpoint", tasks = "step.prepare.dev", commitment = "step.commit.commitment" }}
params = {{ replicas = 2, requests = 4, concurrency = 2, warmup = 1, max_new_tokens = 8 }}
[[step]]
name = "report"
recipe = "report"
[step.inputs]
prepare = "step.prepare.receipt"
commit = "step.commit.receipt"
"train.clean-single" = "step.train-single.receipt"
"train.clean-pair" = "step.train-pair.receipt"
"evaluate.seed" = "step.evaluate-seed.receipt"
"evaluate.clean-single" = "step.evaluate-single.receipt"
"evaluate.clean-pair" = "step.evaluate-pair.receipt"
serve = "step.serve.receipt"
[step.outputs]
report = "experiments/coop/report"
"""
"""A demo-like experiment, as small as it gets: every recipe of examples/cooperative-learning
(two trainings, one of them on two ranks, three evaluations, a serve benchmark and the report)
on a tiny model on the CPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Demo:
    """The tamper suite's experiment: its store, and two exports of its report receipt."""

    root: Path
    store: Store
    steps: dict[str, StepResult]
    bundle: Path
    """The full export of the report receipt (weights included)."""
    light: Path
    """The same export with ``--no-weights``."""
    parts: dict[str, Path]
    """Full exports of single receipts, by step (``serve``, ``train-single``,
    ``evaluate-seed``, ``evaluate-single``): forgeries of one run's evidence, verified
    without the report above it (which would catch them by its own recomputation)."""

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    @property
    def report(self) -> str:
        return str(self.steps["report"].receipt)

    def receipt(self, step: str) -> str:
        return str(self.steps[step].receipt)

    def output(self, step: str, name: str) -> str:
        return str(self.steps[step].outputs[name])

    def record(self, oid: str) -> dict[str, Any]:
        return self.store.get_record(Digest.parse(oid))

    def copy_store(self, dest: Path) -> Path:
        """A copy of the store directory (for tests that edit its database); its ``.nscas``."""
        shutil.copytree(self.store_dir, dest / ".nscas")
        return dest / ".nscas"


PARTS = ("serve", "train-single", "evaluate-seed", "evaluate-single")


def build_experiment(root: Path) -> dict[str, StepResult]:
    """Run ``EXPERIMENT`` in a fresh store at ``root`` and export its report twice (and the
    single receipts of ``PARTS``); the steps' results."""
    import torch

    from nscas.bundle.exporting import export_bundle

    torch.set_num_threads(1)
    store, steps = run_pipeline(root, EXPERIMENT, name="experiment.toml")
    try:
        report = steps["report"].receipt
        export_bundle(store, report, root / "bundle")
        export_bundle(store, report, root / "light", weights=False)
        for step in PARTS:
            export_bundle(store, steps[step].receipt, root / f"bundle-{step}")
    finally:
        store.close()
    return steps


def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, StepResult]]:
    """A copy of its own of what ``build_experiment`` made (it runs once per test run): the
    directory holding ``.nscas``, ``experiment.toml`` and the exports, and the steps' results."""
    return built_once(tmp_path_factory, "tamper-experiment", build_experiment)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One run of ``EXPERIMENT`` per test run, a copy for each worker, shared by every tamper
    test of that worker (read-only: tests copy the bundles or the store before changing
    anything)."""
    root, steps = experiment(tmp_path_factory)
    store = Store(root / ".nscas")
    yield Demo(root=root, store=store, steps=steps, bundle=root / "bundle",
               light=root / "light", parts={step: root / f"bundle-{step}" for step in PARTS})
    store.close()


# ------------------------------------------------------------------ running verify as an auditor

NSCAS = Path(sys.executable).with_name("nscas")
"""The installed command (``.venv/bin/nscas`` when the tests run from the venv)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one ``nscas verify`` run said: its exit code, its output and (``--json``) report."""

    code: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None

    def failed(self) -> set[str]:
        assert self.report is not None, (self.code, self.stdout, self.stderr)
        return {c["name"] for c in self.report["checks"] if c["status"] == "failed"}

    def statuses(self) -> dict[str, str]:
        assert self.report is not None, (self.code, self.stdout, self.stderr)
        return {c["name"]: c["status"] for c in self.report["checks"]}

    def check(self, name: str) -> dict[str, Any]:
        assert self.report is not None
        (found,) = [c for c in self.report["checks"] if c["name"] == name]
        return found


def nscas_verify(target: str | Path, *args: str, store: Path | None = None,
                 as_json: bool = True, cwd: Path | None = None) -> Verdict:
    """Run the real command as an auditor would (a subprocess, no store unless ``store``);
    a Python traceback anywhere is a test failure, and so is more than one line on stderr
    when the command refuses its input (exit 2)."""
    env = {k: v for k, v in os.environ.items() if k != "NSCAS_STORE"}
    command = [str(NSCAS)] + (["--store", str(store)] if store else []) + [
        "verify", str(target), *args] + (["--json"] if as_json else [])
    if cwd is None and isinstance(target, Path):
        cwd = target.parent  # no store here or above (a pytest temporary directory)
        while not _is_dir(cwd):
            cwd = cwd.parent
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env,
                          cwd=cwd, timeout=300)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr[-3000:]
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    report = None
    if as_json and done.returncode in (0, 1, 3) and done.stdout.strip():
        report = json.loads(done.stdout)
    return Verdict(done.returncode, done.stdout, done.stderr, report)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long for the file system
        return False


_HONEST: dict[Path, Verdict] = {}


def honest(bundle: Path) -> Verdict:
    """The untouched bundle's verification (once per bundle), asserted to pass: a forgery of
    a bundle that fails anyway would be "caught" for nothing."""
    if bundle not in _HONEST:
        _HONEST[bundle] = verify_here(bundle)
    v = _HONEST[bundle]
    assert v.code == 0, f"the honest bundle {bundle.name} must verify first: {sorted(v.failed())}"
    return v


def verify_here(target: str | Path, *, store: Path | None = None,
                strict: bool = False) -> Verdict:
    """The same verification in this process (much faster than a subprocess): the report's
    JSON form and the exit code the command would give."""
    from nscas.verifiers.core.errors import VerifierError
    from nscas.verifiers.verify import error_exit_code, exit_code, verify

    try:
        report = verify(str(target), store=store, strict=strict)
    except VerifierError as exc:
        return Verdict(error_exit_code(exc), "", exc.message, None)
    return Verdict(exit_code(report), "", "", json.loads(report.to_json()))
