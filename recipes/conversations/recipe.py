"""Recipe ``conversations``: disjoint replay and retention sets from a chat corpus (docs/experiment.md §2.1).

Its ``replay`` and ``retention`` outputs are conversation blobs in the format ``prepare``
takes for its inputs of the same names (docs/experiment.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nscas.errors import InvalidInput, RecipeError
from nscas.models.checkpoints import is_weights
from nscas.objects.digests import Digest
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext
from nscas.store.protocol import ObjectReader

VERSION = "1"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationsParams:
    seed: int = 20260913
    """Seed of the order in which candidates are taken."""
    replay_count: int = 256
    """Replay conversations to select."""
    retention_count: int = 128
    """Retention conversations to select (disjoint from replay)."""
    max_length: int = 1024
    """Longest conversation in tokens under the tokenizer's chat template (train's max_length)."""
    min_turns: int = 1
    """Fewest user/assistant exchanges a conversation must have."""

    def validate(self) -> str | None:
        if self.replay_count < 0 or self.retention_count < 0:
            return "replay_count and retention_count must not be negative"
        if self.replay_count + self.retention_count == 0:
            return "replay_count and retention_count select nothing"
        if self.max_length < 1 or self.min_turns < 1:
            return "max_length and min_turns must be at least 1"
        return None


def tokenizer_tree(store: ObjectReader, oid: Digest) -> Digest:
    """The tokenizer files of a tokenizer ``tree/1`` or of a ``checkpoint/1``."""
    try:
        record = store.get_record(oid)
    except InvalidInput:
        raise RecipeError(f"tokenizer input {oid} is a blob, not a tree/1 or checkpoint/1") from None
    kind = record.get("nscas")
    if kind == "checkpoint/1":
        return Digest.parse(record["files"])
    if kind == "tree/1":
        return oid
    raise RecipeError(f"tokenizer input {oid} is a {kind}, not a tree/1 or checkpoint/1")


def materialise_tokenizer(store: ObjectReader, tree: Digest, dest: Path) -> None:
    """Every file of a tokenizer or checkpoint tree but its weights, written under ``dest``
    (new): what ``AutoTokenizer.from_pretrained`` reads, without a model's worth of disk."""
    dest.mkdir(parents=True)
    for rel, entry in sorted(store.get_record(tree)["entries"].items()):
        if not is_weights(rel):
            store.materialise(Digest.parse(entry["id"]), dest / rel)


def run(ctx: RunContext) -> RecipeResult:
    from transformers import AutoTokenizer

    from nscas.recipes.common.conversations import conversations_jsonl, validate_conversations
    from nscas.recipes.common.tokenise import DocumentTooLong, encode_document, end_of_turn

    from .corpus import Candidate, read_corpus, select

    p: ConversationsParams = ctx.params
    store = ctx.store
    tok_dir = ctx.workdir / "tokenizer"
    materialise_tokenizer(store, tokenizer_tree(store, ctx.inputs["tokenizer"]), tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    turn = end_of_turn(tokenizer)
    ctx.progress.start(None, "reading the corpus")
    corpus = read_corpus(store.get_bytes(ctx.inputs["corpus"]), min_turns=p.min_turns)

    def length(candidate: Candidate) -> int:
        # The same encoding train uses: a conversation that fits also trains (labels included).
        try:
            return len(encode_document(tokenizer, candidate.record(),
                                       max_length=p.max_length, turn=turn).input_ids)
        except DocumentTooLong as exc:
            return exc.length

    ctx.progress.note(f"{len(corpus.candidates)} eligible conversations of {corpus.entries}")
    chosen = select(corpus.candidates, seed=p.seed, replay=p.replay_count,
                    retention=p.retention_count, length=length, max_length=p.max_length)
    outputs = {}
    for kind in ("replay", "retention"):
        data = conversations_jsonl(c.record() for c in getattr(chosen, kind))
        validate_conversations(data)  # what prepare will accept
        outputs[kind] = store.put_bytes(data)
    ctx.progress.finish()
    claims = {
        "entries": corpus.entries, "complete": corpus.complete,
        "unread_bytes": corpus.unread_bytes, "skipped": corpus.skipped,
        "eligible": len(corpus.candidates), "considered": chosen.considered,
        "rejected": chosen.rejected, "replay_count": len(chosen.replay),
        "retention_count": len(chosen.retention), "replay_tokens": chosen.tokens["replay"],
        "retention_tokens": chosen.tokens["retention"],
    }
    return RecipeResult(outputs=outputs,
                        claims={k: Claim(value=v, verifier="selection") for k, v in claims.items()})


RECIPE = Recipe(
    name="conversations",
    version=VERSION,
    params=ConversationsParams,
    inputs={
        "corpus": InputSpec(kind="blob", doc="a ShareGPT-format JSON corpus (e.g. ShareGPT V3)"),
        "tokenizer": InputSpec(kind=None, doc="a checkpoint/1 or tokenizer tree/1: its chat "
                                              "template measures each conversation"),
    },
    outputs=("replay", "retention"),
    run=run,
    doc="Seeded, disjoint replay and retention conversations from a corpus, fitting max_length.",
)
