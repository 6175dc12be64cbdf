"""Indexes for lineage and log on large stores.

``links_to`` orders by (parent, path) within one child: a covering (child, parent, path) index
turns a sort of every link to a shared node into an index walk. ``log`` without a kind walks
records newest first: a partial index on ``seq`` over records only skips the blobs.

Revision ID: 0002_lineage_indexes
Revises: 0001_initial
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_lineage_indexes"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_links_child", table_name="links")
    op.create_index("ix_links_child", "links", ["child", "parent", "path"])
    op.create_index("ix_objects_record_seq", "objects", ["seq"],
                    sqlite_where=sa.text("kind IS NOT NULL"),
                    postgresql_where=sa.text("kind IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_objects_record_seq", table_name="objects")
    op.drop_index("ix_links_child", table_name="links")
    op.create_index("ix_links_child", "links", ["child"])
