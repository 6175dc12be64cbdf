"""A replica's life: it refuses weights whose digest is wrong, and on SIGTERM it finishes what
it accepted, answers 503 to anything new, and exits 0."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest

from nscas.errors import InvalidInput
from nscas.models.checkpoints import put_checkpoint
from nscas.recipes.serve.processes import (
    REPLICA_MODULE,
    ReplicaGroup,
    ReplicaOptions,
    replica_command,
)
from nscas.recipes.serve.replica import pin_to_cpus
from nscas.store.opening import open_store
from tests.waiting import STARTUP, run_to_end, wait_until

from .conftest import MAX_NEW_TOKENS, Served, start_replicas

SERVE = [sys.executable, "-m", "nscas.cli.serve_model"]


@pytest.mark.slow
def test_sigterm_drains_then_exits_zero(served: Served, tmp_path: Path) -> None:
    # Six requests are held open by their clients (a body sent but for its last byte) until
    # SIGTERM has been sent and the drain is seen in the replica's own in-flight count: no
    # clock decides whether they are still running when the signal comes.
    argv = replica_command(str(served.checkpoint), store_path=served.store_path,
                           tasks=str(served.tasks),
                           options=ReplicaOptions(max_batch=1, max_new_tokens=MAX_NEW_TOKENS))
    argv += ["--body-timeout", "600"]
    with ReplicaGroup(tmp_path) as group:
        [endpoint] = group.wait_ready([group.start(argv)], timeout=STARTUP,
                                      model_digest=served.model_digest)
        replica = group.replicas[0]
        address = urlsplit(endpoint)

        def stats() -> dict[str, Any]:
            answer = httpx.get(f"{endpoint}/stats", trust_env=False, timeout=60)
            assert answer.status_code == 200, answer.text
            return cast(dict[str, Any], answer.json())

        held: list[tuple[http.client.HTTPConnection, bytes]] = []
        for index in range(6):
            body = json.dumps({"request_id": f"drain-{index}",
                               "task_id": served.task_ids[index]}).encode()
            connection = http.client.HTTPConnection(address.hostname or "", address.port,
                                                    timeout=120)
            connection.putrequest("POST", "/infer")
            connection.putheader("Content-Type", "application/json")
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body[:-1])
            held.append((connection, body[-1:]))
        try:
            wait_until(lambda: stats()["in_flight"] == 6, "the six requests to be accepted")
            replica.process.send_signal(signal.SIGTERM)
            wait_until(lambda: stats()["draining"], "the replica to start draining")
            assert stats()["in_flight"] == 6  # the held requests hold the drain open
            late = httpx.post(f"{endpoint}/infer", trust_env=False, timeout=60,
                              json={"request_id": "late", "task_id": served.task_ids[0]})
            health = httpx.get(f"{endpoint}/health", trust_env=False, timeout=60)
            assert replica.process.poll() is None
            for connection, rest in held:
                connection.send(rest)
            answers = [connection.getresponse() for connection, _ in held]
            bodies = [json.loads(answer.read()) for answer in answers]
        finally:
            for connection, _ in held:
                connection.close()
        assert late.status_code == 503
        assert late.json()["error"]["message"] == "the replica is shutting down"
        assert late.json()["error"]["code"] == "shutting_down"
        assert health.status_code == 503
        assert [a.status for a in answers] == [200] * 6
        assert [b["request_id"] for b in bodies] == [f"drain-{i}" for i in range(6)]
        assert not any(b["cached"] for b in bodies)  # each was generated during the drain
        assert replica.process.wait(timeout=120) == 0


def test_a_checkpoint_whose_digest_is_wrong_is_never_served(served: Served,
                                                            tmp_path: Path) -> None:
    import torch

    from nscas.recipes.init.presets import build_model, save_hf_dir

    other_dir = tmp_path / "other"
    with torch.no_grad():
        other = build_model("llama-tiny", vocab_size=_vocab(served), seed=8)
    tok_dir = tmp_path / "tokenizer"  # the served model's tokenizer files, without the model
    tok_dir.mkdir()
    for path in served.model_dir.iterdir():
        if path.name not in ("config.json", "generation_config.json", "model.safetensors"):
            (tok_dir / path.name).write_bytes(path.read_bytes())
    save_hf_dir(other, tok_dir, other_dir)
    with open_store(served.store_path) as store:
        genuine = store.get_record(served.checkpoint)
        other_params = store.get_record(put_checkpoint(store, other_dir, step=0, parent=None))
        forged = store.put_record({**genuine, "params": other_params["params"]})
    argv = replica_command(str(forged), store_path=served.store_path, tasks=None,
                           options=ReplicaOptions())
    done = run_to_end(argv, "the replica of a forged checkpoint", text=True)
    assert done.returncode == 1
    assert "listening" not in done.stdout
    assert done.stderr.startswith("nscas: error: corrupt data in parameters of checkpoint")
    assert f"expected {other_params['params']}, got {served.model_digest}" in done.stderr


def _vocab(served: Served) -> int:
    import json

    return json.loads((served.model_dir / "config.json").read_text())["vocab_size"]


def test_cli_help_and_bad_options() -> None:
    helped = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "Example: nscas serve-model" in helped.stdout
    bad = subprocess.run([*SERVE, "blake3:" + "0" * 64, "--max-batch", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr == "nscas: error: --max-batch must be at least 1, got 0\n"
    bad = subprocess.run([*SERVE, "blake3:" + "0" * 64, "--precision", "fp16"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr == "nscas: error: --precision must be bf16 or fp32, got 'fp16'\n"
    bad = subprocess.run([*SERVE, "blake3:" + "0" * 64, "--cpus", "99999"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.startswith("nscas: error: --cpus names CPUs this process may not use: "
                                 "99999")
    bad = subprocess.run([*SERVE, "blake3:" + "0" * 64, "--instances", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stderr) == (2, "nscas: error: --instances must be from 1 to 8, "
                                               "got -1\n")
    # On the CPU each instance runs --threads torch threads of its own: no more than the CPUs.
    cpus = len(os.sched_getaffinity(0))
    bad = subprocess.run([*SERVE, "blake3:" + "0" * 64, "--instances", "8", "--threads",
                          str(cpus)], capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stderr) == (
        2, f"nscas: error: --instances 8 x --threads {cpus} needs {8 * cpus} CPUs; this "
           f"process may use {cpus}\n")
    bad = subprocess.run([*SERVE, "blake3:" + "0" * 64, "--name", "x" * 257],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--name must be 1 to 256 printable characters" in bad.stderr
    assert "--name" in helped.stdout and "/v1/completions" in helped.stdout


def test_the_replica_entry_point_refuses_bad_options_as_the_command_does(tmp_path: Path) -> None:
    # What the serve recipe starts: the same checks and one-line errors, no CLI behind it.
    replica = [sys.executable, "-m", REPLICA_MODULE, "blake3:" + "0" * 64, "--store", str(tmp_path)]
    for option, value, message in (
            ("--max-batch", "0", "--max-batch must be at least 1, got 0"),
            ("--precision", "fp16", "--precision must be bf16 or fp32, got 'fp16'"),
            ("--name", "a\tb", "--name must be 1 to 256 printable characters, got 'a\\tb'"),
            ("--name", "", "--name must be 1 to 256 printable characters, got ''"),
            ("--instances", "0", "--instances must be from 1 to 8, got 0"),
            ("--instances", "9", "--instances must be from 1 to 8, got 9")):
        bad = subprocess.run([*replica, option, value], capture_output=True, text=True,
                             timeout=60)
        assert (bad.returncode, bad.stderr) == (2, f"nscas: error: {message}\n")


def test_a_pinned_replica_runs_on_its_cpus_only(served: Served, tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    with ReplicaGroup(tmp_path) as group:
        [endpoint] = start_replicas(group, served, 1, cpus=str(cpu))
        answer = httpx.post(f"{endpoint}/infer", trust_env=False, timeout=60,
                            json={"request_id": "pinned", "task_id": served.task_ids[0]})
        assert answer.status_code == 200
        pid = group.replicas[0].pid
        # Every thread of the replica (event loop, generation, torch's), not just its first.
        threads = os.listdir(f"/proc/{pid}/task")
        assert len(threads) > 1
        assert all(os.sched_getaffinity(int(t)) == {cpu} for t in threads)


@pytest.mark.parametrize(("spec", "message"), [
    ("x", "--cpus must list CPUs like 2,3 or 4-7, got 'x'"),
    ("1,", "--cpus must list CPUs like 2,3 or 4-7, got '1,'"),
    ("3-1", "--cpus range '3-1' runs backwards"),
    ("-1", "--cpus must list CPUs like 2,3 or 4-7, got '-1'"),
    ("0,99999", "--cpus names CPUs this process may not use: 99999 (allowed: "),
    ("0-999999999999", "--cpus names CPUs this process may not use: 999999999999 (allowed: "),
    ("\u00b2", "--cpus must list CPUs like 2,3 or 4-7, got '\u00b2'"),
    ("", "--cpus must list CPUs like 2,3 or 4-7, got ''"),
])
def test_bad_cpu_lists_are_refused_and_change_nothing(spec: str, message: str) -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(InvalidInput, match=re.escape(message)):
        pin_to_cpus(spec)
    assert os.sched_getaffinity(0) == before


def test_a_cpu_list_pins_the_calling_process() -> None:
    before = os.sched_getaffinity(0)
    try:
        chosen = sorted(before)[:2]
        spec = f"{chosen[0]}-{chosen[-1]}" if chosen[-1] - chosen[0] == len(chosen) - 1 else (
            ",".join(map(str, chosen)))
        assert pin_to_cpus(spec) == frozenset(chosen)
        assert os.sched_getaffinity(0) == set(chosen)
    finally:
        os.sched_setaffinity(0, before)


def test_the_command_mounts_in_a_group_as_main_registers_it() -> None:
    import typer
    from typer.testing import CliRunner

    from nscas.cli import serve_model

    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        pass

    root.add_typer(serve_model.app)
    result = CliRunner().invoke(root, ["serve-model", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--host", "--port", "--store", "--tasks", "--max-batch", "--max-wait-ms",
                   "--threads", "--instances", "--max-new-tokens", "--cache-size", "--device", "--precision",
                   "--cuda-graphs", "--no-cuda-graphs", "--cpus", "--json"):
        assert option in result.output
