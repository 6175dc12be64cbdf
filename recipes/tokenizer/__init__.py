"""A local byte-level BPE tokenizer with a ChatML chat template, trained deterministically."""
