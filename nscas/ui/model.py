"""A checkpoint's summary for its page: architecture, parameter count, dtypes, size, lineage.

Everything is read from what the checkpoint links: the architecture from its ``config.json``
(the Hugging Face config), the parameters from its ``params/1`` (tied weights once, as the
file stores them), the sizes from its ``files`` tree, and the lineage from its ``parent``
chain and the runs that produced each checkpoint of it (``nscas.store.provenance``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nscas.objects.digests import Digest
from nscas.objects.dtypes import DTYPES

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

CONFIG = "config.json"
CONFIG_BYTES = 1 << 20
"""A config.json larger than this is not read (a model's config is a few KiB)."""
CHAIN_SHOWN = 32
"""Parent checkpoints listed at most; a longer chain says how many more."""
SHAPE_KEYS = (("hidden_size", "hidden size"), ("num_hidden_layers", "layers"),
              ("num_attention_heads", "attention heads"), ("num_key_value_heads", "key/value heads"),
              ("intermediate_size", "intermediate size"), ("vocab_size", "vocabulary"),
              ("max_position_embeddings", "context"))
"""The config members shown, as Hugging Face names them, with their labels."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ancestor:
    id: Digest
    step: Any
    producer: Digest | None
    """The receipt that produced this checkpoint, if a run did."""
    recipe: str | None
    """That run's recipe (``train@1``), or the checkpoint's ``source`` (``import-hf``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSummary:
    architecture: str | None
    """``architectures[0]`` of config.json (``LlamaForCausalLM``), else its ``model_type``."""
    shape: tuple[tuple[str, Any], ...]
    """(label, value) of the config's size members that it has."""
    parameters: int | None
    """Σ numel over the tensors of its params/1 (None when the store lacks the record)."""
    tensors: int | None
    dtypes: tuple[tuple[str, int], ...]
    """(dtype, parameters of that dtype), most first."""
    parameter_bytes: int | None
    """Σ numel × element size of the stored dtypes."""
    files: int
    files_bytes: int
    lineage: tuple[Ancestor, ...]
    """This checkpoint, then its parent, and so on."""
    lineage_more: int


def summary(store: StoreReader, oid: Digest, record: dict[str, Any]) -> ModelSummary:
    from nscas.store.provenance import producers

    entries = _record(store, record.get("files"), "tree/1").get("entries", {})
    config = _config(store, entries.get(CONFIG))
    params = _record(store, record.get("params"), "params/1").get("tensors")
    parameters = tensors = size = None
    by_dtype: Counter[str] = Counter()
    if isinstance(params, dict):
        parameters, tensors, size = 0, len(params), 0
        for t in params.values():
            numel = math.prod(t["shape"])
            parameters += numel
            by_dtype[t["dtype"]] += numel
            size += -(-numel * DTYPES[t["dtype"]].bits // 8) if t["dtype"] in DTYPES else 0
    chain: list[Ancestor] = []
    here: Digest | None = oid
    rec: dict[str, Any] = record
    while here is not None and len(chain) < CHAIN_SHOWN:
        made = producers(store, here).first
        recipe = _recipe(store, made) if made is not None else _str(rec.get("source"))
        chain.append(Ancestor(id=here, step=rec.get("step"), producer=made, recipe=recipe))
        here = _parent(store, rec)
        rec = store.get_record(here) if here is not None else {}
    more = 0
    while here is not None and more < 10_000:  # only counted: a cycle cannot be stored
        more += 1
        here = _parent(store, store.get_record(here))
    architectures = config.get("architectures")
    architecture = (architectures[0] if isinstance(architectures, list) and architectures
                    and isinstance(architectures[0], str) else _str(config.get("model_type")))
    return ModelSummary(
        architecture=architecture,
        shape=tuple((label, config[key]) for key, label in SHAPE_KEYS
                    if isinstance(config.get(key), int) and not isinstance(config[key], bool)),
        parameters=parameters, tensors=tensors,
        dtypes=tuple(by_dtype.most_common()), parameter_bytes=size,
        files=len(entries),
        files_bytes=sum(e["size"] for e in entries.values() if isinstance(e.get("size"), int)),
        lineage=tuple(chain), lineage_more=more)


def _record(store: StoreReader, text: Any, kind: str) -> dict[str, Any]:
    """The record ``text`` names when the store holds it as ``kind``, else ``{}``."""
    if not isinstance(text, str):
        return {}
    oid = Digest.parse(text)
    if not store.has(oid) or store.info(oid).kind != kind:
        return {}
    return store.get_record(oid)


def _config(store: StoreReader, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        return {}
    oid = Digest.parse(entry["id"])
    if not store.has(oid) or store.info(oid).size > CONFIG_BYTES:
        return {}
    try:
        value = json.loads(store.get_bytes(oid))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return {}
    return value if isinstance(value, dict) else {}


def _parent(store: StoreReader, record: dict[str, Any]) -> Digest | None:
    parent = record.get("parent")
    if not isinstance(parent, str):
        return None
    oid = Digest.parse(parent)
    return oid if store.has(oid) and store.info(oid).kind == "checkpoint/1" else None


def _recipe(store: StoreReader, receipt: Digest) -> str | None:
    action = store.get_record(receipt).get("action")
    if not isinstance(action, str) or not store.has(Digest.parse(action)):
        return None
    return _str(store.get_record(Digest.parse(action)).get("recipe"))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
