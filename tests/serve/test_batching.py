"""Dynamic batching: concurrent requests are generated together, with exactly the tokens that
one-at-a-time greedy generation gives each prompt."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from nscas.recipes.serve.client import LoadPlan, run_phase
from nscas.recipes.serve.processes import ReplicaGroup

from .conftest import MAX_NEW_TOKENS, Served, start_replicas


def one_at_a_time(served: Served) -> dict[str, tuple[int, ...]]:
    import torch

    from nscas.recipes.common.generate import generate_greedy
    from nscas.recipes.common.tokenise import encode_prompt
    from nscas.recipes.init.presets import load_hf_dir

    torch.set_num_threads(1)
    model, tokenizer = load_hf_dir(served.model_dir)
    model.eval()
    out = {}
    for task in served.task_ids:
        [generation] = generate_greedy(
            model, tokenizer, [encode_prompt(tokenizer, served.prompts[task])],
            max_new_tokens=MAX_NEW_TOKENS, batch_size=1, eos_ids={tokenizer.eos_token_id},
            device="cpu")
        out[task] = generation.output_ids
    return out


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_batched_answers_equal_one_at_a_time(served: Served, tmp_path: Path,
                                             precision: str) -> None:
    # On CPU both precisions are FP32; fp32 here proves the option reaches the replica.
    with ReplicaGroup(tmp_path) as group:
        # A batch stays open max_wait after each arrival: a wide window, so that a loaded
        # machine's gaps between the concurrent requests cannot split a batch.
        [endpoint] = start_replicas(group, served, 1, max_batch=8, max_wait_ms=1000.0,
                                    precision=precision)
        plan = LoadPlan(phase="pair", run_id="batch", endpoints=(endpoint,),
                        task_ids=served.task_ids, model_digest=served.model_digest,
                        concurrency=len(served.task_ids), attempts=1)
        attempts = asyncio.run(run_phase(plan))
        stats = httpx.get(f"{endpoint}/stats", trust_env=False).json()
    assert all(a.ok for a in attempts) and len(attempts) == len(served.task_ids)
    # Requests really were batched: at most 8 rows per batch, and some batches of several.
    assert stats["rows"] == len(served.task_ids)
    assert stats["largest_batch"] == 8 and stats["batches"] < len(served.task_ids)
    assert stats["decoding"] == "eager"  # CUDA graphs are for CUDA replicas only
    # Generation time is counted by the replica and fits inside what the client waited.
    assert 0 < stats["generate_seconds"] < max(a.end for a in attempts) - min(a.start for a in attempts)
    reference = one_at_a_time(served)
    got = {a.task_id: a.output_ids for a in attempts}
    assert got == reference
    assert stats["generated_tokens"] == sum(len(ids) for ids in got.values())
    # The sharpened model answers each prompt differently, so equality is not by accident.
    assert len(set(reference.values())) == len(reference)


def test_two_instances_answer_as_one_and_share_the_work(served: Served, tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path) as group:
        [one] = start_replicas(group, served, 1, max_batch=1)
        [two] = start_replicas(group, served, 1, max_batch=1, instances=2)

        def run(endpoint: str, run_id: str) -> dict[str, tuple[int, ...]]:
            plan = LoadPlan(phase="pair", run_id=run_id, endpoints=(endpoint,),
                            task_ids=served.task_ids, model_digest=served.model_digest,
                            concurrency=4, attempts=1)
            attempts = asyncio.run(run_phase(plan))
            assert all(a.ok and a.cached is False for a in attempts)
            return {a.task_id: a.output_ids for a in attempts}

        alone, shared = run(one, "one"), run(two, "two")
        # A retry of an answered request comes from the cache: no instance generates it.
        again = httpx.post(f"{two}/infer", trust_env=False, timeout=60,
                           json={"request_id": "two-pair-0", "task_id": served.task_ids[0]})
        stats = httpx.get(f"{two}/stats", trust_env=False).json()
        single = httpx.get(f"{one}/stats", trust_env=False).json()
    assert shared == alone and len(set(alone.values())) == len(alone)
    assert again.json()["cached"] is True and stats["cache_hits"] == 1
    per = stats["instances"]
    assert [i["index"] for i in per] == [0, 1] and all(i["in_flight"] == 0 for i in per)
    # Four requests in flight at once: each instance served some of them, one row per batch.
    assert all(i["rows"] > 0 and i["batch_sizes"] == {"1": i["rows"]} for i in per)
    assert all(i["generate_seconds"] > 0 for i in per)
    # The totals are what they always were: the instances' counters added up.
    assert stats["rows"] == sum(i["rows"] for i in per) == len(served.task_ids)
    assert stats["batches"] == sum(i["batches"] for i in per)
    assert stats["generate_seconds"] == pytest.approx(sum(i["generate_seconds"] for i in per))
    assert stats["largest_batch"] == 1 and stats["batch_sizes"] == {"1": len(served.task_ids)}
    assert [i["rows"] for i in single["instances"]] == [single["rows"]] == [len(alone)]
