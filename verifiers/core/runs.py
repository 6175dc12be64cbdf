"""A receipt read together with its action: the unit every per-recipe check works on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One receipt with its action."""

    id: str
    name: str
    """What the run is called in checks: ``<recipe>.<8 hex>``, or the report input name."""
    receipt: Mapping[str, Any]
    action: Mapping[str, Any]
    recipe: str
    """Recipe name from the action's ``name@version``."""

    @property
    def inputs(self) -> Mapping[str, str]:
        inputs: Mapping[str, str] = self.action["inputs"]  # record_of checked the record's schema
        return inputs

    @property
    def outputs(self) -> Mapping[str, str]:
        outputs: Mapping[str, str] = self.receipt["outputs"]  # record_of checked the record's schema
        return outputs

    @property
    def params(self) -> Mapping[str, Any]:
        params: Mapping[str, Any] = self.action["params"]  # record_of checked the record's schema
        return params

    @property
    def claims(self) -> dict[str, Any]:
        """Claimed values by name."""
        return {k: v["value"] for k, v in self.receipt["claims"].items()}
