"""Batched greedy generation equals one-at-a-time greedy generation, token for token.

The model is a tiny Llama trained in the fixture to recite eight lines, so its logits are
separated by far more than float noise (asserted below): a mismatch means a bug in padding,
masking, position ids or the cache, not a near-tie settled differently.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from nscas.errors import InvalidInput
from nscas.recipes.common.generate import Generation, generate_greedy
from nscas.recipes.common.static_decode import StaticDecoder, unsupported

LINES = (
    "apples are red and pears are green",
    "bright stars shine over quiet hills",
    "copper wires carry current to lamps",
    "dolphins swim near the warm coast",
    "every clock ticks at its own pace",
    "forty ships sailed before the storm",
    "green tea cools slowly in the cup",
    "heavy rain fell on the old roof",
)
# Prompt lengths in tokens, one per line, then two more: all different lengths after sorting
# would be too easy, so some repeat; the last two are whole lines (answer: end of turn at once).
PREFIXES = ((0, 1), (1, 3), (2, 5), (3, 7), (4, 9), (5, 11), (6, 2), (7, 6), (0, 99), (5, 3))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> transformers.PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|pad|>", "<|eot|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(LINES, trainer)
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|eot|>", pad_token="<|pad|>"
    )
    saved: Path = tmp_path_factory.mktemp("tokenizer")
    wrapped.save_pretrained(saved)
    return transformers.PreTrainedTokenizerFast.from_pretrained(saved)


@pytest.fixture(scope="module")
def lines(tokenizer: transformers.PreTrainedTokenizerFast) -> list[list[int]]:
    """Each line's ids followed by the end-of-turn id."""
    return [tokenizer(line)["input_ids"] + [tokenizer.eos_token_id] for line in LINES]


@pytest.fixture(scope="module")
def model(
    tokenizer: transformers.PreTrainedTokenizerFast, lines: list[list[int]]
) -> transformers.LlamaForCausalLM:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
    )
    llama = transformers.LlamaForCausalLM(config)
    width = max(len(ids) for ids in lines)
    inputs = torch.zeros((len(lines), width), dtype=torch.long)
    labels = torch.full((len(lines), width), -100, dtype=torch.long)
    for row, ids in enumerate(lines):
        inputs[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(ids)
    optimizer = torch.optim.AdamW(llama.parameters(), lr=1e-2)
    for _ in range(60):
        loss = llama(input_ids=inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, "the fixture model did not learn its lines"
    return llama.eval()


@pytest.fixture(scope="module")
def prompts(lines: list[list[int]]) -> list[list[int]]:
    return [lines[line][: min(length, len(lines[line]) - 1)] for line, length in PREFIXES]


def reference(model, prompt: list[int], max_new_tokens: int, eos: int) -> tuple[list[int], float]:
    """Greedy without cache or padding: the whole sequence again at every step.

    Also returns the smallest gap between the two best logits on the way.
    """
    ids = list(prompt)
    out: list[int] = []
    smallest_gap = float("inf")
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            best = torch.topk(logits, 2).values
            smallest_gap = min(smallest_gap, (best[0] - best[1]).item())
            token = int(logits.argmax())
            out.append(token)
            ids.append(token)
            if token == eos:
                break
    return out, smallest_gap


def fixed(model, fixed_shape: bool) -> StaticDecoder | None:
    """A ``StaticDecoder`` running its steps eagerly (CPU), or None for the dynamic cache."""
    return StaticDecoder(model, graphs=False) if fixed_shape else None


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["dynamic", "fixed-shape"])
def test_batched_equals_one_at_a_time_and_uncached(model, tokenizer, prompts,
                                                   fixed_shape) -> None:
    static = fixed(model, fixed_shape)
    eot = tokenizer.eos_token_id
    expected = []
    for prompt in prompts:
        ids, gap = reference(model, prompt, 24, eot)
        # Float noise is ~1e-6 here; these gaps leave no room for a tie to flip by chance.
        assert gap > 0.5
        expected.append(tuple(ids))
    lengths = {len(ids) for ids in expected}
    assert len(lengths) >= 5, "rows must finish at different steps to test leaving the batch"
    assert len({len(p) for p in prompts}) >= 7, "prompts must need different padding"
    for batch_size in (1, 3, len(prompts)):
        generations = generate_greedy(
            model,
            tokenizer,
            prompts,
            max_new_tokens=24,
            batch_size=batch_size,
            eos_ids={eot},
            device="cpu",
            static=static,
        )
        assert [g.output_ids for g in generations] == expected, f"batch_size {batch_size}"
        assert [list(g.prompt_ids) for g in generations] == prompts


def test_stops_at_end_of_turn_and_keeps_it_out_of_text(model, tokenizer, lines) -> None:
    eot = tokenizer.eos_token_id
    prompt = lines[7][:6]
    assert tokenizer.decode(prompt) == "heavy rain"
    (generation,) = generate_greedy(
        model, tokenizer, [prompt], max_new_tokens=96, eos_ids={eot}, device="cpu"
    )
    assert generation.output_ids == tuple(lines[7][6:])
    assert generation.output_ids[-1] == eot
    assert generation.text == " fell on the old roof"
    assert generation.ended_with_eos and not generation.hit_token_limit
    assert generation.seconds > 0
    assert generation.tokens_per_second == len(generation.output_ids) / generation.seconds


def test_whole_line_prompt_answers_end_of_turn_at_once(model, tokenizer, lines) -> None:
    eot = tokenizer.eos_token_id
    (generation,) = generate_greedy(model, tokenizer, [lines[0][:-1]], eos_ids={eot}, device="cpu")
    assert generation.output_ids == (eot,)
    assert generation.text == ""
    assert generation.ended_with_eos and not generation.hit_token_limit


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["dynamic", "fixed-shape"])
def test_token_limit(model, tokenizer, lines, prompts, fixed_shape) -> None:
    static = fixed(model, fixed_shape)
    eot = tokenizer.eos_token_id
    full = generate_greedy(model, tokenizer, prompts, eos_ids={eot}, device="cpu", static=static)
    short = generate_greedy(model, tokenizer, prompts, max_new_tokens=4, batch_size=4,
                            eos_ids={eot}, device="cpu", static=static)
    for whole, cut in zip(full, short, strict=True):
        assert cut.output_ids == whole.output_ids[:4]
        if len(whole.output_ids) > 4:
            assert cut.hit_token_limit and not cut.ended_with_eos
            assert cut.text == tokenizer.decode(list(cut.output_ids))
    # The end-of-turn token as the last allowed token: ended with EOS, not cut off.
    answer = tuple(lines[7][6:])
    (exact,) = generate_greedy(
        model,
        tokenizer,
        [lines[7][:6]],
        max_new_tokens=len(answer),
        eos_ids={eot},
        device="cpu",
        static=static,
    )
    assert exact.output_ids == answer
    assert exact.ended_with_eos and not exact.hit_token_limit


def test_first_of_several_end_ids_stops_the_row(model, tokenizer, lines) -> None:
    eot = tokenizer.eos_token_id
    prompt, answer = lines[7][:6], lines[7][6:]
    stop = answer[2]
    assert stop not in answer[:2]
    generations = generate_greedy(
        model, tokenizer, [prompt, lines[3][:4]], eos_ids={eot, stop}, device="cpu"
    )
    assert generations[0].output_ids == tuple(answer[:3])
    assert generations[0].text == tokenizer.decode(answer[:2])
    assert generations[0].ended_with_eos


def test_no_prompts_no_generations(model, tokenizer) -> None:
    assert generate_greedy(model, tokenizer, [], eos_ids={1}, device="cpu") == []


def test_generation_is_frozen() -> None:
    generation = Generation(
        prompt_ids=(1,),
        output_ids=(2,),
        text="x",
        seconds=1.0,
        tokens_per_second=1.0,
        ended_with_eos=False,
        hit_token_limit=True,
    )
    with pytest.raises(AttributeError):
        generation.text = "y"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prompts": [[5], []]}, "prompt 1 is empty"),
        ({"prompts": [[5, 300]]}, "prompt 0 holds 300, not a token id below 300"),
        ({"prompts": [[5, -1]]}, "prompt 0 holds -1"),
        ({"prompts": [[5] * 2000]}, "needs 2095 positions but the model has 2048"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer, not 0"),
        ({"batch_size": True}, "batch_size must be a positive integer, not True"),
        ({"eos_ids": set()}, "eos_ids is empty"),
        ({"eos_ids": {1, 999}}, "end-of-turn id 999 is not a token id below 300"),
        ({"device": "meta"}, "generation runs on 'cpu' or 'cuda', not 'meta'"),
    ],
)
def test_bad_input_is_refused(model, tokenizer, change, message) -> None:
    arguments = {
        "prompts": [[5, 6]],
        "max_new_tokens": 96,
        "batch_size": 16,
        "eos_ids": {1},
        "device": "cpu",
    } | change
    prompts = arguments.pop("prompts")
    with pytest.raises(InvalidInput, match=message):
        generate_greedy(model, tokenizer, prompts, **arguments)


def test_model_in_training_mode_is_refused(model, tokenizer) -> None:
    model.train()
    try:
        with pytest.raises(InvalidInput, match=r"training mode; call model\.eval\(\)"):
            generate_greedy(model, tokenizer, [[5]], eos_ids={1}, device="cpu")
    finally:
        model.eval()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_batched_equals_one_at_a_time(model, tokenizer, prompts) -> None:
    eot = tokenizer.eos_token_id
    on_cpu = generate_greedy(model, tokenizer, prompts, eos_ids={eot}, device="cpu")
    gpu_model = copy.deepcopy(model).to("cuda")
    with pytest.raises(InvalidInput, match="the model is on cuda:0, not on cpu"):
        generate_greedy(gpu_model, tokenizer, prompts, eos_ids={eot}, device="cpu")
    for batch_size in (1, 3, len(prompts)):
        on_gpu = generate_greedy(
            gpu_model, tokenizer, prompts, batch_size=batch_size, eos_ids={eot}, device="cuda"
        )
        assert [g.output_ids for g in on_gpu] == [g.output_ids for g in on_cpu]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fp32_batched_equals_one_at_a_time(model, tokenizer, prompts) -> None:
    eot = tokenizer.eos_token_id
    gpu_model = copy.deepcopy(model).to("cuda")
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        runs = [
            generate_greedy(gpu_model, tokenizer, prompts, batch_size=batch_size, eos_ids={eot},
                            device="cuda", precision="fp32")
            for batch_size in (1, len(prompts))
        ]
        assert torch.backends.cuda.matmul.allow_tf32 is True  # the caller's setting is restored
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert [g.output_ids for g in runs[0]] == [g.output_ids for g in runs[1]]


def test_precision_is_fp32_on_cpu_either_way_and_checked(model, tokenizer, prompts) -> None:
    eot = tokenizer.eos_token_id
    bf16 = generate_greedy(model, tokenizer, prompts[:3], eos_ids={eot}, device="cpu")
    fp32 = generate_greedy(model, tokenizer, prompts[:3], eos_ids={eot}, device="cpu",
                           precision="fp32")
    assert [g.output_ids for g in bf16] == [g.output_ids for g in fp32]
    with pytest.raises(InvalidInput, match="precision must be 'bf16' or 'fp32', not 'fp16'"):
        generate_greedy(model, tokenizer, prompts[:1], eos_ids={eot}, device="cpu",
                        precision="fp16")


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["dynamic", "fixed-shape"])
def test_position_ids_count_from_each_rows_first_real_token(model, tokenizer, lines,
                                                            fixed_shape) -> None:
    static = fixed(model, fixed_shape)
    # Rotary embeddings only see position differences, so a uniform shift of a row's positions
    # cannot change its tokens: the ids are checked where the decoder receives them.
    seen: list[list[list[int]]] = []

    def record(module, args, kwargs) -> None:
        seen.append(kwargs["position_ids"].tolist())

    hook = model.get_decoder().rotary_emb.register_forward_pre_hook(record, with_kwargs=True)
    try:
        generate_greedy(
            model,
            tokenizer,
            [lines[7][:5], lines[7][:2]],
            max_new_tokens=3,
            eos_ids={1},
            device="cpu",
            static=static,
        )
    finally:
        hook.remove()
    if static is not None:
        # Making the decoder's state ran one step first, as a capture's warm-up would.
        assert seen.pop(0) == [[0], [0]]
    # Sorted by length: the two-token prompt is row 0, padded on the left with three positions.
    assert seen == [[[0, 0, 0, 0, 1], [0, 1, 2, 3, 4]], [[2], [5]], [[3], [6]]]


def test_fixed_shape_attention_sees_only_each_rows_real_slots(model, tokenizer, lines) -> None:
    # The cache reserves room beyond what is written; the masks must open exactly the real
    # prompt slots and then one slot per step (padded slots and unwritten room stay shut).
    masks: list[list[list[list[bool]]]] = []

    def record(module, args, kwargs) -> None:
        masks.append(kwargs["attention_mask"][:, 0, -1].tolist())

    static = StaticDecoder(model, graphs=False)
    eot = tokenizer.eos_token_id
    static.decode_batch([(5,), (5, 6, 7)], 2, frozenset({eot}), 0, torch.device("cpu"))
    hook = model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        static.decode_batch([(5, 6, 7), (5,)], 3, frozenset({eot}), 0, torch.device("cpu"))
    finally:
        hook.remove()
    room = 64  # 3 + 3 rounded up to ROOM_STEP
    open_slots = [[[i for i, seen in enumerate(row) if seen] for row in step] for step in masks]
    assert all(len(row) == room for step in masks for row in step)
    # Prefill (last query position), then two steps; the one-token prompt is padded by two.
    assert open_slots == [[[0, 1, 2], [2]], [[0, 1, 2, 3], [2, 3]], [[0, 1, 2, 3, 4], [2, 3, 4]]]


def test_fixed_shape_states_are_kept_per_shape_and_bounded(model, tokenizer, prompts) -> None:
    eot = tokenizer.eos_token_id
    static = StaticDecoder(model, graphs=False, max_shapes=2)
    expected = generate_greedy(model, tokenizer, prompts[:3], eos_ids={eot}, device="cpu")
    for count in (1, 2, 3, 3, 1):
        got = generate_greedy(model, tokenizer, prompts[:count], max_new_tokens=96,
                              batch_size=count, eos_ids={eot}, device="cpu", static=static)
        assert [g.output_ids for g in got] == [g.output_ids for g in expected[:count]]
    # Batch sizes 1, 2, 3 each made a state; only the two most recently used are kept.
    assert [shape[0] for shape in static.shapes] == [3, 1]
    assert static.captures == 0  # never on CPU


def test_fixed_shape_decoder_refuses_what_it_cannot_run(model, tokenizer) -> None:
    other = copy.deepcopy(model)
    with pytest.raises(InvalidInput, match="the static decoder was made for another model"):
        generate_greedy(model, tokenizer, [[5]], eos_ids={1}, device="cpu",
                        static=StaticDecoder(other, graphs=False))
    other.config._attn_implementation = "eager"
    assert unsupported(other) == "its attention implementation is 'eager', not 'sdpa'"
    with pytest.raises(ValueError, match="static decoding cannot run this model: its attention"):
        StaticDecoder(other, graphs=False)
    assert unsupported(model) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_equal_the_dynamic_cache(model, tokenizer, prompts) -> None:
    eot = tokenizer.eos_token_id
    gpu_model = copy.deepcopy(model).to("cuda")
    static = StaticDecoder(gpu_model, graphs=True)
    dynamic = generate_greedy(gpu_model, tokenizer, prompts, batch_size=3, eos_ids={eot},
                              device="cuda", precision="fp32")
    for _ in range(2):  # the second round replays the graphs the first one captured
        for batch_size in (1, 3, len(prompts)):
            got = generate_greedy(gpu_model, tokenizer, prompts, batch_size=batch_size,
                                  eos_ids={eot}, device="cuda", precision="fp32", static=static)
            assert [g.output_ids for g in got] == [g.output_ids for g in dynamic]
        assert static.captures == len(static.shapes) >= 3
    # Under BF16 autocast the same decoder runs its steps eagerly: nothing more is captured.
    captured = static.captures
    bf16 = generate_greedy(gpu_model, tokenizer, prompts, batch_size=3, eos_ids={eot},
                           device="cuda", static=static)
    assert [g.output_ids for g in bf16] == [g.output_ids for g in dynamic]
    assert static.captures == captured


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_instances_on_their_own_streams_and_threads(model, tokenizer, prompts) -> None:
    """A replica's model instances: decoders of two model copies, each captured on and run
    from its own stream and thread at the same time, give what one decoder gives alone."""
    import threading

    eot = tokenizer.eos_token_id
    alone = generate_greedy(copy.deepcopy(model).to("cuda"), tokenizer, prompts, batch_size=1,
                            eos_ids={eot}, device="cuda", precision="fp32")
    streams = [torch.cuda.Stream() for _ in range(2)]
    decoders = [StaticDecoder(copy.deepcopy(model).to("cuda"), graphs=True, stream=stream)
                for stream in streams]
    torch.cuda.synchronize()
    got: dict[int, list[tuple[int, ...]]] = {}
    failed: list[BaseException] = []
    start = threading.Barrier(len(decoders))

    def work(k: int) -> None:
        try:
            start.wait()
            static = decoders[k]
            with torch.cuda.stream(streams[k]):
                outputs = []
                for _ in range(3):  # capture (each thread at once), then replays
                    outputs = [
                        g.output_ids for g in generate_greedy(
                            static.model, tokenizer, prompts, batch_size=1, eos_ids={eot},
                            device="cuda", precision="fp32", static=static)]
            got[k] = outputs
        except BaseException as exc:  # reported below, from the test's own thread
            failed.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(decoders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []
    for k, static in enumerate(decoders):
        assert got[k] == [g.output_ids for g in alone]
        assert static.captures == len(static.shapes) >= 1
