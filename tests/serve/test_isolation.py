"""One request never hurts another: sampling parameters, numbers and text are checked at the
edge (400 naming the member), and inside a batch a row whose logits are not finite fails
alone while its neighbours get exactly the answers they get without it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from nscas.recipes.serve.decoding import NonFiniteLogits, RowControl
from nscas.recipes.serve.protocol import Sampling
from nscas.recipes.serve.replica import Replica

from .conftest import MAX_NEW_TOKENS, Served


def _chat(served: Served, index: int, **members: Any) -> dict[str, Any]:
    prompt = served.prompts[served.task_ids[index]]
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_NEW_TOKENS,
            **members}


async def _post_all(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        return list(await asyncio.gather(*(
            client.post(f"{url}/v1/chat/completions", content=b,
                        headers={"Content-Type": "application/json"}) for b in bodies)))


def test_a_tiny_temperature_is_greedy_and_its_batch_is_answered(replica: str,
                                                                served: Served) -> None:
    bodies = [json.dumps(_chat(served, 0, temperature=1e-45)).encode()] + [
        json.dumps(_chat(served, i)).encode() for i in range(1, 6)]
    answers = asyncio.run(_post_all(replica, bodies))
    assert [a.status_code for a in answers] == [200] * 6, [a.text[:200] for a in answers]
    greedy = asyncio.run(_post_all(replica, [json.dumps(_chat(served, 0)).encode()]))[0]
    assert answers[0].json()["nscas"]["output_ids"] == greedy.json()["nscas"]["output_ids"]
    stats = httpx.get(f"{replica}/stats", trust_env=False).json()
    assert stats["largest_batch"] >= 2  # they were batched together


@pytest.mark.parametrize("member", ["max_tokens", "seed", "temperature", "top_p",
                                    "max_completion_tokens", "n"])
@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_of_5000_digits_are_400_naming_the_member(replica: str, served: Served,
                                                            member: str, sign: str) -> None:
    members = {k: v for k, v in _chat(served, 1, temperature=1).items() if k != member}
    digits = (sign + "9" * 5000).encode()
    body = json.dumps(members).encode()[:-1] + b', "' + member.encode() + b'": ' + digits + b"}"
    answer = asyncio.run(_post_all(replica, [body]))[0]
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == member and "5000 digits" in error["message"]


@pytest.mark.parametrize("where", ["content", "role", "stop", "key", "user"])
def test_a_lone_surrogate_is_400_before_anything_reads_it(replica: str, served: Served,
                                                          where: str) -> None:
    text = "\\ud800"
    prompt = json.dumps(served.prompts[served.task_ids[2]])[1:-1]
    message = {"content": f'"{prompt}{text}"', "role": f'"user{text}"'}
    content = message["content"] if where == "content" else f'"{prompt}"'
    role = message["role"] if where == "role" else '"user"'
    extra = {"stop": f', "stop": ["x{text}"]', "key": f', "x{text}": 1',
             "user": f', "user": "{text}"'}.get(where, "")
    body = (f'{{"messages": [{{"role": {role}, "content": {content}}}], "max_tokens": 4'
            f'{extra}}}').encode()
    answer = asyncio.run(_post_all(replica, [body]))[0]
    assert answer.status_code == 400, answer.text[:300]
    assert "not valid Unicode" in answer.json()["error"]["message"]
    assert httpx.get(f"{replica}/health", trust_env=False).status_code == 200


# -- a poisoned row of a batch ------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica_in_process(served: Served) -> Replica:
    import torch

    from nscas.recipes.common.generate import stop_ids
    from nscas.recipes.common.tokenise import encode_prompt
    from nscas.recipes.init.presets import load_hf_dir

    torch.set_num_threads(1)
    model, tokenizer = load_hf_dir(served.model_dir, device="cpu")
    model.eval()
    prompts = {t: tuple(encode_prompt(tokenizer, served.prompts[t])) for t in served.task_ids}
    return Replica(model=model, tokenizer=tokenizer, model_digest=served.model_digest,
                   checkpoint=str(served.checkpoint), prompts=prompts,
                   eos_ids=frozenset(stop_ids(tokenizer)), device="cpu", precision="fp32",
                   max_positions=None)


def _poison_first_row_at(replica: Replica, step: int) -> Any:
    """Make batch row 0's last hidden state NaN at decoding step ``step``: that row's logits
    (and nothing another row reads: its keys and values are computed before)."""
    calls = {"n": 0}

    def hook(module: Any, args: Any, output: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == step + 1:
            output.last_hidden_state[0, -1] = float("nan")
        return output

    return replica.model.get_decoder().register_forward_hook(hook)


def _control(replica: Replica, prompt: tuple[int, ...], sampling: Sampling) -> RowControl:
    return RowControl(tokenizer=replica.tokenizer, eos=replica.eos_ids,
                      prompt_tokens=len(prompt), stop=(), sampling=sampling, emit=None)


@pytest.mark.parametrize("steered", [False, True], ids=["infer-rows", "completion-rows"])
@pytest.mark.parametrize("step", [0, 2])
def test_a_row_with_nan_logits_fails_alone(replica_in_process: Replica, served: Served,
                                           steered: bool, step: int) -> None:
    replica = replica_in_process
    # Batches are decoded shortest prompt first: the poisoned prompt is batch row 0.
    prompts = sorted((replica.prompts[t] for t in served.task_ids[:4]), key=len)
    samplings = [Sampling(), Sampling(temperature=0.8, seed=11), Sampling(),
                 Sampling(temperature=1.0, seed=5)]

    def run(rows: list[int], poison: bool) -> list[Any]:
        controls = [_control(replica, prompts[r], samplings[r]) if steered else None
                    for r in rows]
        handle = _poison_first_row_at(replica, step) if poison else None
        try:
            out = replica.generate([prompts[r] for r in rows], 6, controls)
        finally:
            if handle is not None:
                handle.remove()
        return [o if isinstance(o, Exception) or c is None else c.result
                for o, c in zip(out, controls, strict=True)]

    alone = run([1, 2, 3], poison=False)
    together = run([0, 1, 2, 3], poison=True)
    assert isinstance(together[0], NonFiniteLogits)
    def answers(results: list[Any]) -> list[Any]:
        if steered:
            return [(c.output_ids, c.text, c.finish_reason, c.seed) for c in results]
        return [(g.output_ids, g.text) for g in results]

    assert answers(together[1:]) == answers(alone)  # token for token
