"""The report (docs/experiment.md §6): report.json, its figures, generations.html and index.html recomputed and compared."""
