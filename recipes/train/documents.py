"""Tokenised training documents as the workers read them: one JSON object per line with
``id``, ``input_ids``, ``labels`` (-100 where no loss is taken) and ``weight``.

Tokenisation happens once, in the recipe wrapper; workers only check and read. Labels sit at
the positions of the tokens they name (the Hugging Face convention): position i is predicted
from positions < i, so the first position can never carry a label.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nscas.errors import InvalidInput
from nscas.recipes.common.tokenise import IGNORE_INDEX as IGNORE
from nscas.recipes.common.tokenise import DocumentTooLong, Encoded
from nscas.recipes.train.config import MAX_WEIGHT, MIN_WEIGHT


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainDocument:
    """One tokenised document and its loss weight."""

    id: str
    """The document's identity (a task ID or a replay conversation ID)."""
    input_ids: tuple[int, ...]
    """Token IDs of the whole rendered conversation."""
    labels: tuple[int, ...]
    """Per position, the token to predict there, or -100."""
    weight: int
    """Loss weight (grounded 8, replay 1 in the published run)."""

    @classmethod
    def from_encoded(cls, doc_id: str, encoded: Encoded, *, weight: int) -> TrainDocument:
        return cls(id=doc_id, input_ids=encoded.input_ids, labels=encoded.labels, weight=weight)

    @property
    def targets(self) -> int:
        """Labelled tokens: what the loss sums over."""
        return sum(1 for t in self.labels if t != IGNORE)

    def to_json(self) -> str:
        body = {
            "id": self.id,
            "input_ids": list(self.input_ids),
            "labels": list(self.labels),
            "weight": self.weight,
            "targets": self.targets,
        }
        return json.dumps(body, separators=(",", ":"))


def check_document(doc: TrainDocument, *, max_length: int, where: str = "") -> None:
    """Refuse a document the loop cannot train on faithfully, naming it."""
    name = f"document {doc.id!r}{where}"
    if not isinstance(doc.weight, int) or isinstance(doc.weight, bool) or not (
        MIN_WEIGHT <= doc.weight <= MAX_WEIGHT
    ):
        raise InvalidInput(
            f"{name} has weight {doc.weight!r}; weights must be integers {MIN_WEIGHT}..{MAX_WEIGHT}"
        )
    if len(doc.input_ids) != len(doc.labels):
        raise InvalidInput(
            f"{name} has {len(doc.input_ids)} input ids but {len(doc.labels)} labels"
        )
    if len(doc.input_ids) > max_length:
        raise DocumentTooLong(f"{doc.id}{where}", len(doc.input_ids), max_length)
    if not doc.input_ids or doc.labels[0] != IGNORE:
        raise InvalidInput(f"{name} labels its first position, which nothing can predict")
    if doc.targets == 0:
        raise InvalidInput(f"{name} has no labelled tokens")
    if any(t < 0 for t in doc.input_ids) or any(t < 0 and t != IGNORE for t in doc.labels):
        raise InvalidInput(f"{name} holds a negative token id")


def write_documents(path: Path, docs: Iterable[TrainDocument]) -> None:
    """Write documents as JSONL, one per line."""
    with path.open("w", encoding="utf-8") as f:
        for doc in docs:
            f.write(doc.to_json() + "\n")


def read_documents(paths: Iterable[Path], *, max_length: int) -> list[TrainDocument]:
    """Read JSONL document files in order and check every document."""
    docs: list[TrainDocument] = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InvalidInput(f"cannot read documents {path}: {exc}") from exc
        for number, line in enumerate(lines, start=1):
            where = f" ({path} line {number})"
            try:
                body = json.loads(line)
                doc = TrainDocument(
                    id=str(body["id"]),
                    input_ids=tuple(int(t) for t in body["input_ids"]),
                    labels=tuple(int(t) for t in body["labels"]),
                    weight=body["weight"],
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidInput(f"malformed document{where}: {exc}") from exc
            check_document(doc, max_length=max_length, where=where)
            if "targets" in body and body["targets"] != doc.targets:
                raise InvalidInput(
                    f"document {doc.id!r}{where} claims {body['targets']} targets "
                    f"but labels {doc.targets} tokens"
                )
            docs.append(doc)
    if not docs:
        raise InvalidInput("the document files hold no documents")
    return docs
