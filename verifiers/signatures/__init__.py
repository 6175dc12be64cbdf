"""Receipt signatures (docs/format.md §3.11): DSSE envelopes over in-toto Statements, checked against trusted keys."""
