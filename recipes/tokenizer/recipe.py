"""Recipe ``tokenizer``: a byte-level BPE tokenizer trained on the prepared documents."""

from __future__ import annotations

import json
from dataclasses import dataclass

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.recipes.tokenizer.bpe import DEFAULT_VOCAB_SIZE, train_tokenizer
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenizerParams:
    vocab_size: int = DEFAULT_VOCAB_SIZE
    """Vocabulary size asked of the BPE trainer (it may come out smaller on little text)."""


_ROLES = ("train", "dev", "test", "replay")


def corpus(ctx: RunContext) -> list[str]:
    """The texts of the prepared documents: prompts, targets and replay conversations."""
    subjects = ctx.store.get_record(ctx.inputs["prepared"])["subjects"]
    texts: list[str] = []
    for role in _ROLES:
        if role not in subjects:
            raise RecipeError(f"the prepared commitment has no {role!r} set")
        tasks = ctx.store.get_record(Digest.parse(subjects[role]))
        for line in ctx.store.get_bytes(Digest.parse(tasks["records"])).decode().splitlines():
            rec = json.loads(line)
            if "messages" in rec:
                texts.extend(m["content"] for m in rec["messages"])
            else:
                texts.extend((rec["prompt"], rec["target"]))
    return texts


def run(ctx: RunContext) -> RecipeResult:
    out = train_tokenizer(corpus(ctx), vocab_size=ctx.params.vocab_size, out_dir=ctx.workdir / "tokenizer")
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    tree = ctx.store.put_tree(out)
    return RecipeResult(outputs={"tokenizer": tree},
                        claims={"vocab_size": Claim(value=vocab, verifier="integrity")})


RECIPE = Recipe(
    name="tokenizer",
    version="1",
    params=TokenizerParams,
    inputs={"prepared": InputSpec(kind="commitment/1", doc="the prepare recipe's commitment")},
    outputs=("tokenizer",),
    run=run,
    doc="Train a byte-level BPE tokenizer with a ChatML chat template.",
)
