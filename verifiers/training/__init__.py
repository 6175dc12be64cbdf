"""Training (docs/format.md §3.3, §4; docs/experiment.md §3): checkpoints and parameter digests, journals, the document schedule, DiLoCo, GGUF conversions."""
