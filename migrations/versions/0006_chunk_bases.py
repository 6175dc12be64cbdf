"""The base of a delta-coded leaf (docs/format.md §5.5.1).

A leaf stored in codec ``xorW`` is its base's plain bytes XORed with a residual; ``objects.base``
names that base (its ID; NULL for every other codec), as the chunk file's 32-byte header does.
A nullable column is added in place on both engines: no row changes, the insert-only triggers
stay as they are. An index on it finds the deltas of a base (gc keeps a base while a delta
needs it).

Revision ID: 0006_chunk_bases
Revises: 0005_producer_links
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_chunk_bases"
down_revision = "0005_producer_links"
branch_labels = None
depends_on = None

BASES = "base IS NOT NULL"


def upgrade() -> None:
    op.add_column("objects", sa.Column("base", sa.CHAR(64), nullable=True))
    op.create_index("ix_objects_base", "objects", ["base"],
                    sqlite_where=sa.text(BASES), postgresql_where=sa.text(BASES))


def downgrade() -> None:
    # The old schema cannot read a delta: refuse while any leaf is one.
    deltas = op.get_bind().execute(
        sa.text("SELECT count(*) FROM objects WHERE base IS NOT NULL")).scalar()
    if deltas:
        raise RuntimeError(f"{deltas} leaf object(s) are stored as deltas; this store cannot "
                           "go back to a schema without chunk bases")
    op.drop_index("ix_objects_base", table_name="objects")
    with op.batch_alter_table("objects") as batch:
        batch.drop_column("base")
