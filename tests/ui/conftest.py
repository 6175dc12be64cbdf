"""Stores for the UI tests: a small real experiment (``demo``: prepare → train → commit → two
evaluations, one against the other) and a hostile store (``hostile``) whose records and blobs
hold HTML and script in every field the pages show.

Both are built once per session; tests only read them (the UI opens them read-only).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nscas.objects.digests import Digest
from nscas.runs.runner import StepResult
from nscas.store.writer import Store, init_store
from tests.pipelines import evaluate_step, run_pipeline, step, tiny_pipeline
from tests.sharing import built_once
from tests.waiting import GENEROUS

DEMO = (tiny_pipeline(test=8, dev=4, train=16, replay=4)
        + step("train", "train", inputs={"base": "step.init.checkpoint",
                                         "documents": "step.prepare.train",
                                         "replay": "step.prepare.replay"},
               params={"steps": 2, "checkpoint_steps": [2], "lr": 1e-3},
               outputs={"checkpoint": "experiments/ui/trained"})
        + evaluate_step("eval-seed", max_new_tokens=8, threads=1)
        + evaluate_step("eval-again", baseline="eval-seed", max_new_tokens=8, threads=1))
"""The demo experiment: every page has something real to show (journals from ``train``,
paired answers from the two evaluations, a ref on an output)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Demo:
    root: Path
    store: Store
    steps: dict[str, StepResult]

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"

    def receipt(self, step_name: str) -> Digest:
        return self.steps[step_name].receipt

    def output(self, step_name: str, name: str) -> Digest:
        return self.steps[step_name].outputs[name]

    def record(self, oid: Digest | str) -> dict[str, Any]:
        return self.store.get_record(oid if isinstance(oid, Digest) else Digest.parse(oid))


def _run_demo(root: Path) -> dict[str, StepResult]:
    import torch

    torch.set_num_threads(1)
    store, steps = run_pipeline(root, DEMO, name="ui.toml")
    store.close()
    return steps


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One run of ``DEMO`` per test run; a copy of its store for each worker."""
    root, steps = built_once(tmp_path_factory, "ui-demo", _run_demo)
    store = Store(root / ".nscas")
    yield Demo(root=root, store=store, steps=steps)
    store.close()


# ------------------------------------------------------------------ the hostile store

PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
"""In every string a page shows: escaped, it is text; run, it sets ``window.__pwned``."""
ATTR = '"><svg onload="window.__pwned=3">'


@dataclass(frozen=True, slots=True, kw_only=True)
class Hostile:
    root: Path
    receipt: Digest
    """A failed-looking 'evaluate' receipt whose every string is a payload."""
    baseline: Digest
    """A second such receipt on the same tasks (for the comparison page)."""
    action: Digest
    tree: Digest
    tasks: Digest
    html: Digest
    """An HTML page with a script (previewed in a sandboxed frame)."""
    svg: Digest
    """An SVG image with a script (previewed as <img>)."""
    jsonl: Digest
    text: Digest

    @property
    def store_dir(self) -> Path:
        return self.root / ".nscas"


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def build_hostile(root: Path) -> Hostile:
    store = init_store(root)
    try:
        p = PAYLOAD
        html = store.put_bytes(f"<!DOCTYPE html><html><body><h1>{p}</h1>"
                               "<script>parent.__pwned=4; window.top.__pwned=4</script>"
                               "</body></html>".encode())
        svg = store.put_bytes(b'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">'
                              b'<script>parent.__pwned=5</script><rect width="40" height="40"/>'
                              b"</svg>")
        text = store.put_bytes(f"plain text {p} {ATTR}\n".encode())
        rows = [{"id": f"t{i}", p: ATTR, "prompt": p, "target": p,
                 "task": {"family": f"fam{p}", "variant": 0}} for i in range(3)]
        jsonl = store.put_bytes(_jsonl(rows))
        src = root / "src"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "page.html").write_bytes(store.get_bytes(html))
        (src / "image.svg").write_bytes(store.get_bytes(svg))
        (src / '<img src=x onerror="window.__pwned=6">.txt').write_bytes(b"named")
        tree = store.put_tree(src)
        tasks = store.put_record({"nscas": "tasks/1", "role": "test", "records": str(jsonl),
                                  "count": 3, "ids": ["t0", "t1", "t2"], "note": p})
        action = store.put_record({"nscas": "action/1", "recipe": "evaluate@2",
                                   "code": str(tree), "inputs": {"tasks": str(tasks)},
                                   "params": {p: ATTR, "nested": {"x": p}}})
        env = store.put_record({"nscas": "environment/1", "python": p, "platform": ATTR,
                                "packages": {p: p}, "torch": None, "devices": [],
                                "determinism": {}})

        def receipt(correct: list[bool]) -> Digest:
            gens = store.put_bytes(_jsonl([{"id": f"t{i}", "text": p} for i in range(3)]))
            checks = store.put_bytes(_jsonl([
                {"id": f"t{i}", "family": f"fam{p}", "variant": 0, "correct": c,
                 "valid_json_object": False, "reason": p} for i, c in enumerate(correct)]))
            return store.put_record({
                "nscas": "receipt/1", "action": str(action), "environment": str(env),
                "outputs": {"generations": str(gens), "checks": str(checks), "page": str(html)},
                "journals": [], "status": "succeeded", "pipeline": p, "step": ATTR,
                "started": "2026-01-01T00:00:00+00:00", "finished": p,
                "claims": {"correct": {"value": sum(correct), "verifier": "answers"},
                           "note": {"value": p, "verifier": p}}})

        baseline = receipt([False, True, False])
        main = receipt([True, True, False])
        store.ref_set("hostile/receipt", main, message=p)
        store.ref_set("hostile/page", html)
    finally:
        store.close()
    return Hostile(root=root, receipt=main, baseline=baseline, action=action, tree=tree,
                   tasks=tasks, html=html, svg=svg, jsonl=jsonl, text=text)


@pytest.fixture(scope="session")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return build_hostile(tmp_path_factory.mktemp("ui-hostile"))


# ------------------------------------------------------------------ a real `nscas ui`

NSCAS = Path(sys.executable).with_name("nscas")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class Server:
    url: str
    process: subprocess.Popen[str]


def start_ui(store: Path) -> Server:
    """``nscas ui`` as a subprocess on a loopback port the system picks (no race with another
    worker's server), once it says it listens."""
    proc = subprocess.Popen([str(NSCAS), "--store", str(store), "ui", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening "):
        proc.kill()
        raise AssertionError(f"nscas ui did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return Server(url=line.split()[1].rstrip("/"), process=proc)


def stop_ui(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=GENEROUS)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    deadline = time.monotonic() + 1
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
