"""`nscas verify` of a receipt in a PostgreSQL + S3 store, read by the verifiers' own readers
(psycopg and boto3, no nscas core), from another working directory: passes, and a tampered S3
object is caught."""

from __future__ import annotations

import json
from pathlib import Path

import boto3

from nscas.runs.runner import run_file
from nscas.store.writer import init_store
from tests.pipelines import evaluate_step, tiny_pipeline
from tests.store.services import TeamServices
from tests.team.cli import nscas


def test_verify_a_team_store_and_catch_a_tampered_object(team_services: TeamServices,
                                                        tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    host_a, host_b = tmp_path / "a", tmp_path / "b"
    host_a.mkdir()
    host_b.mkdir()
    config = team_services.config()
    store = init_store(host_a, config)
    (host_a / "p.toml").write_text(tiny_pipeline() + evaluate_step("eval"))
    results = {r.step: r for r in run_file(store, host_a / "p.toml")}
    receipt = results["eval"].receipt
    leaves = [(h, codec) for oid in store.closure([receipt], with_parts=True)
              for h, codec, inline, _, _ in store.leaves(oid) if inline is None]
    store.close()
    toml = host_a / ".nscas" / "store.toml"

    ran = nscas("verify", str(receipt), "--json", cwd=host_b, store=toml)
    assert ran.code == 0, ran.out[-2000:] + ran.err
    checks = json.loads(ran.out)["checks"]
    assert len(checks) > 20 and all(c["status"] != "failed" for c in checks)

    # Flip one byte of a chunk object behind the store's back.
    hex_id, codec = sorted(leaves)[0]
    assert codec in ("raw", "zstd")
    s3 = boto3.client("s3", endpoint_url=team_services.moto.endpoint)
    bucket, _, prefix = config.objects[5:].partition("/")
    key = f"{prefix}/data/{hex_id.hex[:2]}/{hex_id.hex[2:]}"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    bad = nscas("verify", str(receipt), cwd=host_b, store=toml)
    assert bad.code == 1, bad.out[-2000:] + bad.err
    assert hex_id.hex[:16] in bad.out
