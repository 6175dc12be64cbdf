"""Journal step order: numeric, resume-aware (a run of more than nine steps)."""

from nscas.verifiers.training.entries import effective_steps


def test_steps_come_back_in_numeric_order() -> None:
    entries = [{"step": s, "loss": 1.0} for s in range(1, 13)]
    assert [e["step"] for e in effective_steps(entries)] == list(range(1, 13))


def test_a_resume_drops_the_steps_after_its_checkpoint() -> None:
    entries = [{"step": s} for s in range(1, 12)]
    entries.append({"event": "resume", "from_step": 10})
    entries += [{"step": s, "again": True} for s in (11, 12)]
    steps = effective_steps(entries)
    assert [e["step"] for e in steps] == list(range(1, 13))
    assert steps[10].get("again") and steps[11].get("again") and not steps[9].get("again")


def test_a_resume_without_an_integer_step_keeps_nothing_and_does_not_crash() -> None:
    # A forged journal's resume event with a missing or non-integer from_step once raised
    # TypeError (int <= None); it keeps no earlier step, as the DiLoCo outer events do.
    for start in (None, "10", 10.0, True):
        entries: list[dict[str, object]] = [{"step": s} for s in range(1, 4)]
        resume: dict[str, object] = {"event": "resume"}
        if start is not None:
            resume["from_step"] = start
        entries += [resume, {"step": 4}]
        assert [e["step"] for e in effective_steps(entries)] == [4]
