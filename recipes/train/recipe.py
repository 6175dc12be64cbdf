"""Recipe ``train``: weighted DDP training of a checkpoint on a task set plus replay.

The wrapper tokenises once, hands the ranks a spec through PyTorch's launcher, and turns what
they leave (checkpoints, per-rank journals, results) into store objects. Its run directory is
the action's work area (``RunContext.work_area``), which the store keeps until the run succeeds,
so running the same action again after a crash resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from nscas.errors import RecipeError
from nscas.models.checkpoints import is_weights, put_checkpoint
from nscas.objects.digests import Digest
from nscas.recipes.train.config import TrainParams
from nscas.recipes.train.journal import LOSS_CLAIMS
from nscas.runs.recipe import BundleRole, Claim, InputSpec, Recipe, RecipeResult, RunContext
from nscas.store.protocol import ObjectReader, ObjectStore, tree_record

_MODEL_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors.index.json"})


def _records(store: ObjectReader, tasks: dict[str, Any]) -> list[dict[str, Any]]:
    data = store.get_bytes(Digest.parse(tasks["records"]))
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def check_base(store: ObjectStore, base: Digest) -> dict[str, Any]:
    """The base checkpoint, after recomputing its parameter digest from its weight files."""
    from nscas.models.checkpoints import params_record

    record = store.get_record(base)
    entries = store.get_record(Digest.parse(record["files"]))["entries"]
    weights = [Digest.parse(e["id"]) for path, e in sorted(entries.items()) if path.endswith(".safetensors")]
    if not weights:
        raise RecipeError(f"base checkpoint {base} has no safetensors weights")
    recomputed = store.put_record(params_record(store, weights))
    if str(recomputed) != record["params"]:
        raise RecipeError(f"base checkpoint {base}: its weights give parameter digest {recomputed}, "
                          f"not the recorded {record['params']}")
    return record


def _stored_checkpoints(store: ObjectReader, run_dir: Path) -> dict[int, Digest]:
    """The checkpoints earlier sessions of this action stored (their files left the work
    area), each still in the store."""
    from nscas.recipes.train.checkpoints import read_committed

    out = {}
    for step, text in read_committed(run_dir).items():
        oid = Digest.parse(text)
        if not store.has(oid):
            raise RecipeError(f"the checkpoint at step {step} that an earlier run of this action "
                              f"stored ({oid}) is no longer in the store; remove the action's "
                              "work area (nscas gc) and run it again")
        out[step] = oid
    return out


def run(ctx: RunContext) -> RecipeResult:
    from transformers import AutoTokenizer

    from nscas.recipes.common.tokenise import encode_document, end_of_turn
    from nscas.recipes.train.checkpoints import record_committed, trim
    from nscas.recipes.train.config import WorkerSpec
    from nscas.recipes.train.documents import TrainDocument, write_documents
    from nscas.recipes.train.events import CheckpointReady, StepProgress
    from nscas.recipes.train.launch import run_training

    p: TrainParams = ctx.params
    store = ctx.store
    base = ctx.inputs["base"]
    base_record = check_base(store, base)
    documents = store.get_record(ctx.inputs["documents"])
    if documents.get("role") != "train":
        raise RecipeError(f"documents {ctx.inputs['documents']} are a {documents.get('role')!r} set; "
                          "train takes a train-role set (the train or damaged output of prepare)")
    replay = store.get_record(ctx.inputs["replay"])
    if replay.get("role") != "replay":
        raise RecipeError(f"replay {ctx.inputs['replay']} is a {replay.get('role')!r} set, not replay")
    # The seed's files are read where the runner materialised them once for every run of the
    # store (read-only), not copied into each train's scratch: four arms of one seed hold one.
    files = Digest.parse(base_record["files"])
    if ctx.shared_tree is not None:
        base_dir = ctx.shared_tree(files)
    else:
        base_dir = ctx.workdir / "base"
        store.materialise(files, base_dir)
    tok_dir = ctx.workdir / "tokenizer"
    tok_dir.mkdir()
    for f in sorted(base_dir.iterdir()):
        if f.is_file() and f.name not in _MODEL_FILES and not is_weights(f.name):
            shutil.copyfile(f, tok_dir / f.name)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    turn = end_of_turn(tokenizer)  # labels end at the template's turn end (docs/format.md §6.9)
    docs = []
    ctx.progress.start(None, "tokenising")
    for rec in _records(store, documents):
        enc = encode_document(tokenizer, rec, max_length=p.max_length, turn=turn)
        docs.append(TrainDocument.from_encoded(rec["id"], enc, weight=p.grounded_weight))
    for rec in _records(store, replay):
        enc = encode_document(tokenizer, rec, max_length=p.max_length, turn=turn)
        docs.append(TrainDocument.from_encoded(rec["id"], enc, weight=p.replay_weight))
    docs_file = ctx.workdir / "documents.jsonl"
    write_documents(docs_file, docs)
    if ctx.action is None or ctx.work_area is None:
        raise RecipeError("train runs through the runner, which gives it an action and a work area")
    run_dir = ctx.work_area / "run"
    spec = WorkerSpec(base_dir=str(base_dir), documents=(str(docs_file),), output_dir=str(run_dir),
                      tokenizer_dir=str(tok_dir), params=p, run_key=str(ctx.action),
                      stored_before_next=True)
    checkpoints = _stored_checkpoints(store, run_dir)

    def on_checkpoint(ready: CheckpointReady) -> None:
        # What is stored leaves the work area: once a later checkpoint is complete, a resume
        # needs only it, and a stored checkpoint's published state is in the store.
        trim(run_dir, latest=ready.step)
        if ready.step not in checkpoints:  # else an earlier session of this action stored it
            earlier = [s for s in checkpoints if s < ready.step]
            parent = checkpoints[max(earlier)] if earlier else base
            extra = None
            if ready.step in p.publish_state:
                # The published form of the state (safetensors and JSON), linked by the checkpoint.
                published = ready.state_file.parent / "state"
                if not published.is_dir():
                    raise RecipeError(f"checkpoint at step {ready.step} has no published state")
                extra = {"state": str(store.put_tree(published))}
            # Every checkpoint is stored as deltas to the one training started from (where they
            # pay, docs/format.md §5.5.2): one link deep, whatever the number of checkpoints.
            # The torch pickle a resume reads (state.pt) stays in the work area, which survives a
            # crash: storing it too would keep two copies of the optimizer state for good.
            checkpoints[ready.step] = put_checkpoint(store, ready.hf_dir, step=ready.step,
                                                     parent=parent, extra=extra, base=base)
            record_committed(run_dir, ready.step, str(checkpoints[ready.step]))
            trim(run_dir, latest=ready.step)

    loaded: list[bool] = []

    def on_progress(progress: StepProgress) -> None:
        if not loaded and ctx.shared_tree is not None and ctx.unshare_tree is not None:
            # An update was made, so every rank has loaded the seed (they agreed on its digest
            # first): its shared copy (W) need not sit beside this run's checkpoints.
            ctx.unshare_tree(files)
            loaded.append(True)
        ctx.progress.advance(1, loss=round(progress.loss, 4),
                             tokens_per_s=round(progress.tokens_per_second))

    ctx.progress.start(p.steps, f"training ({p.world} rank{'s' if p.world > 1 else ''}, {p.device})")
    # The ranks' and torch's launcher's temporary files go to the scratch directory too, so a
    # killed run leaves nothing outside the store's work areas.
    rank_tmp = ctx.workdir / "tmp"
    rank_tmp.mkdir()
    outcome = run_training(
        spec, on_checkpoint=on_checkpoint, env={"TMPDIR": str(rank_tmp)}, on_progress=on_progress,
    )
    ctx.progress.finish()
    if p.steps not in checkpoints:
        raise RecipeError(f"training ended without a checkpoint at step {p.steps}")
    final = checkpoints[p.steps]
    results = sorted(outcome.results, key=lambda r: r.rank)
    digests = {r.parameter_blake3 for r in results}
    if len(digests) != 1:
        raise RecipeError(f"ranks finished with different parameters: {sorted(digests)}")
    journals = []
    for r in results:
        entries = store.put_file(Path(r.journal))
        journals.append(store.put_record({
            "nscas": "journal/1", "rank": r.rank, "world": r.world, "entries": str(entries),
            "head": r.journal_head, "host": r.host, "loop_seconds": r.loop_seconds,
            "peak_memory_bytes": r.peak_memory_bytes, "resumed_from": r.resumed_from,
        }))
    all_ckpts = store.put_record(tree_record(store, {
        f"step-{step:06d}": oid for step, oid in checkpoints.items()}))
    lead = results[0]
    params_id = store.get_record(final)["params"]
    claims = {
        "parameter_digest": Claim(value=params_id, verifier="parameters"),
        "sha256_stream": Claim(value=lead.sha256_stream, verifier="parameters"),
        "updates": Claim(value=lead.updates, verifier="journals"),
        "update_seconds": Claim(value=lead.update_seconds, verifier="journals"),
        "median_update_seconds": Claim(value=lead.median_update_seconds, verifier="journals"),
        "loop_seconds": Claim(value=lead.loop_seconds, verifier="journals"),
        "peak_memory_bytes": Claim(value=[r.peak_memory_bytes for r in results], verifier="journals"),
        "bytes_communicated": Claim(value=lead.bytes_communicated, verifier="journals"),
        "targets": Claim(value=lead.targets, verifier="journals"),
        "weighted_targets": Claim(value=lead.weighted_targets, verifier="journals"),
        "tokens_per_second": Claim(value=lead.tokens_per_second, verifier="journals"),
        **{name: Claim(value=getattr(lead, name), verifier="journals") for name in LOSS_CLAIMS},
        "end_of_turn": Claim(value=turn.to_json(), verifier="template"),
    }
    if p.diloco:
        claims["outer_steps"] = Claim(value=lead.outer_steps, verifier="journals")
    return RecipeResult(outputs={"checkpoint": final, "checkpoints": all_ckpts}, claims=claims,
                        journals=tuple(journals))


RECIPE = Recipe(
    name="train",
    version="1",
    params=TrainParams,
    inputs={
        "base": InputSpec(kind="checkpoint/1", doc="the checkpoint to start from"),
        "documents": InputSpec(kind="tasks/1", doc="a train-role task set (train or damaged)"),
        "replay": InputSpec(kind="tasks/1", doc="replay conversations"),
    },
    outputs=("checkpoint", "checkpoints"),
    bundle=BundleRole(folder="training", arm_output="checkpoint"),
    run=run,
    doc="Weighted DDP training with per-rank journals, checkpoints and digest agreement.",
)
