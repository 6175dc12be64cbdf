"""A step's previous run: the succeeded receipt that records its pipeline, step and variant
names (docs/format.md §3.9, §6.10), what a partial run reads and a rerun is compared with."""

from __future__ import annotations

from nscas.objects.digests import Digest
from nscas.runs.config import RunFile
from nscas.runs.variants import Variant, variant_prefix
from nscas.store.writer import Store


class PreviousRuns:
    """The succeeded receipts that record a pipeline and step name (docs/format.md §3.9),
    read once, on first use. A step's previous run is the receipt its
    ``<refs>[/variants/<variant>]/<step>/receipt`` ref names, where the pipeline declares refs
    and that receipt records this pipeline and step, else the newest (by ``finished``, then ID)
    that records them and the run's variant (none, for the run without one). A step that the
    variant does not change falls back to the previous run without the variant (the same
    action, unless the code changed since)."""

    def __init__(self, store: Store, spec: RunFile, variant: Variant | None = None) -> None:
        self._store = store
        self._spec = spec
        self._variant = variant
        self._latest: dict[tuple[str | None, str, str | None], tuple[str, Digest]] | None = None

    @property
    def variant(self) -> str | None:
        """The name of the run's variant; None for the run without one."""
        return self._variant.name if self._variant is not None else None

    def latest(self, step: str, *, original: bool = False) -> Digest | None:
        """The step's previous run in this run's variant; ``original``: or, where it has none
        there, the previous run without the variant (what a first run of a variant is shown
        against)."""
        variant = self._variant
        found = self._latest_in(step, self.variant)
        if found is None and variant is not None and (original or step not in variant.changed):
            found = self._latest_in(step, None)
        return found

    def _latest_in(self, step: str, variant: str | None) -> Digest | None:
        pipeline, record_step = self._spec.receipt_names()
        if not record_step:
            return None
        if self._spec.refs is not None:
            held = self._store.ref_get(f"{variant_prefix(self._spec.refs, variant)}/{step}/receipt")
            if held is not None and self._store.info(held).kind == "receipt/1":
                rec = self._store.get_record(held)
                if (rec.get("status") == "succeeded" and rec.get("pipeline") == pipeline
                        and rec.get("step") == step):
                    return held
        if self._latest is None:
            self._latest = {}
            for info in self._store.log(kind="receipt/1", limit=1 << 62):
                rec = self._store.get_record(info.id)
                if rec.get("status") != "succeeded" or not isinstance(rec.get("step"), str):
                    continue
                key = (rec.get("pipeline"), rec["step"], rec.get("variant"))
                mark = (rec["finished"], info.id)
                if key not in self._latest or mark > self._latest[key]:
                    self._latest[key] = mark
        found = self._latest.get((pipeline, step, variant))
        return found[1] if found else None
