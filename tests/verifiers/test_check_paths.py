"""Every place the verifiers build a ``Check`` calls a constructor that takes those arguments.

A "not rechecked" path that is rarely taken (a replay past its time bound, a CUDA run replayed
on the CPU) must not be where a wrong signature is first found: each ``Check.<constructor>(...)``
call in ``verifiers/`` is bound here, statically, against the constructor it names. And a
verifier that crashes anyway gives no verdict: exit 3 and one line, never 0.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from nscas.verifiers import verify as verify_module
from nscas.verifiers.core.errors import VerifierCrash
from nscas.verifiers.core.results import Check

VERIFIERS = Path(__file__).resolve().parents[2] / "verifiers"
CONSTRUCTORS = ("passed", "failed", "skipped", "verdict")


def _calls() -> list[tuple[str, int, str, ast.Call]]:
    found = []
    for path in sorted(VERIFIERS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "Check"
                    and node.func.attr in CONSTRUCTORS):
                found.append((path.relative_to(VERIFIERS).as_posix(), node.lineno, node.func.attr,
                              node))
    return found


CALLS = _calls()


def test_every_constructor_is_called_somewhere() -> None:
    assert {attr for _, _, attr, _ in CALLS} == set(CONSTRUCTORS)
    assert len(CALLS) > 100  # the scan sees the verifiers, not an empty folder


@pytest.mark.parametrize("where", [f"{f}:{n}" for f, n, _, _ in CALLS])
def test_check_call_binds_to_its_constructor(where: str) -> None:
    (call,) = [c for f, n, _, c in CALLS if f"{f}:{n}" == where]
    assert isinstance(call.func, ast.Attribute)
    signature = inspect.signature(getattr(Check, call.func.attr))
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords):
        pytest.skip("*args or **kwargs: bound at run time only")
    args = [object()] * len(call.args)
    kwargs = {k.arg: object() for k in call.keywords if k.arg is not None}
    signature.bind(*args, **kwargs)  # TypeError: the call would crash when it is reached


@pytest.mark.parametrize("needs", ["weights", "model"])
def test_every_constructor_builds(needs: str) -> None:
    """Each constructor with every argument it takes: what the scan binds really runs."""
    checks = [
        Check.passed("a", claimed=1, recomputed=1, message="m"),
        Check.failed("b", "why", claimed=1, recomputed=2),
        Check.skipped("c", "why", needs=needs, claimed=1, recomputed={"replayed": [1]}),  # type: ignore[arg-type]
        Check.verdict("d", False, claimed=1, recomputed=2, message="why"),
    ]
    assert [c.status for c in checks] == ["passed", "failed", "skipped", "failed"]
    assert checks[2].recomputed == {"replayed": [1]} and checks[2].to_dict()["needs"] == needs


def test_a_crashing_checker_is_exit_3_on_one_line(demo, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    def broken(objects: object, oid: str) -> list[Check]:
        return [Check.skipped("x", "y", needs="model", bogus=1)]  # type: ignore[call-arg]

    monkeypatch.setattr(verify_module, "check_receipt", broken)
    with pytest.raises(VerifierCrash) as caught:
        verify_module.verify(str(demo.parts["serve"]))
    error = caught.value
    assert verify_module.error_exit_code(error) == 3
    assert "\n" not in error.message and "TypeError" in error.message
    assert "test_check_paths.py" in error.message
