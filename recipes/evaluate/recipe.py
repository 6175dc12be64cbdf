"""Recipe ``evaluate``: greedy answers retained, scored by the strict checker, paired statistics."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from typing import Any, Literal

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.recipes.evaluate.lines import (
    Answer,
    Checked,
    ProbeLoss,
    Timing,
    dump_lines,
    read_lines,
    timing_ids,
)
from nscas.runs.recipe import (
    BundleRole,
    Claim,
    InputSpec,
    Recipe,
    RecipeResult,
    RunContext,
    blob_part,
)
from nscas.store.protocol import ObjectReader


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluateParams:
    max_new_tokens: int = 96
    """Greedy decoding bound per answer."""
    batch_size: int = 16
    """Prompts generated together (outputs equal one-at-a-time generation)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where to run; BF16 autocast on CUDA, FP32 on CPU."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """On CUDA, "fp32" turns autocast and TF32 off so that batching moves no token (slower)."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""

    def validate(self) -> str | None:
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.threads < 0:
            return "max_new_tokens and batch_size must be positive, threads not negative"
        return None


def _jsonl(store: ObjectReader, oid: Digest) -> list[dict[str, Any]]:
    return [json.loads(line) for line in store.get_bytes(oid).decode("utf-8").splitlines()]


def _records(store: ObjectReader, tasks_id: Digest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rec = store.get_record(tasks_id)
    return rec, _jsonl(store, Digest.parse(rec["records"]))


def check_order(ctx: RunContext, tasks: dict[str, Any]) -> None:
    """Test-role evaluations need a commitment that already names the model: checked first."""
    store, model = ctx.store, ctx.inputs["model"]
    if tasks["role"] != "test":
        return
    if "commitment" not in ctx.inputs:
        raise RecipeError("evaluating the test role needs a 'commitment' input that fixes the candidate first")
    subjects = store.get_record(ctx.inputs["commitment"])["subjects"]
    if str(model) not in subjects.values():
        raise RecipeError(f"model {model} is not among the commitment's subjects "
                          f"({', '.join(sorted(subjects))}); commit it before test-set scoring")


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """The earlier evaluation this one is compared with: its checks and retention losses."""

    checks: tuple[Checked, ...]
    losses: tuple[ProbeLoss, ...] | None
    """Its retention losses; None if it measured none."""


def _baseline(ctx: RunContext, ids: list[str], probe_ids: list[str] | None) -> Baseline | None:
    """The baseline, once its task ids (and probe ids) are known to match ours."""
    if "baseline" not in ctx.inputs:
        return None
    store = ctx.store
    rec = store.get_record(ctx.inputs["baseline"])
    action = store.get_record(Digest.parse(rec["action"]))
    if not action["recipe"].startswith("evaluate@") or rec["status"] != "succeeded":
        raise RecipeError(f"baseline {ctx.inputs['baseline']} is not a succeeded evaluate receipt")
    outputs = {k: Digest.parse(v) for k, v in rec["outputs"].items()}
    checks = tuple(read_lines(Checked, store.get_bytes(outputs["checks"]), "baseline checks"))
    losses = (tuple(read_lines(ProbeLoss, store.get_bytes(outputs["retention"]),
                               "baseline retention"))
              if "retention" in outputs else None)
    base_ids = [c.id for c in checks]
    if base_ids != ids:
        same = set(base_ids) == set(ids)
        raise RecipeError("the baseline evaluated " + ("the same task ids in another order" if same
                          else f"other task ids ({len(base_ids)} vs {len(ids)})") + "; compare like with like")
    # Checked here, before any generation, rather than by the statistics after it.
    if probe_ids is not None:
        if losses is None:
            raise RecipeError("a retention set was given but the baseline has no retention losses")
        base_probes = [x.id for x in losses]
        if base_probes != probe_ids:
            same = set(base_probes) == set(probe_ids)
            raise RecipeError("the retention set holds " + (
                "the baseline's probe ids in another order" if same
                else f"other probe ids than the baseline's ({len(probe_ids)} vs {len(base_probes)})")
                + "; compare like with like")
    return Baseline(checks=checks, losses=losses)


def run(ctx: RunContext) -> RecipeResult:
    import torch

    from nscas.models.paired import contract, paired, retention
    from nscas.recipes.common.checker import check
    from nscas.recipes.common.generate import generate_greedy, stop_ids
    from nscas.recipes.common.tokenise import encode_document, encode_prompt, retention_loss
    from nscas.recipes.init.presets import load_hf_dir

    p: EvaluateParams = ctx.params
    store = ctx.store
    tasks, records = _records(store, ctx.inputs["tasks"])
    if not records:
        raise RecipeError(f"task set {ctx.inputs['tasks']} is empty; nothing to evaluate")
    check_order(ctx, tasks)
    ids = [r["id"] for r in records]
    probes = None
    if "retention" in ctx.inputs:
        probes = _jsonl(store, Digest.parse(store.get_record(ctx.inputs["retention"])["records"]))
        if not probes:
            raise RecipeError(f"retention set {ctx.inputs['retention']} is empty; "
                              "there is no loss to measure")
    baseline = _baseline(ctx, ids, None if probes is None else [pr["id"] for pr in probes])
    if p.device == "cuda" and not torch.cuda.is_available():
        raise RecipeError("device 'cuda' was asked for but torch sees no CUDA device")
    if p.threads:
        torch.set_num_threads(p.threads)
    model_dir = ctx.workdir / "model"
    store.materialise(Digest.parse(store.get_record(ctx.inputs["model"])["files"]), model_dir)
    model, tokenizer = load_hf_dir(model_dir, device=p.device)
    shutil.rmtree(model_dir)  # loaded: its disk is free while the model generates
    model.eval()
    limit = model.config.max_position_embeddings
    prompts = []
    for r in records:
        ids_ = encode_prompt(tokenizer, r["prompt"])
        if len(ids_) + p.max_new_tokens > limit:
            raise RecipeError(f"task {r['id']}: prompt of {len(ids_)} tokens plus {p.max_new_tokens} "
                              f"new tokens exceeds the model's {limit} positions (no truncation)")
        prompts.append(ids_)
    eos = stop_ids(tokenizer)  # the template's end of turn, and eos (docs/format.md §6.9)
    ctx.progress.start(len(prompts), "generating")
    gens = []
    for start in range(0, len(prompts), p.batch_size * 4):
        chunk = prompts[start:start + p.batch_size * 4]
        gens += generate_greedy(model, tokenizer, chunk, max_new_tokens=p.max_new_tokens,
                                batch_size=p.batch_size, eos_ids=eos, device=p.device,
                                precision=p.precision)
        ctx.progress.advance(len(chunk))
    answers = [Answer(id=r["id"], generation=g) for r, g in zip(records, gens, strict=True)]
    checks = [Checked(id=r["id"], family=r["task"]["family"], variant=r["task"]["variant"],
                      result=check(g.text, r["target"])) for r, g in zip(records, gens, strict=True)]
    outcomes = [(c.id, c.result.correct) for c in checks]
    outputs = {"generations": store.put_bytes(dump_lines(answers)),
               "checks": store.put_bytes(dump_lines(checks)),
               "timings": store.put_bytes(dump_lines(
                   Timing(id=r["id"], generation=g) for r, g in zip(records, gens, strict=True)))}
    claims = _score_claims(checks)
    losses: list[ProbeLoss] = []
    if probes is not None:
        losses = [ProbeLoss(id=pr["id"], loss=retention_loss(
                      model, encode_document(tokenizer, pr, max_length=limit)))
                  for pr in probes]
        outputs["retention"] = store.put_bytes(dump_lines(losses))
        claims["retention_mean_loss"] = Claim(value=sum(x.loss for x in losses) / len(losses),
                                              verifier="statistics")
    if baseline is not None:
        cmp = paired([(c.id, c.result.correct) for c in baseline.checks], outcomes)
        claims.update({
            "wins": Claim(value=cmp.wins, verifier="statistics"),
            "losses": Claim(value=cmp.losses, verifier="statistics"),
            "accuracy_gain": Claim(value=float(cmp.gain), verifier="statistics"),
            "exact_one_sided_p": Claim(value=cmp.test.p_float, verifier="statistics"),
        })
        upper = None
        if probes is not None and baseline.losses is not None:
            ret = retention([(x.id, x.loss) for x in baseline.losses],
                            [(x.id, x.loss) for x in losses])
            upper = ret.upper
            claims.update({
                "retention_mean_change": Claim(value=ret.mean, verifier="statistics"),
                "retention_standard_error": Claim(value=ret.se, verifier="statistics"),
                "retention_upper": Claim(value=ret.upper, verifier="statistics"),
                "retention_improved": Claim(value=ret.improved, verifier="statistics"),
                "retention_worsened": Claim(value=ret.worsened, verifier="statistics"),
            })
        verdict = contract(cmp.gain, cmp.test.p, upper)
        claims["contract"] = Claim(value={k: v["passed"] for k, v in verdict.items() if k != "passed"},
                                   verifier="statistics")
    return RecipeResult(outputs=outputs, claims=claims)


def _score_claims(checks: list[Checked]) -> dict[str, Claim]:
    by_family: dict[str, int] = {}
    by_variant: dict[str, int] = {}
    for c in checks:
        by_family.setdefault(c.family, 0)
        by_variant.setdefault(str(c.variant), 0)
        if c.result.correct:
            by_family[c.family] += 1
            by_variant[str(c.variant)] += 1
    return {
        "documents": Claim(value=len(checks), verifier="answers"),
        "correct": Claim(value=sum(c.result.correct for c in checks), verifier="answers"),
        "valid_json_objects": Claim(value=sum(c.result.valid_json_object for c in checks),
                                    verifier="answers"),
        "correct_by_family": Claim(value=by_family, verifier="answers"),
        "correct_by_variant": Claim(value=by_variant, verifier="answers"),
    }


RECIPE = Recipe(
    name="evaluate",
    version="2",
    params=EvaluateParams,
    inputs={
        "model": InputSpec(kind="checkpoint/1", doc="the checkpoint to evaluate"),
        "tasks": InputSpec(kind="tasks/1", doc="a task set (test role needs a commitment)"),
        "commitment": InputSpec(kind="commitment/1", required=False, doc="candidates fixed before test scoring"),
        "baseline": InputSpec(kind="receipt/1", required=False, doc="an earlier evaluation of the same ids"),
        "retention": InputSpec(kind="tasks/1", required=False, doc="retention probes (loss only)"),
    },
    outputs=("generations", "checks", "retention", "timings"),
    run=run,
    measurements={"timings": blob_part(timing_ids)},
    bundle=BundleRole(folder="evaluations", arm_input="model", role_input="tasks",
                      plain_role="test"),
    doc="Greedy answers to every task, retained and scored; paired statistics against a baseline.",
)
