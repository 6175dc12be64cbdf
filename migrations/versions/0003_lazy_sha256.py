"""Lazy SHA-256 of tensor objects (docs/format.md §1.2).

``objects.sha256`` may be NULL for a tensor object put without its SHA-256; the value, once a
writer computes it, goes to the new insert-only ``object_sha256`` table (``objects`` stays
insert-only: no row is ever updated). SQLite cannot relax NOT NULL in place, so ``objects`` is
rebuilt (its rows, IDs and ``seq`` values copied as they are), with its indexes and triggers.

Revision ID: 0003_lazy_sha256
Revises: 0002_lineage_indexes
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_lazy_sha256"
down_revision = "0002_lineage_indexes"
branch_labels = None
depends_on = None

_VERBS = ("update", "delete")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _guard(table: str) -> None:
    for verb in _VERBS:
        if _postgresql():  # the trigger function is 0001's
            op.execute(f"CREATE TRIGGER {table}_no_{verb} BEFORE {verb.upper()} ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION nscas_insert_only()")
            continue
        op.execute(
            f"CREATE TRIGGER {table}_no_{verb} BEFORE {verb.upper()} ON {table} "
            f"WHEN NOT EXISTS (SELECT 1 FROM gc_session) "
            f"BEGIN SELECT RAISE(ABORT, '{table} is insert-only'); END"
        )


def _unguard(table: str) -> None:
    for verb in _VERBS:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{verb}" + (f" ON {table}" if _postgresql() else ""))


def _rebuild_objects(*, sha256_nullable: bool) -> None:
    if _postgresql():  # PostgreSQL relaxes NOT NULL in place; rows, indexes and triggers stay
        op.alter_column("objects", "sha256", existing_type=sa.CHAR(64), nullable=sha256_nullable)
        return
    _unguard("objects")
    op.drop_index("ix_objects_record_seq", table_name="objects")
    op.drop_index("ix_objects_records", table_name="objects")
    with op.batch_alter_table("objects", recreate="always") as batch:
        batch.alter_column("sha256", existing_type=sa.CHAR(64), nullable=sha256_nullable)
    op.create_index("ix_objects_records", "objects", ["kind", "seq"],
                    sqlite_where=sa.text("kind IS NOT NULL"))
    op.create_index("ix_objects_record_seq", "objects", ["seq"],
                    sqlite_where=sa.text("kind IS NOT NULL"))
    _guard("objects")


def upgrade() -> None:
    _rebuild_objects(sha256_nullable=True)
    op.create_table(
        "object_sha256",
        sa.Column("id", sa.CHAR(64), sa.ForeignKey("objects.id"), primary_key=True),
        sa.Column("sha256", sa.CHAR(64), nullable=False),
    )
    _guard("object_sha256")


def downgrade() -> None:
    # The old schema needs every SHA-256 in `objects`: fill it from the recorded values, and
    # refuse while any is still unknown (a writer's `fsck --deep` or `Store.sha256` records them).
    conn = op.get_bind()
    _unguard("objects")
    conn.execute(sa.text("UPDATE objects SET sha256 = (SELECT s.sha256 FROM object_sha256 s "
                         "WHERE s.id = objects.id) WHERE sha256 IS NULL"))
    missing = conn.execute(sa.text("SELECT count(*) FROM objects WHERE sha256 IS NULL")).scalar()
    if missing:
        raise RuntimeError(f"{missing} object(s) have no SHA-256 yet; record them before downgrading")
    _guard("objects")
    _unguard("object_sha256")
    op.drop_table("object_sha256")
    _rebuild_objects(sha256_nullable=False)
