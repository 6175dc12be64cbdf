"""The decoding hooks a replica steers its rows with (``generate_greedy``'s ``choose`` and
``on_token``): absent or greedy they change no token; ``on_token`` hears every token of every
row as it is chosen, under the prompt's own index, and ends a row early; both decoders call it
alike (the fixed-shape one runs eagerly on the CPU, as its CUDA graphs replay on CUDA)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nscas.errors import InvalidInput
from nscas.recipes.serve.decoding import RowControl, choose_tokens
from nscas.recipes.serve.protocol import Sampling

from .conftest import Served


@pytest.fixture(scope="module")
def loaded(served: Served) -> Iterator[tuple[Any, Any, list[list[int]]]]:
    import torch

    from nscas.recipes.common.tokenise import encode_prompt
    from nscas.recipes.init.presets import load_hf_dir

    torch.set_num_threads(1)
    model, tokenizer = load_hf_dir(served.model_dir)
    model.eval()
    # Prompts of different lengths, so that sorting by length reorders them.
    prompts = [encode_prompt(tokenizer, served.prompts[t]) for t in served.task_ids[:3]]
    prompts[1] = prompts[1][:5]
    yield model, tokenizer, prompts


@pytest.mark.parametrize("fixed_shape", [False, True])
def test_on_token_hears_every_token_and_ends_a_row(loaded: Any, fixed_shape: bool) -> None:
    from nscas.recipes.common.generate import generate_greedy
    from nscas.recipes.common.static_decode import StaticDecoder

    model, tokenizer, prompts = loaded
    eos = {tokenizer.eos_token_id}
    static = StaticDecoder(model, graphs=False) if fixed_shape else None
    plain = generate_greedy(model, tokenizer, prompts, max_new_tokens=10, eos_ids=eos,
                            device="cpu", static=static)
    heard: list[tuple[int, int]] = []

    def sink(index: int, token: int) -> bool:
        heard.append((index, token))
        return not (index == 2 and sum(1 for i, _ in heard if i == 2) == 3)

    steered = generate_greedy(model, tokenizer, prompts, max_new_tokens=10, eos_ids=eos,
                              device="cpu", static=static, on_token=sink)
    for index, (was, now) in enumerate(zip(plain, steered, strict=True)):
        assert [t for i, t in heard if i == index] == list(now.output_ids)
        expected = was.output_ids[:3] if index == 2 else was.output_ids
        assert now.output_ids == expected  # the same tokens; row 2 ended after its third
    # Tokens are heard step by step across rows, not row after row.
    assert len({i for i, _ in heard[:3]}) == 3


def test_greedy_controls_choose_the_argmax_and_sampling_needs_eager_decoding(
        loaded: Any) -> None:
    from nscas.recipes.common.generate import generate_greedy
    from nscas.recipes.common.static_decode import StaticDecoder

    model, tokenizer, prompts = loaded
    eos = {tokenizer.eos_token_id}
    plain = generate_greedy(model, tokenizer, prompts, max_new_tokens=8, eos_ids=eos,
                            device="cpu")
    controls = [RowControl(tokenizer=tokenizer, eos=frozenset(eos), prompt_tokens=len(p),
                           stop=(), sampling=Sampling(), emit=None) for p in prompts]
    chosen = generate_greedy(model, tokenizer, prompts, max_new_tokens=8, eos_ids=eos,
                             device="cpu",
                             choose=lambda logits, rows: choose_tokens(
                                 logits, [controls[r] for r in rows]))
    assert [g.output_ids for g in chosen] == [g.output_ids for g in plain]
    sampled = [RowControl(tokenizer=tokenizer, eos=frozenset(eos), prompt_tokens=len(p),
                          stop=(), sampling=Sampling(temperature=1.0, seed=3), emit=None)
               for p in prompts]
    draws = generate_greedy(model, tokenizer, prompts, max_new_tokens=8, eos_ids=eos,
                            device="cpu", choose=lambda logits, rows: choose_tokens(
                                logits, [sampled[r] for r in rows]))
    assert [g.output_ids for g in draws] != [g.output_ids for g in plain]
    with pytest.raises(InvalidInput, match="decode eagerly to sample"):
        generate_greedy(model, tokenizer, prompts, eos_ids=eos, device="cpu",
                        static=StaticDecoder(model, graphs=False),
                        choose=lambda logits, rows: logits.argmax(dim=-1))
