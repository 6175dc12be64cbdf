"""Stacked passes (``micro_batch`` > 1): one padded forward gives every document's own loss
and the same gradient as one pass per document, within FP32 rounding; and the DDP wrapper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from nscas.errors import InvalidInput
from nscas.recipes.train.config import TrainParams
from nscas.recipes.train.loop import (
    Placement,
    compiled_length,
    document_loss_sum,
    documents_loss_sums,
    wrap_ddp,
)
from tests.recipes.test_train_fixtures import make_documents

DEVICE = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(config).to(torch.float32)


def _gradients(model: LlamaForCausalLM, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


class _Spy(torch.nn.Module):
    """The model, noting the attention mask of every call."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model
        self.masks: list[torch.Tensor | None] = []

    def forward(self, **kwargs: Any) -> Any:
        self.masks.append(kwargs.get("attention_mask"))
        return self.model(**kwargs)


def test_padded_rows_give_each_documents_own_loss(model: LlamaForCausalLM) -> None:
    docs = make_documents(5, seed=11, lengths=(6, 40))
    assert len({len(d.input_ids) for d in docs}) > 1  # padding is exercised
    spy = _Spy(model)
    with torch.no_grad():
        stacked = documents_loss_sums(spy, docs, device=DEVICE)
        alone = torch.stack([document_loss_sum(model, d, device=DEVICE) for d in docs])
    assert stacked.dtype == torch.float32 and stacked.shape == (5,)
    torch.testing.assert_close(stacked, alone, rtol=1e-5, atol=1e-5)
    (mask,) = spy.masks
    assert mask is not None
    assert mask.sum(dim=1).tolist() == [len(d.input_ids) for d in docs]


def test_equal_lengths_need_no_mask_and_agree(model: LlamaForCausalLM) -> None:
    docs = make_documents(3, seed=12, lengths=(20, 21))
    spy = _Spy(model)
    with torch.no_grad():
        stacked = documents_loss_sums(spy, docs, device=DEVICE)
        alone = torch.stack([document_loss_sum(model, d, device=DEVICE) for d in docs])
    torch.testing.assert_close(stacked, alone, rtol=1e-5, atol=1e-5)
    assert spy.masks == [None]


def test_one_padded_pass_gives_the_per_document_gradient(model: LlamaForCausalLM) -> None:
    docs = make_documents(4, seed=13, lengths=(8, 30))
    weights = [d.weight for d in docs]
    total = sum(w * d.targets for w, d in zip(weights, docs, strict=True))
    scale = torch.tensor([w / total for w in weights])
    grouped = _gradients(model, (documents_loss_sums(model, docs, device=DEVICE) * scale).sum())
    separate = _gradients(model, sum(
        document_loss_sum(model, d, device=DEVICE) * (w / total)
        for d, w in zip(docs, weights, strict=True)
    ))
    assert grouped.keys() == separate.keys()
    for name in grouped:
        torch.testing.assert_close(grouped[name], separate[name], rtol=1e-4, atol=1e-7, msg=name)


def test_ddp_takes_the_bucket_size_and_keeps_gradients_in_its_buckets(
    model: LlamaForCausalLM, tmp_path: Path
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        place = Placement(rank=0, world=1, device=DEVICE, control=None)
        net = wrap_ddp(model, TrainParams(bucket_mb=3), place=place)
        assert net.bucket_bytes_cap == 3 * 1024 * 1024
        assert net.gradient_as_bucket_view and not net.broadcast_buffers
    finally:
        dist.destroy_process_group()


def test_one_fixed_shape_for_a_compiled_model_changes_no_loss(model: LlamaForCausalLM) -> None:
    docs = make_documents(3, seed=14, lengths=(6, 40))
    spy = _Spy(model)
    with torch.no_grad():
        fixed = documents_loss_sums(spy, docs, device=DEVICE, shape=(5, 64))
        alone = torch.stack([document_loss_sum(model, d, device=DEVICE) for d in docs])
    assert fixed.shape == (3,)  # the two empty rows are dropped
    torch.testing.assert_close(fixed, alone, rtol=1e-5, atol=1e-5)
    (mask,) = spy.masks
    assert mask is not None and tuple(mask.shape) == (5, 64)
    assert mask.sum(dim=1).tolist() == [len(d.input_ids) for d in docs] + [1, 1]


def test_compiled_length_rounds_the_longest_document_up_to_64() -> None:
    docs = make_documents(4, seed=15, lengths=(6, 70))
    longest = max(len(d.input_ids) for d in docs)
    assert compiled_length(docs) % 64 == 0 and 0 <= compiled_length(docs) - longest < 64


def test_compile_needs_stacked_passes() -> None:
    with pytest.raises(InvalidInput, match="compile needs micro_batch of 2 or more"):
        TrainParams(compile=True)
    assert TrainParams(compile=True, micro_batch=2).compile
