"""Ranks agree on parameter digests, and a disagreement names both digests and the tensor."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import blake3
import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from nscas.recipes.common.digests import tensor_bytes
from nscas.recipes.train.exchange import (
    HostStaging,
    ParameterMismatch,
    agree_on_parameters,
    first_difference,
    parameter_digest,
)
from tests.waiting import STARTUP

BROKEN = "model.layers.1.mlp.up_proj.weight"


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config)


def _rank(rank: int, store: str, out: str, damage: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = _model()
    if damage and rank == 1:
        with torch.no_grad():
            model.get_parameter(BROKEN)[0, 0] += 1e-3
    try:
        report = {"agreed": agree_on_parameters(model, group=None, where="after loading")}
    except ParameterMismatch as exc:
        report = {"error": str(exc), "digests": exc.digests, "tensor": exc.tensor}
    report["own"] = parameter_digest(model).hex()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def _run_pair(tmp_path: Path, *, damage: bool) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    store = tmp_path / f"store-{damage}"
    procs = [ctx.Process(target=_rank, args=(r, str(store), str(tmp_path), damage)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=STARTUP)  # each imports torch and joins a gloo group: slow when loaded
        assert p.exitcode == 0, (p.exitcode, f"not done within {STARTUP:g} s")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_digest_is_blake3_of_the_raw_parameter_bytes() -> None:
    model = _model()
    hasher = blake3.blake3()
    for _name, param in model.named_parameters():
        hasher.update(tensor_bytes(param))
    assert parameter_digest(model) == hasher.digest()
    assert len(parameter_digest(model)) == 32


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20], ids=["1B", "7B", "4KiB", "1MiB"])
def test_a_staging_buffer_of_any_size_gives_the_same_digest(size: int) -> None:
    """The GPU path (parameters copied a buffer-full at a time into one reused host buffer,
    hashed on several threads) is byte for byte the in-place one; here with a plain buffer,
    smaller than one tensor or larger than the model, reused for two digests."""
    model = _model()
    staging = HostStaging(size, pin=False)
    params = [param for _name, param in model.named_parameters()]
    for _ in range(2):
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        staging.hash_into(hasher, params)
        assert hasher.digest() == parameter_digest(model)
    assert HostStaging.for_model(model) is None  # a CPU model is hashed where it is


def test_first_difference_names_the_first_differing_tensor() -> None:
    a, b, c = b"\1" * 32, b"\2" * 32, b"\3" * 32
    assert first_difference(["x", "y", "z"], [a + b + c, a + b + c]) is None
    assert first_difference(["x", "y", "z"], [a + b + c, a + c + a]) == "y"


@pytest.mark.slow
def test_ranks_agree_or_name_both_digests_and_the_tensor(tmp_path: Path) -> None:
    same = _run_pair(tmp_path, damage=False)
    assert same[0]["agreed"] == same[1]["agreed"] == same[0]["own"] == same[1]["own"]

    differ = _run_pair(tmp_path, damage=True)
    own = [differ[0]["own"], differ[1]["own"]]
    assert own[0] != own[1]
    for report in differ:
        assert report["digests"] == own and report["tensor"] == BROKEN
        assert report["error"] == (
            f"ranks disagree on the parameters after loading: rank 0 has {own[0]}, "
            f"rank 1 has {own[1]}; first differing tensor: {BROKEN}"
        )
