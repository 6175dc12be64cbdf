"""Alembic migrations of the nscas store schema."""
