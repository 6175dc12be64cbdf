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
