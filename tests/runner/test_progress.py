"""The two progress displays: plain periodic lines off a terminal, a rich bar on one."""

from __future__ import annotations

import io

from nscas.cli.progress import (
    PlainProgress,
    RichProgress,
    format_duration,
    format_fields,
    progress_for,
)
from nscas.runs.recipe import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain(interval: float = 10.0) -> tuple[PlainProgress, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    return PlainProgress("train", stream=out, interval=interval, clock=clock), out, clock


def test_plain_lines_come_at_start_every_interval_and_at_the_end() -> None:
    p, out, clock = plain()
    p.start(100, "training")
    for _ in range(4):  # 4 steps in 8 s: below the interval, no line
        clock.now += 2
        p.advance(1, loss=2.3456789, tokens_per_s=12345.6)
    assert out.getvalue() == "[train] training (0/100)\n"
    clock.now += 2
    p.advance(1, loss=2.25)  # 5 of 100 after 10 s: 190 s to go
    p.advance(2)  # no new line within the interval
    clock.now += 10
    p.advance(3, loss=2.0)  # 10 of 100 after 20 s
    p.note("checkpoint at step 10")
    clock.now += 5
    p.finish()
    p.finish()  # idempotent: the runner finishes after the recipe did
    assert out.getvalue().splitlines() == [
        "[train] training (0/100)",
        "[train] training: 5/100 5% loss=2.25 tokens/s=12,346 eta 3m10s",
        "[train] training: 10/100 10% loss=2 tokens/s=12,346 eta 3m00s",
        "[train] checkpoint at step 10",
        "[train] training: done 10/100 in 25s loss=2 tokens/s=12,346",
    ]


def test_plain_without_total_and_phases() -> None:
    p, out, clock = plain(interval=0)
    p.start(None, "generating tasks")
    clock.now += 1
    p.advance(7)
    p.start(3, "writing")  # a second phase finishes the first
    clock.now += 3661
    p.advance(3)
    p.finish()
    assert out.getvalue().splitlines() == [
        "[train] generating tasks",
        "[train] generating tasks: 7",
        "[train] generating tasks: done 7 in 1s",
        "[train] writing (0/3)",
        "[train] writing: 3/3 100%",
        "[train] writing: done 3/3 in 1h01m",
    ]


def test_finish_without_start_prints_nothing() -> None:
    p, out, _ = plain()
    p.finish()
    assert out.getvalue() == ""


def test_rich_bar_shows_description_count_and_fields() -> None:
    out = io.StringIO()
    p = RichProgress("train", stream=out)
    p.start(10, "training")
    for i in range(10):
        p.advance(1, loss=2.5 - i / 10, tokens_per_s=1500.0)
    p.note("saved a checkpoint")
    p.finish()
    p.finish()
    text = out.getvalue()
    assert "[train] saved a checkpoint" in text
    assert "train: training" in text and "10/10" in text
    assert "loss=1.6 tokens/s=1500" in text


def test_progress_for_picks_by_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(progress_for("s", stream=io.StringIO()), PlainProgress)
    assert isinstance(progress_for("s", stream=Tty()), RichProgress)
    shown: Progress = progress_for("s", stream=io.StringIO())  # satisfies the protocol
    shown.finish()


def test_formats() -> None:
    assert format_fields({"loss": 0.000123456, "step": 1234567, "lr": 3e-5, "ok": True,
                          "tokens_per_s": 98765.4}) == (
        "loss=0.0001235 step=1,234,567 lr=3e-05 ok=True tokens/s=98,765")
    assert format_fields({"x": float("nan")}) == "x=nan"
    assert [format_duration(s) for s in (0, 59.4, 61, 3599, 3600, 7322)] == [
        "0s", "59s", "1m01s", "59m59s", "1h00m", "2h02m"]
