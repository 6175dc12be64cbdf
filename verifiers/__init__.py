"""Independent verifiers: a second implementation of docs/format.md.

Nothing here imports the nscas core modules, the recipes or SQLAlchemy.
"""
