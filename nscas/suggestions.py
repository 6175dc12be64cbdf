"""Typo suggestions for names people type: recipes, refs, pipelines, columns."""

from __future__ import annotations

from collections.abc import Iterable


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``word`` (what a typo likely meant), if one is close.

    For slash-separated names (refs) the last parts must be close as well, so that a shared
    ``experiments/coop/`` alone does not make two names alike."""
    import difflib  # here: only a name that is not found needs it, and read commands start fast

    found = difflib.get_close_matches(word, list(known), n=5, cutoff=0.6)
    tail = word.rpartition("/")[2]
    for name in found:
        other = name.rpartition("/")[2]
        if difflib.SequenceMatcher(None, tail, other).ratio() >= 0.6:
            return name
    return None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'train'?"`` for the closest known name, or ``""`` if none is close."""
    found = closest(word, known)
    return f"; did you mean {found!r}?" if found else ""
