"""Rank 0's progress lines: typed events written and read at one place (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nscas.errors import RecipeError
from nscas.recipes.train.events import (
    PROGRESS_PREFIX,
    CheckpointReady,
    StepProgress,
    event_line,
    parse_event_line,
)

STEP = StepProgress(step=3, steps=8, loss=2.5, tokens_per_second=1200.0, eta_seconds=4.0)
READY = CheckpointReady(step=4, hf_dir=Path("/r/step-000004/hf"),
                        state_file=Path("/r/step-000004/state.pt"), resumed=True)


def test_events_round_trip_through_their_lines() -> None:
    for event in (STEP, READY):
        line = event_line(event)
        assert line.startswith(PROGRESS_PREFIX) and "\n" not in line
        assert parse_event_line(line) == event
    assert event_line(READY) == (
        PROGRESS_PREFIX + '{"event":"checkpoint","hf_dir":"/r/step-000004/hf","resumed":true,'
        '"state_file":"/r/step-000004/state.pt","step":4}')


def test_other_output_is_not_an_event() -> None:
    for line in ("", "hello", "nscas-train not json", PROGRESS_PREFIX + "[1, 2]",
                 "WARNING " + event_line(STEP)):
        assert parse_event_line(line) is None


@pytest.mark.parametrize("body, message", [
    ('{"event":"stop"}', "unknown training event"),
    ('{"event":"step","step":1}', "step event with members step"),
    ('{"event":"step","step":"1","steps":2,"loss":1.0,"tokens_per_second":1.0,'
     '"eta_seconds":0.0}', "whose step is '1'"),
    ('{"event":"checkpoint","step":1,"hf_dir":"h","state_file":"s","resumed":1}',
     "whose resumed is 1"),
])
def test_a_prefixed_line_that_is_no_event_is_a_protocol_error(body: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        parse_event_line(PROGRESS_PREFIX + body)
