"""The verifiers' own exception tree (they must not import ``nscas.errors``).

A finding about the thing being verified is a failed ``Check``, never an exception. These
exceptions are for input the verifiers cannot use at all: a file that is not safetensors, a
log line that is not JSON, an argument of the wrong shape. ``exit_code`` follows docs/format.md §7:
2 for bad input, 3 when something needed to verify is missing.
"""

from __future__ import annotations


class VerifierError(Exception):
    """Root of every error the verifiers raise on purpose."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(VerifierError):
    """A caller handed a verifier function a value it cannot work with (a negative count, ...)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"invalid {name}: {why}")
        self.name = name
        self.why = why


class RecordParseError(VerifierError):
    """Bytes that should hold a record (or another strict JSON value) cannot be parsed."""

    def __init__(self, why: str, *, what: str = "record") -> None:
        super().__init__(f"{what} is not usable JSON: {why}")
        self.why = why
        self.what = what


class SafetensorsError(VerifierError):
    """A file is not a well-formed safetensors file."""

    def __init__(self, source: str, why: str) -> None:
        super().__init__(f"{source}: not a valid safetensors file: {why}")
        self.source = source
        self.why = why


class LogFormatError(VerifierError):
    """A JSONL log (journal, request log) has lines that cannot be read as entries.

    ``problems`` holds every bad line found, as ``(line number, why)``; the message shows the
    first few so one error names them all.
    """

    def __init__(self, what: str, problems: list[tuple[int, str]]) -> None:
        shown = "; ".join(f"line {line}: {why}" for line, why in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{what}: {len(problems)} unusable line(s): {shown}{more}")
        self.what = what
        self.problems = problems


class TaskError(VerifierError):
    """A task case lacks what the target rules of docs/experiment.md §1 need."""

    def __init__(self, why: str) -> None:
        super().__init__(f"unusable task case: {why}")
        self.why = why


class MissingObject(VerifierError):
    """An object needed to verify a target is not available (docs/format.md §7: cannot verify)."""

    exit_code = 3

    def __init__(self, object_id: str) -> None:
        super().__init__(f"cannot verify: object {object_id} is not available")
        self.object_id = object_id


class VerifierCrash(VerifierError):
    """The verifier itself failed (a bug, not a finding): no verdict, so never exit 0 (exit 3,
    "cannot verify"), reported on one line naming the exception and where it arose."""

    exit_code = 3

    def __init__(self, error: BaseException, where: str) -> None:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        super().__init__(f"cannot verify: the verifier failed ({type(error).__name__}"
                         f"{': ' + first if first else ''}, at {where}); this is a bug of the "
                         "verifier, not a verdict on the evidence")
        self.error = error
        self.where = where
