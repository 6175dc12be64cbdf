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
        [endpoint] = start_replicas(group, served, 1, max_batch=8, max_wait_ms=100.0,
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
    # The sharpened model answers each prompt differently, so equality is not by accident.
    assert len(set(reference.values())) == len(reference)
