"""Independent verifiers: a second implementation of SPEC.md.

Nothing here imports the nscas core modules, the recipes or SQLAlchemy.
"""
