"""TRUNCATE cannot bypass insert-only on PostgreSQL (docs/format.md §5).

Row-level triggers do not fire on TRUNCATE: a statement-level trigger on each insert-only table
refuses it, always (gc deletes rows, it never truncates). SQLite has no TRUNCATE (its
``DELETE FROM t`` runs the row triggers of 0001): nothing changes there.

Revision ID: 0004_no_truncate
Revises: 0003_lazy_sha256
"""

from alembic import op

revision = "0004_no_truncate"
down_revision = "0003_lazy_sha256"
branch_labels = None
depends_on = None

INSERT_ONLY = ("objects", "parts", "links", "ref_log", "object_sha256")
FUNCTION = (
    "CREATE FUNCTION nscas_no_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME || ' is insert-only'; END $$"
)


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if not _postgresql():
        return
    op.execute(FUNCTION)
    for table in INSERT_ONLY:
        op.execute(f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION nscas_no_truncate()")


def downgrade() -> None:
    if not _postgresql():
        return
    for table in INSERT_ONLY:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
    op.execute("DROP FUNCTION IF EXISTS nscas_no_truncate()")
