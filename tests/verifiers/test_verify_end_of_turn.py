"""The ``end_of_turn`` claim of a train receipt (docs/format.md §6.9) is rederived by the
verifiers from the base checkpoint's own chat template and tokenizer: the honest value passes,
another token fails."""

from __future__ import annotations

from typing import Any

import pytest

from nscas.objects.digests import Digest
from nscas.verifiers.verify import verify

from . import test_verify_train as train
from .conftest import Pipeline

agreed_digest = train.agreed_digest  # the module's fixture: the seed's ranks' digest


def _receipt(p: Pipeline, digest: str, turn: Any) -> str:
    ranks = [train.rank_entries(p, r, digest) for r in range(train.WORLD)]
    claims = {**train.claims_for(p, ranks[0]),
              "end_of_turn": {"value": turn, "verifier": "template"}}
    return train.train_receipt(p, ranks, claims=claims)


def _honest(p: Pipeline) -> dict[str, Any]:
    """What the train recipe claims for the pipeline's seed: its tokenizer's <|im_end|>."""
    from tokenizers import Tokenizer

    entries = p.record(p.record(p.output("init", "checkpoint"))["files"])["entries"]
    text = p.store.get_bytes(Digest.parse(entries["tokenizer.json"]["id"])).decode()
    return {"token": "<|im_end|>", "id": Tokenizer.from_str(text).token_to_id("<|im_end|>")}


def test_the_honest_token_passes(pipeline: Pipeline, agreed_digest: str) -> None:
    receipt = _receipt(pipeline, agreed_digest, _honest(pipeline))
    assert train.statuses(verify(receipt, store=pipeline.store_dir), receipt)["claims.end_of_turn"] \
        == "passed"


@pytest.mark.parametrize("turn", [{"token": "<|im_start|>", "id": 1}, "<|im_end|>"])
def test_another_token_fails(pipeline: Pipeline, agreed_digest: str, turn: Any) -> None:
    receipt = _receipt(pipeline, agreed_digest, turn)
    assert train.statuses(verify(receipt, store=pipeline.store_dir), receipt)["claims.end_of_turn"] \
        == "failed"
