"""Signed evidence: signature/1 records, DSSE and in-toto (docs/format.md §3.11)."""
