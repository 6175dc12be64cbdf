"""Checkpoints and their parameter digests (docs/format.md §4, docs/experiment.md §3.9).

- A checkpoint's ``params/1`` is rebuilt from the ``*.safetensors`` files of its ``files``
  tree; its ID is the parameter digest.
- ``sha256_stream`` and the ranks' agreed BLAKE3 digest hash parameters in module
  registration order. Safetensors files store tensors sorted by name, so the order is
  derived from ``config.json`` for the architectures whose order is known (Llama).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import blake3

from ..core.errors import RecordParseError, SafetensorsError
from ..core.results import Check, Needs
from ..records.closure import Objects, Unusable
from ..records.reading import parse_json
from .params import ParamsDigest, params_digest, read_header, sha256_stream


class Weights:
    """A checkpoint's weight files written to temporary files, and its config."""

    def __init__(self, objects: Objects, checkpoint: str) -> None:
        record = objects.record_of(checkpoint, "checkpoint/1")
        entries = objects.record_of(record["files"], "tree/1")["entries"]
        self.record = record
        self.weight_ids = [entries[p]["id"] for p in sorted(entries)
                           if p.endswith(".safetensors")]
        if not self.weight_ids:
            raise Unusable(record["files"], "the checkpoint's files hold no *.safetensors")
        self.config: dict[str, Any] | None = None
        if "config.json" in entries:
            try:
                value = parse_json(objects.bytes(entries["config.json"]["id"]), what="config")
                self.config = value if isinstance(value, dict) else None
            except RecordParseError:
                self.config = None
        self._objects = objects
        self._stack = ExitStack()
        self.paths: list[Any] = []

    def __enter__(self) -> Weights:
        for number, oid in enumerate(self.weight_ids):
            self.paths.append(self._stack.enter_context(
                self._objects.as_file(oid, f"weights-{number}.safetensors")))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def params(self) -> ParamsDigest:
        try:
            return params_digest(self.paths)
        except SafetensorsError as exc:
            raise Unusable(self.weight_ids[0], exc.message) from None

    def order(self) -> list[str] | None:
        """Parameter names in module registration order, when the architecture is known."""
        names = set()
        for path in self.paths:
            names |= set(read_header(path).tensors)
        return registration_order(self.config or {}, names)

    def ordered_blake3(self, order: Sequence[str]) -> str:
        """BLAKE3 hex over the raw bytes of the parameters in ``order`` (the ranks' digest)."""
        hasher = blake3.blake3()
        where = {}
        for path in self.paths:
            for name, spec in read_header(path).tensors.items():
                where[name] = (path, spec)
        for name in order:
            path, spec = where[name]
            with open(path, "rb") as stream:
                stream.seek(spec.begin)
                hasher.update(stream.read(spec.nbytes))
        return hasher.hexdigest()

    def counts(self) -> tuple[int, int, int]:
        """(tensors, scalars, bytes) over the weight files: bytes is Σ numel × element size
        of the stored dtypes."""
        tensors = scalars = size = 0
        for path in self.paths:
            for spec in read_header(path).tensors.values():
                tensors += 1
                scalars += math.prod(spec.shape)
                size += spec.nbytes
        return tensors, scalars, size


def registration_order(config: Mapping[str, Any], names: set[str]) -> list[str] | None:
    """The order ``named_parameters()`` yields for a Hugging Face Llama model, if ``names``
    are exactly its parameters (a tied ``lm_head`` is absent, as it is from the file)."""
    if config.get("model_type") != "llama" or not isinstance(config.get("num_hidden_layers"),
                                                              int):
        return None
    attn_bias, mlp_bias = bool(config.get("attention_bias")), bool(config.get("mlp_bias"))
    order = ["model.embed_tokens.weight"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            order.append(f"{prefix}self_attn.{proj}.weight")
            if attn_bias:
                order.append(f"{prefix}self_attn.{proj}.bias")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            order.append(f"{prefix}mlp.{proj}.weight")
            if mlp_bias:
                order.append(f"{prefix}mlp.{proj}.bias")
        order += [f"{prefix}input_layernorm.weight", f"{prefix}post_attention_layernorm.weight"]
    order.append("model.norm.weight")
    if "lm_head.weight" in names:
        order.append("lm_head.weight")
    return order if set(order) == names else None


def checkpoint_checks(objects: Objects, checkpoint: str) -> list[Check]:
    """A checkpoint's ``params`` is the digest rebuilt from its weight files."""
    name = f"checkpoint.{checkpoint[7:15]}.params"
    values, failed, not_rechecked = parameter_findings(objects, checkpoint)
    if "parameter_digest" not in values:
        if "parameter_digest" in not_rechecked:
            needs, why = not_rechecked["parameter_digest"]
            return [Check.skipped(name, why, needs=needs)]
        return [Check.failed(name, failed.get("parameter_digest", "the digest cannot be "
                                              "rebuilt"))]
    claimed = objects.record_of(checkpoint, "checkpoint/1")["params"]
    rebuilt = values["parameter_digest"]
    return [Check.verdict(name, rebuilt == claimed, claimed=claimed, recomputed=rebuilt,
                          message="the params/1 rebuilt from the weight files differs")]


PARAMETER_CLAIMS = ("parameter_digest", "tensors", "parameters", "parameter_bytes",
                    "sha256_stream", "agreed_parameters")


def parameter_values(objects: Objects, checkpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Recomputed parameter claims of a checkpoint, and why the others are not (every reason,
    whether it fails or needs omitted weights; ``parameter_findings`` tells them apart)."""
    values, failed, not_rechecked = parameter_findings(objects, checkpoint)
    return values, {**failed, **{k: why for k, (_, why) in not_rechecked.items()}}


def parameter_findings(objects: Objects, checkpoint: str) -> tuple[
        dict[str, Any], dict[str, str], dict[str, tuple[Needs, str]]]:
    """Recomputed parameter claims of a checkpoint (memoised); the claims that cannot be
    recomputed, with why (failures); and those that need omitted weights, with
    ``(needs, why)`` (the only ones that may be skipped)."""
    key = ("parameters", checkpoint)
    if key not in objects.memo:
        objects.memo[key] = _parameter_values(objects, checkpoint)
    found: tuple[dict[str, Any], dict[str, str], dict[str, tuple[Needs, str]]]
    found = objects.memo[key]  # the memo holds what _parameter_values returned for this key
    return found


def _parameter_values(objects: Objects, checkpoint: str) -> tuple[
        dict[str, Any], dict[str, str], dict[str, tuple[Needs, str]]]:
    values: dict[str, Any] = {}
    failed: dict[str, str] = {}
    not_rechecked: dict[str, tuple[Needs, str]] = {}
    try:
        with Weights(objects, checkpoint) as weights:
            values["parameter_digest"] = weights.params().id
            values["tensors"], values["parameters"], values["parameter_bytes"] = (
                weights.counts())
            order = weights.order()
            if order is None:
                reason = ("registration order unknown for this architecture, so the ranks' "
                          "digests cannot be rebuilt")
                failed["sha256_stream"] = failed["agreed_parameters"] = reason
            else:
                values["sha256_stream"] = sha256_stream(weights.paths, order)
                values["agreed_parameters"] = weights.ordered_blake3(order)
    except Unusable as exc:
        reason = f"weights unavailable: {exc.why}"
        for claim in PARAMETER_CLAIMS:
            if exc.needs is not None:
                not_rechecked[claim] = (exc.needs, reason)
            else:
                failed[claim] = reason
    return values, failed, not_rechecked
