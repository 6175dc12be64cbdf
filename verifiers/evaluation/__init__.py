"""Evaluation (docs/experiment.md §4, docs/format.md §7): answers rescored, the ordering rule, the paired statistics, retention probes."""
